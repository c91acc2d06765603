"""A real 2-process gloo job under torchrun: one PROF_ dir, one device folder per rank."""

from __future__ import annotations

import json

import pytest

from conftest import read_csv, torchrun

DDP = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(6):
    opt.zero_grad()
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_two_ranks(runner, monkeypatch):
    launcher = torchrun(runner, runner.script(DDP, "ddp.py"), 2)
    runner.run(launcher, {"training_trace": "on"}, timeout=240)
    prof = runner.prof_dirs()
    assert len(prof) == 1, prof
    assert sorted(p.name for p in prof[0].iterdir()) == ["device_0", "device_1"]
    pids = set()
    for rank in (0, 1):
        device = prof[0] / f"device_{rank}"
        info = json.loads((device / f"info.json.{rank}").read_text())
        assert info["rank_id"] == rank and info["jobprof"]["device_id_from"] == "LOCAL_RANK"
        pids.add(info["pid"])
        csvs = sorted(device.glob("summary/step_trace_*.csv"))
        assert len(csvs) == 6
        row = read_csv(device / "summary" / f"step_trace_{rank}_4294967295_3.csv")[0]
        assert row["Device_id"] == str(rank) and float(row["Iteration Time(us)"]) > 0
    assert len(pids) == 2
