"""A small real training loop: an MLP on synthetic data, a DataLoader with workers, Adam,
and ``torch.profiler.record_function`` ranges naming its phases.

Runs in seconds on a CPU.  Profile it without changing a line:

    export PROFILING_MODE=true
    export PROFILING_OPTIONS='{"output":"./prof","training_trace":"on","dp":"on","msproftx":"on"}'
    python examples/train_mlp.py
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    """Deterministic regression data: y = sin(x @ w)."""

    def __init__(self, n: int, features: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        self.y = torch.sin(self.x @ torch.randn(features, 1, generator=g))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timings", help="write per-step wall times (s) as JSON to this file")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = Synthetic(args.steps * args.batch, args.features)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()

    times = []
    last = time.perf_counter()
    record = torch.profiler.record_function  # named phases: msproftx shows them, no code change
    for step, (x, y) in enumerate(loader, 1):
        optimizer.zero_grad()
        with record("forward"):
            loss = loss_fn(model(x), y)
        with record("backward"):
            loss.backward()
        with record("optimizer"):
            optimizer.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
        if step % 20 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    if args.timings:
        with open(args.timings, "w") as handle:
            json.dump(times, handle)


if __name__ == "__main__":
    main()
