"""The fusion_op benchmark's job: a torch.compile'd 2-layer transformer LM (bench/_optier_job.py's
``LM``), AdamW, fixed shapes (no recompile), per-step wall times to ``--timings`` as JSON.

    python bench/_compiled_job.py --steps 60 --timings t.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _optier_job import LM  # the operator-tier benchmark's model, not a copy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--timings", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LM()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, model.vocab, (8, 64), generator=g) for _ in range(2))
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        out = compiled(x)
        loss = loss_fn(out, y.reshape(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    Path(args.timings).write_text(json.dumps(times))
    print(f"final loss {loss.item():.10g}")


if __name__ == "__main__":
    main()
