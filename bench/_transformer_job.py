"""The step-tier benchmark's transformer job (issue 48's held-out shape): a plain PyTorch loop a
user would write, with no DataLoader, no ``record_function`` and nothing of jobprof.

    python bench/_transformer_job.py --steps 120 --timings t.json [--gc-stats]

A 2-layer ``nn.TransformerEncoder`` language model (d_model 128, 4 heads, dropout at torch's
default 0.1), batches of 8 x 64 tokens from a vocabulary of 1,000 drawn on the fly, AdamW, one
intra-op thread.  Per-step wall times (s) go to ``--timings`` as JSON.  ``--gc-stats`` adds
``gc`` to that file: the collections each generation ran during the timed steps and the time
they took (``gc.callbacks``), so a profiler that makes Python collect more shows it.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch
from torch import nn

VOCAB, D_MODEL, HEADS, LAYERS, BATCH, SEQ = 1000, 128, 4, 2, 8, 64


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x), mask=self.mask, is_causal=True))


class GcTimer:
    """Collections per generation and their time, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._start = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            generation = info["generation"]
            self.count[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--timings", help="write per-step wall times (s) as JSON here")
    parser.add_argument("--gc-stats", action="store_true", help="time Python's collections too")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    timer = GcTimer() if args.gc_stats else None
    times: list[float] = []
    last = time.perf_counter()
    for _ in range(args.steps):
        x = torch.randint(0, VOCAB, (BATCH, SEQ))
        y = torch.randint(0, VOCAB, (BATCH * SEQ,))
        optimizer.zero_grad()
        loss = loss_fn(model(x).reshape(-1, VOCAB), y)
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    print(f"loss {loss.item():.6f}", flush=True)
    if args.timings:
        out: dict = {"step_s": times}
        if timer is not None:
            out["gc"] = {"count": timer.count, "seconds": timer.seconds}
        Path(args.timings).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
