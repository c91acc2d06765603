"""The operator tier on a real GPU: kernels, copies and fills as tasks on their streams, linked
to the operators that launched them.  Skipped where torch sees no CUDA device (every CI machine
so far); run on a GPU machine with ``python -m pytest -q tests/test_cuda.py``."""

from __future__ import annotations

import json

import pytest

from conftest import Runner, check_timeline, raw, read_csv

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")

MODEL = 4294967295
JOB = """
import torch
from torch import nn
dev = torch.device("cuda:0")
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
host = torch.randn(64, 256).pin_memory()
a, b = torch.randn(512, 256, device=dev), torch.randn(256, 128, device=dev)
for i in range(6):
    x = host.to(dev, non_blocking=True)           # a host-to-device copy per iteration
    opt.zero_grad()
    model(x).sum().backward()
    torch.mm(a, b)                                 # a GEMM of known size
    torch.zeros(1024, device=dev)                  # a memset / fill kernel
    (x > 0).nonzero()                              # synchronises: runs partly on the host
    opt.step()
torch.cuda.synchronize()
print("CUDA JOB DONE")
"""


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory) -> Runner:
    runner = Runner(tmp_path_factory.mktemp("cuda"))
    proc = runner.run(JOB, {"training_trace": "on", "task_trace": "on", "aicpu": "on",
                            "aic_metrics": "ArithmeticUtilization"}, timeout=300)
    assert "CUDA JOB DONE" in proc.stdout
    return runner


def test_kernels_are_the_tasks(gpu_run):
    device = gpu_run.device_dir()
    info = json.loads((device / "info.json.0").read_text())
    assert info["DeviceInfo"][0]["type"] == "CUDA"
    assert info["jobprof"]["calibration"]["device"].startswith("cuda")
    for i in range(2, 7):
        rows = read_csv(device / "summary" / f"op_summary_0_{MODEL}_{i}.csv")
        kinds = {r["Task Type"] for r in rows}
        assert "CUDA" in kinds and "MEMCPY" in kinds, kinds
        gemm = [r for r in rows if r["OP Type"] == "mm" and r["Input Shapes"] == "512,256;256,128"
                and r["Task Type"] == "CUDA"]
        assert gemm, "the GEMM's kernel is attributed to aten::mm with its input shapes"
        assert all(r["Block Dim"] not in ("N/A", "") and int(r["Block Dim"]) > 0 for r in gemm)
        # cuBLAS may launch more than the GEMM under one mm: the FLOPs are on one kernel of it
        [carrying] = [r for r in gemm if r["cube_fops"] != "N/A"]
        assert int(carrying["cube_fops"]) == 2 * 512 * 256 * 128
        assert not [r for r in rows if any(c in r["OP Type"] for c in "(),<> ")], "a signature fragment"
        streams = {r["Stream ID"] for r in rows if r["Task Type"] == "CUDA"}
        assert streams and all(s.isdigit() for s in streams)


def test_flows_link_launches_to_kernels(gpu_run):
    device = gpu_run.device_dir()
    events = check_timeline(device / "timeline" / f"msprof_0_{MODEL}_3.json")
    tasks = {(e["pid"], e["tid"], e["ts"]) for e in events if e.get("ph") == "X"}
    ends = [e for e in events if e.get("ph") == "f" and e.get("cat") == "HostToDevice"]
    assert ends and all((e["pid"], e["tid"], e["ts"]) in tasks for e in ends)
    check_timeline(device / "timeline" / f"task_time_0_{MODEL}_3.json")


def test_host_only_operators_are_marked(gpu_run):
    rows = read_csv(gpu_run.device_dir() / "summary" / f"aicpu_0_{MODEL}_3.csv")
    nodes = [r["Node"] for r in rows]
    assert any(n.endswith("[host]") for n in nodes), nodes
    assert not any(n.startswith("aten::mm") and n.endswith("[host]") for n in nodes)


def test_every_iteration_has_device_records(gpu_run):
    for index, streams in raw(gpu_run.device_dir()).items():
        kinds = {r[4] for r in streams.get("ops", [])}
        assert "kernel" in kinds, (index, kinds)


NCCL_JOB = """
import os, socket, time, torch, torch.distributed as dist
from torch import nn
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
dev = torch.device("cuda:0")
torch.cuda.set_device(dev)
model = torch.nn.parallel.DistributedDataParallel(nn.Linear(1024, 1024).to(dev), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(4):
    opt.zero_grad()
    model(torch.randn(64, 1024, device=dev)).sum().backward()
    dist.all_reduce(torch.ones(1 << 20, device=dev))     # 4 MiB
    opt.step()
torch.cuda.synchronize()
dist.destroy_process_group()
print("NCCL JOB DONE")
"""


@pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_nccl_available()),
                    reason="no NCCL in this torch")
def test_nccl_collectives_timed_by_cuda_events(tmp_path):
    """hccl on NCCL (one rank): the DDP bucket and the explicit all-reduce, with their sizes and
    device durations from the backend's CUDA events."""
    runner = Runner(tmp_path)
    proc = runner.run(NCCL_JOB, {"training_trace": "on", "task_trace": "off", "hccl": "on"}, timeout=300)
    assert "NCCL JOB DONE" in proc.stdout, proc.stderr
    stored = raw(runner.device_dir(0))
    for iteration in (2, 3):
        reduces = [r for r in stored[iteration]["hccl"] if r["op"] == "all_reduce"]
        assert sorted(r["bytes"] for r in reduces) == sorted([4 * (1024 * 1024 + 1024), 4 << 20])
        for r in reduces:
            assert r["backend"] == "nccl" and r["end_from"] == "cuda events", r
            assert 0 < r["end_ns"] - r["start_ns"] < 1e9
        events = check_timeline(runner.device_dir(0) / "timeline" / f"hccl_0_{MODEL}_{iteration}.json")
        assert sum(e["ph"] == "X" for e in events) == len(stored[iteration]["hccl"])


COMPILED = """
import torch
from torch import nn
dev = torch.device("cuda:0")
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(4):
    loss = compiled(torch.randn(64, 256, device=dev)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
print("COMPILED CUDA JOB DONE")
"""


def test_fusion_op_names_triton_kernels_and_joins_their_device_tasks(tmp_path):
    """UNVERIFIED until it runs on a GPU: Triton kernels carry Inductor's provenance comment
    (graph order), and their device tasks get the graph's Model ID and OP Type Fused(...)."""
    runner = Runner(tmp_path)
    proc = runner.run(COMPILED, {"training_trace": "on", "task_trace": "on"}, timeout=600,
                      env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert "COMPILED CUDA JOB DONE" in proc.stdout
    device = runner.device_dir()
    files = sorted((device / "summary").glob("fusion_op_*_1.csv"))
    assert len(files) == 2, files  # forward and backward graph, compiled in iteration 1
    rows = [r for f in files for r in read_csv(f)]
    triton = [r for r in rows if r["Fusion Op"].startswith("triton_")]
    assert triton and all(r["Original Ops"].startswith("aten::") for r in triton), rows
    tasks = read_csv(device / "summary" / f"op_summary_0_{MODEL}_3.csv")
    fused = [r for r in tasks if r["OP Type"].startswith("Fused(")]
    assert fused and all(r["Model ID"] != str(MODEL) for r in fused), tasks
    assert {r["Op Name"] for r in fused} <= {r["Fusion Op"] for r in triton}
