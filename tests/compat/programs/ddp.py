"""A gloo DistributedDataParallel job, run under torchrun: ``argv[1]`` (default 6) AdamW steps,
each rank on its own data.  Rank 0 prints as it goes; every other rank's stdout is kept and
gathered to rank 0 at the end, which prints it prefixed ``rank<r> `` in rank order, so the
job's stdout does not depend on how two processes' writes interleave.  STEPS (rank 0's) says
how many optimizer steps each rank took."""

import io
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import compile_counters, fact, loss, rng_tail, save_copy_average, seed

n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
rank = int(os.environ["RANK"])
if rank:
    sys.stdout = io.StringIO()
seed()  # the same initial weights on every rank (DDP checks), then each rank's own data
dist.init_process_group("gloo")
world = dist.get_world_size()
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
model = DDP(net)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
mse = nn.MSELoss()
data = torch.Generator().manual_seed(100 + rank)
steps = 0
for i in range(n):
    x, y = torch.randn(8, 16, generator=data), torch.randn(8, 1, generator=data)
    opt.zero_grad()
    out = mse(model(x), y)
    out.backward()
    opt.step()
    steps += 1
    loss(i, out.item())
    if i == n // 2:
        save_copy_average(model, "during ddp")
        save_copy_average(net, "during")  # the module users save: DDP's own .module
fact("STEPS", steps)
save_copy_average(model, "after ddp")
save_copy_average(net, "after")
# the ranks' weights after training: DDP keeps them equal
fact("WEIGHTS", repr(torch.cat([p.detach().flatten() for p in net.parameters()])[:4].tolist()))
rng_tail()
compile_counters()
gathered = [None] * world
dist.all_gather_object(gathered, sys.stdout.getvalue() if rank else "")
if rank == 0:
    for r, text in enumerate(gathered[1:], 1):
        for line in text.splitlines():
            print(f"rank{r} {line}", flush=True)
dist.barrier()
dist.destroy_process_group()
