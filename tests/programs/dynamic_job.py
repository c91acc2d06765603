"""A training loop that runs until told to stop, for dynamic mode's tests (tests/test_dynamic.py).

Alone or under torchrun (gloo).  Every ``DYN_SYNC`` iterations the ranks meet in an
all_reduce that also carries rank 0's "stop" (the file ``DYN_STOP`` exists), so every rank
ends after the same iteration.  ``DYN_SLEEP_MS`` per iteration; rank ``DYN_SLOW_RANK`` sleeps
``DYN_SLOW_MS`` more from iteration ``DYN_SLOW_FROM`` on; iteration ``DYN_SPIKE`` sleeps 5x; from
iteration ``DYN_LEAK_FROM`` on each iteration keeps 1 MiB more; ``DYN_DDP`` wraps the model in
DistributedDataParallel.
Each rank prints its losses' sum at the end (compared with an unprofiled run)."""

import os
import time

import torch
from torch import nn

distributed = "RANK" in os.environ
if distributed:
    import torch.distributed as dist

    dist.init_process_group("gloo")
rank = int(os.environ.get("RANK", "0"))
env = os.environ.get
sync, sleep_ms = int(env("DYN_SYNC", "1")), float(env("DYN_SLEEP_MS", "10"))
slow_rank, slow_ms = int(env("DYN_SLOW_RANK", "-1")), float(env("DYN_SLOW_MS", "0"))
slow_from = int(env("DYN_SLOW_FROM", "0"))
spike, stop_file, limit = int(env("DYN_SPIKE", "0")), env("DYN_STOP", ""), int(env("DYN_MAX", "3000"))
leak_from = int(env("DYN_LEAK_FROM", "0"))  # from this step on, keep 1 MiB more each step

torch.manual_seed(rank)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
if distributed and env("DYN_DDP"):  # gradients all-reduced by DDP's buckets every iteration
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
total, step, kept = 0.0, 0, []
while step < limit:
    step += 1
    loss = model(torch.randn(16, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += loss.item()
    if leak_from and step >= leak_from:
        kept.append(torch.ones(1 << 18))
    pause = sleep_ms * (5 if step == spike else 1)
    pause += slow_ms if rank == slow_rank and step >= slow_from else 0
    time.sleep(pause / 1000)
    if step % sync == 0:
        flag = torch.tensor([1.0 if rank == 0 and stop_file and os.path.exists(stop_file) else 0.0])
        if distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            break
print(f"rank {rank} steps {step} loss-sum {total!r}", flush=True)
if distributed:
    dist.destroy_process_group()
