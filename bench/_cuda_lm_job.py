"""The GPU side-by-side's job (bench/gpu_side_by_side.py): a transformer LM training loop, one
arm per process, per-step wall times to ``--timings`` as JSON.

    python bench/_cuda_lm_job.py --device cuda --steps 60 --timings t.json [--torch-profiler DIR]

* The model is bench/_optier_job.py's ``LM`` at the size of the recorded CUDA fixture
  (../shared/fixtures/cuda-h200-torch2.11): 4 layers, d=512, 8 heads, FF 2048, vocabulary 8192,
  batch 16 x 256 tokens, AdamW, fp32, causal attention through SDPA (flash on a GPU).  About
  15 ms a step unprofiled on an H200.  ``--quick``: a tiny one (d=64, 2 layers), for CPU dry runs.
* Batches come from a DataLoader over host tensors (pinned on CUDA) and are copied in each step,
  so the step tier's dp has batches to record; forward / backward / optimizer are
  ``record_function`` ranges, as in the CPU benchmarks (msproftx records them).
* Every step ends with ``torch.cuda.synchronize()`` before its time is taken, in every arm: a
  step's time is then its GPU work, not only its launches.
* ``--torch-profiler DIR``: the loop runs inside ``torch.profiler.profile`` (CPU + CUDA
  activities, input shapes), ``schedule(wait=0, warmup=0, active=1)``: every step recorded and
  a Chrome trace per step written to DIR by ``on_trace_ready``; ``prof.step()`` is inside the
  timed step (that is where torch.profiler stops, collects and exports).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _optier_job import LM  # the operator-tier benchmark's model, not a copy

#: (vocabulary, width, layers, heads, tokens, batch)
FULL = (8192, 512, 4, 8, 256, 16)
QUICK = (512, 64, 2, 4, 32, 4)


def _profiler(trace_dir: Path, cuda: bool) -> torch.profiler.profile:
    trace_dir.mkdir(parents=True, exist_ok=True)
    counter = itertools.count()

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(trace_dir / f"trace_{next(counter):06d}.json"))

    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=True,
                                  schedule=torch.profiler.schedule(wait=0, warmup=0, active=1),
                                  on_trace_ready=ready)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="a tiny model (CPU dry runs)")
    parser.add_argument("--timings", required=True, help="write per-step wall times (s) as JSON here")
    parser.add_argument("--torch-profiler", metavar="DIR", help="profile with torch.profiler into DIR")
    args = parser.parse_args()

    vocab, d, layers, heads, seq, batch = QUICK if args.quick else FULL
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LM(vocab=vocab, d=d, layers=layers, heads=heads, seq=seq).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, vocab, (8 * batch, seq), generator=g),
                         torch.randint(0, vocab, (8 * batch, seq), generator=g))
    loader = DataLoader(data, batch_size=batch, shuffle=True, num_workers=0, pin_memory=cuda)
    record = torch.profiler.record_function
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    prof = _profiler(Path(args.torch_profiler), cuda) if args.torch_profiler else None
    times: list[float] = []
    with prof if prof is not None else contextlib.nullcontext():
        sync()
        last = time.perf_counter()
        while len(times) < args.steps:
            for x, y in loader:  # a new epoch every 8 steps, as a real loader cycles
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True).reshape(-1)
                optimizer.zero_grad()
                with record("forward"):
                    loss = loss_fn(model(x), y)
                with record("backward"):
                    loss.backward()
                with record("optimizer"):
                    optimizer.step()
                if prof is not None:
                    prof.step()
                sync()
                now = time.perf_counter()
                times.append(now - last)
                last = now
                if len(times) == args.steps:
                    break
    print(f"LM_JOB device={dev} params={sum(p.numel() for p in model.parameters())} "
          f"last_loss={loss.item()!r}", flush=True)
    Path(args.timings).write_text(json.dumps(times))


if __name__ == "__main__":
    main()
