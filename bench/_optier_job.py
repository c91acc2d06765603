"""The operator-tier benchmark's training job: examples/train_mlp.py's model and loop, with
0 DataLoader workers, optionally wrapped in ``torch.profiler`` at jobprof's task_trace detail.

    python bench/_optier_job.py --steps 150 --timings t.json [--torch-profiler DIR] [--tiny]
                                [--model mlp|lm|conv]

* The model, data, optimizer and ``record_function`` phases are the example's (its
  ``Synthetic`` dataset is imported from it).  The data set holds a fixed number of batches
  (``--batches``) and the loop runs as many epochs as the steps need, so the process's memory
  does not grow with ``--steps`` (the memory benchmark compares 200 and 2000 steps).
* ``--torch-profiler DIR``: the loop runs inside ``torch.profiler.profile`` with every step
  recorded (``schedule(wait=0, warmup=0, active=1)``), input shapes, and a Chrome trace per
  step written to DIR by ``on_trace_ready``; ``prof.step()`` ends each step and is part of
  its time (that is where torch.profiler cuts and exports).  ``--with-flops`` adds its FLOP
  estimates (the counterpart of a jobprof metric group), ``--profile-memory`` its allocator
  events (the counterpart of task_memory).
* ``--model``: ``mlp`` (the example's), ``lm`` (a 2-layer transformer language model, d=128,
  AdamW: ~570 top-level operators per step, many small views) or ``conv`` (a small conv net on
  32x32 images, SGD with momentum).  Under torchrun (``WORLD_SIZE`` > 1) the model is wrapped in
  DistributedDataParallel over gloo, each rank writes ``--timings`` with ``.rank<r>`` appended
  and ``--torch-profiler`` traces under ``DIR/rank<r>``.
* Per-step wall times go to ``--timings`` as JSON; the training phase's peak RSS (KiB, from
  ``/proc/self/status``' VmHWM: this process's own, where getrusage's ru_maxrss is floored at
  the size of the process that started it) is printed as
  ``OPTIER_RSS_KB <n> blocks <b> gc_objects <o>`` when the loop ends (with Python's allocated
  blocks and the objects the GC tracks).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_mlp import Synthetic  # the example's data, not a copy


def _profiler(trace_dir: Path, flops: bool, whole_after: int | None = None,
              steps: int = 0, memory: bool = False) -> torch.profiler.profile:
    """torch.profiler writing a Chrome trace per step, or (``whole_after`` W) one trace of every
    step after the first W, which it spends warming up: one session, no restart per step."""
    trace_dir.mkdir(parents=True, exist_ok=True)
    counter = itertools.count()

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(trace_dir / f"trace_{next(counter):06d}.json"))

    schedule = torch.profiler.schedule(wait=0, warmup=0, active=1) if whole_after is None else \
        torch.profiler.schedule(wait=0, warmup=whole_after, active=steps - whole_after, repeat=1)
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_flops=flops,
        profile_memory=memory, schedule=schedule, on_trace_ready=ready)


class LM(nn.Module):
    """A small causal transformer language model (the shape of the issue's measurements)."""

    def __init__(self, vocab: int = 1000, d: int = 128, layers: int = 2, heads: int = 4, seq: int = 64):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos
        return self.head(self.enc(h, mask=self.mask, is_causal=True)).reshape(-1, self.vocab)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int = 64, vocab: int = 1000) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (n, seq), generator=g)
        self.y = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def _flat_targets(batch: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.utils.data.default_collate(batch)
    return x, y.reshape(-1)  # the LM's logits are (batch * seq, vocab)


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def _conv() -> nn.Module:
    def block(a: int, b: int) -> list[nn.Module]:
        return [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(), nn.MaxPool2d(2)]

    return nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 32), nn.Flatten(), nn.Linear(32 * 16, 10))


def _workload(name: str, tiny: bool, batches: int) -> tuple[Any, nn.Module, Any, Any]:
    """(data set, model, optimizer factory, loss) of one workload."""
    if name == "lm":
        return Tokens(batches * 8), LM(), lambda p: torch.optim.AdamW(p, lr=1e-3), nn.CrossEntropyLoss()
    if name == "conv":
        return Images(batches * 16), _conv(), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), \
            nn.CrossEntropyLoss()
    batch, features, hidden = (8, 16, 32) if tiny else (64, 128, 512)
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 1))
    return Synthetic(batches * batch, features), model, lambda p: torch.optim.Adam(p, lr=1e-3), nn.MSELoss()


BATCH = {"lm": 8, "conv": 16}


def _own_peak_kb() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batches", type=int, default=50, help="batches in the data set (cycled)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: fast steps (memory run)")
    parser.add_argument("--timings", help="write per-step wall times (s) as JSON here")
    parser.add_argument("--torch-profiler", metavar="DIR", help="profile with torch.profiler into DIR")
    parser.add_argument("--with-flops", action="store_true", help="torch.profiler's FLOP estimates too")
    parser.add_argument("--torch-whole-after", type=int, metavar="W",
                        help="with --torch-profiler: one trace of every step after the first W")
    parser.add_argument("--profile-memory", action="store_true",
                        help="with --torch-profiler: its profile_memory too (allocator events)")
    parser.add_argument("--model", choices=["mlp", "lm", "conv"], default="mlp")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data, model, make_optimizer, loss_fn = _workload(args.model, args.tiny, args.batches)
    batch = BATCH.get(args.model, 8 if args.tiny else 64)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
    loader = DataLoader(data, batch_size=batch, shuffle=True, num_workers=0,
                        collate_fn=_flat_targets if args.model == "lm" else None)
    optimizer = make_optimizer(model.parameters())
    record = torch.profiler.record_function

    trace_dir = Path(args.torch_profiler) / f"rank{rank}" if args.torch_profiler and world > 1 \
        else Path(args.torch_profiler) if args.torch_profiler else None
    prof = _profiler(trace_dir, args.with_flops, args.torch_whole_after, args.steps, args.profile_memory) \
        if trace_dir is not None else None
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
    print(f"OPTIER_RSS_KB {_own_peak_kb()} "
          f"blocks {sys.getallocatedblocks()} gc_objects {len(gc.get_objects())}", flush=True)
    if args.timings:
        Path(args.timings + (f".rank{rank}" if world > 1 else "")).write_text(json.dumps(times))
        # the job's own end (epoch s): the bench times the process's exit from here
        Path(args.timings + (f".rank{rank}" if world > 1 else "") + ".end").write_text(repr(time.time()))
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
