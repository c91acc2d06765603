"""The operator-tier benchmark's training job: examples/train_mlp.py's model and loop, with
0 DataLoader workers, optionally wrapped in ``torch.profiler`` at jobprof's task_trace detail.

    python bench/_optier_job.py --steps 150 --timings t.json [--torch-profiler DIR] [--tiny]

* The model, data, optimizer and ``record_function`` phases are the example's (its
  ``Synthetic`` dataset is imported from it).  The data set holds a fixed number of batches
  (``--batches``) and the loop runs as many epochs as the steps need, so the process's memory
  does not grow with ``--steps`` (the memory benchmark compares 200 and 2000 steps).
* ``--torch-profiler DIR``: the loop runs inside ``torch.profiler.profile`` with every step
  recorded (``schedule(wait=0, warmup=0, active=1)``), input shapes, and a Chrome trace per
  step written to DIR by ``on_trace_ready``; ``prof.step()`` ends each step and is part of
  its time (that is where torch.profiler cuts and exports).  ``--with-flops`` adds its FLOP
  estimates (the counterpart of a jobprof metric group).
* Per-step wall times go to ``--timings`` as JSON; the training phase's peak RSS (KiB, from
  ``getrusage``) is printed as ``OPTIER_RSS_KB <n> blocks <b> gc_objects <o>`` when the loop
  ends (with Python's allocated blocks and the objects the GC tracks).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import resource
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_mlp import Synthetic  # the example's data, not a copy


def _profiler(trace_dir: Path, flops: bool) -> torch.profiler.profile:
    trace_dir.mkdir(parents=True, exist_ok=True)
    counter = itertools.count()

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(trace_dir / f"trace_{next(counter):06d}.json"))

    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_flops=flops,
        schedule=torch.profiler.schedule(wait=0, warmup=0, active=1), on_trace_ready=ready)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batches", type=int, default=50, help="batches in the data set (cycled)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: fast steps (memory run)")
    parser.add_argument("--timings", help="write per-step wall times (s) as JSON here")
    parser.add_argument("--torch-profiler", metavar="DIR", help="profile with torch.profiler into DIR")
    parser.add_argument("--with-flops", action="store_true", help="torch.profiler's FLOP estimates too")
    args = parser.parse_args()
    batch, features, hidden = (8, 16, 32) if args.tiny else (64, 128, 512)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Synthetic(args.batches * batch, features), batch_size=batch, shuffle=True,
                        num_workers=0)
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.MSELoss()
    record = torch.profiler.record_function

    prof = _profiler(Path(args.torch_profiler), args.with_flops) if args.torch_profiler else None
    times: list[float] = []
    with prof if prof is not None else contextlib.nullcontext():
        last = time.perf_counter()
        while len(times) < args.steps:
            for x, y in loader:
                optimizer.zero_grad()
                with record("forward"):
                    loss = loss_fn(model(x), y)
                with record("backward"):
                    loss.backward()
                with record("optimizer"):
                    optimizer.step()
                if prof is not None:
                    prof.step()
                now = time.perf_counter()
                times.append(now - last)
                last = now
                if len(times) == args.steps:
                    break
    # live Python memory blocks next to the peak RSS: tells growth of live objects from
    # native memory or fragmentation
    print(f"OPTIER_RSS_KB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} "
          f"blocks {sys.getallocatedblocks()} gc_objects {len(gc.get_objects())}", flush=True)
    if args.timings:
        Path(args.timings).write_text(json.dumps(times))


if __name__ == "__main__":
    main()
