"""Data-parallel training on CPU (gloo) or GPU (NCCL): DistributedDataParallel, a
DistributedSampler, and a metric all-reduced every step.

Runs in seconds on a CPU.  Profile every rank without changing a line:

    export PROFILING_MODE=true
    export PROFILING_OPTIONS='{"output":"./prof","training_trace":"on","hccl":"on"}'
    torchrun --nproc_per_node 2 examples/train_ddp.py
    jobprof summary ./prof
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps per rank")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(0)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * args.batch * world, 128, generator=g)
    y = torch.sin(x @ torch.randn(128, 1, generator=g))
    data = TensorDataset(x, y)
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data, seed=0))

    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step, (xb, yb) in enumerate(loader, 1):
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(xb), yb)
        loss.backward()  # DDP all-reduces the gradient buckets during backward
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the loss averaged over ranks, for logging
        if rank == 0 and (step % 10 == 0 or step == args.steps):
            print(f"step {step}: loss {mean.item() / world:.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
