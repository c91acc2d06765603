"""aicpu against ground truth: a loop whose steps do a pure 16 MB copy (``dst.copy_(src)``), a
512x512 matmul and a view, read back from the aicpu CSV files and checked against the recorded
operator tree."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli, raw, read_csv
from jobprof.plugin import OpRecord

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

MODEL = 4294967295
STEPS = 6
HEADER = ("Device_id,Timestamp(us),Node,Compute_time(us),Memcpy_time(us),Task_time(us),"
          "Dispatch_time(us),Total_time(us),Stream ID,Task ID")

JOB = f"""
import torch
from torch import nn

class Scale(nn.Module):  # elementwise only: every aten::mm of the run is the 512x512 one
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(64))

    def forward(self, x):
        return (self.w * x).sum()

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Scale()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    src = torch.randn(2000, 2000)
    dst = torch.empty(2000, 2000)
    dst.copy_(src)  # touch dst's pages now: the profiled copies move bytes, not page faults
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    x = torch.randn(64, 64)
    for step in range({STEPS}):
        opt.zero_grad()
        dst.copy_(src)
        c = torch.mm(a, b)
        v = x.view(-1)
        model(torch.randn(64)).backward()
        opt.step()
"""


def us(cell: str) -> Decimal:
    return Decimal(cell.rstrip("\t"))


@pytest.fixture(scope="module")
def device(tmp_path_factory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("aicpu"))
    runner.run(JOB, {"aicpu": "on", "dp": "off", "task_trace": "off"}, timeout=180)
    return runner.device_dir()


def files(device: Path) -> dict[int, Path]:
    return {int(p.stem.rsplit("_", 1)[1]): p for p in (device / "summary").glob(f"aicpu_0_{MODEL}_*.csv")}


def test_header_and_exact_sums(device):
    found = files(device)
    assert sorted(found) == list(range(1, STEPS + 1))
    for path in found.values():
        assert path.read_text().splitlines()[0] == HEADER
        for r in read_csv(path):
            assert r["Device_id"] == "0" and r["Timestamp(us)"].endswith("\t")
            compute, memcpy = us(r["Compute_time(us)"]), us(r["Memcpy_time(us)"])
            task, dispatch = us(r["Task_time(us)"]), us(r["Dispatch_time(us)"])
            total = us(r["Total_time(us)"])
            assert task == compute + memcpy  # exactly, to the printed ns
            assert task + dispatch == total
            assert min(compute, memcpy, dispatch) >= 0


def test_rows_are_the_top_level_operators(device):
    from jobprof.plugin.opview import OpView

    streams = raw(device)
    for index, path in files(device).items():
        rows = read_csv(path)
        view = OpView(streams[index]["ops"])
        tops = [view.records[i] for i in view.top]
        assert [r["Node"] for r in rows] == [t.name for t in tops]
        assert [us(r["Total_time(us)"]) for r in rows] == [Decimal(t.dur) / 1000 for t in tops]
        assert [int(r["Stream ID"]) for r in rows] == [t.tid for t in tops]
        stamps = [us(r["Timestamp(us)"]) for r in rows]
        assert stamps == sorted(stamps)
        per_thread: dict[str, list[int]] = {}
        for r in rows:
            per_thread.setdefault(r["Stream ID"], []).append(int(r["Task ID"]))
        assert all(ids == list(range(1, len(ids) + 1)) for ids in per_thread.values())


def test_copy_matmul_and_view_split(device):
    copies, mms, views = [], [], []
    for index, path in sorted(files(device).items()):
        rows = read_csv(path)
        big = [r for r in rows if r["Node"] == "aten::copy_" and us(r["Total_time(us)"]) > 200]
        if index >= 2:  # iteration 1 starts at the first forward, after its step's copy and mm
            assert len(big) == 1, f"iteration {index}: {len(big)} 16 MB copies"
            assert len([r for r in rows if r["Node"] == "aten::mm"]) == 1
        copies += big
        mms += [r for r in rows if r["Node"] == "aten::mm"]
        views += [r for r in rows if r["Node"] == "aten::view"]
    assert len(copies) >= STEPS - 1 and len(mms) >= STEPS - 1 and views
    for r in copies:  # a pure copy: all of it is the byte move
        assert us(r["Compute_time(us)"]) == 0
        assert us(r["Memcpy_time(us)"]) >= Decimal("0.95") * us(r["Total_time(us)"])
    for r in mms:  # 512x512x512 FMAs dominate the dispatcher and resolve_conj views around them
        assert us(r["Compute_time(us)"]) > Decimal("0.8") * us(r["Total_time(us)"])
        assert us(r["Memcpy_time(us)"]) == 0
    for r in views:  # metadata only
        assert us(r["Compute_time(us)"]) == 0 and us(r["Memcpy_time(us)"]) == 0
        assert us(r["Dispatch_time(us)"]) == us(r["Total_time(us)"]) > 0


def test_summary_section(device):
    result = jobprof_cli("summary", str(device.parent))
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("AI CPU: top 10 top-level operators by total time", 1)[1]
    lines = section.splitlines()
    # the matmul and the 16 MB copy are the two most expensive operators of the loop
    assert {lines[3].split()[1], lines[4].split()[1]} == {"aten::mm", "aten::copy_"}
    assert "median dispatch share per iteration" in section
    # median and p95 per call beside the mean: the nearest-rank quantiles of the calls' totals in
    # the aicpu files (kept in 2% buckets: within 1%)
    model = json.loads(jobprof_cli("summary", "--json", str(device.parent)).stdout)["sections"]["aicpu"]
    assert model["columns"][4:7] == ["mean_us", "median_us", "p95_us"]
    for row in model["rows"][:2]:
        calls = sorted(float(r["Total_time(us)"]) for path in files(device).values() for r in read_csv(path)
                       if r["Node"] == row[1])
        assert row[2] == len(calls)
        median, p95 = calls[math.ceil(0.5 * len(calls)) - 1], calls[math.ceil(0.95 * len(calls)) - 1]
        assert row[5] == pytest.approx(median, rel=0.011) and row[6] == pytest.approx(p95, rel=0.011)


def test_off_writes_no_aicpu_file(tmp_path):
    runner = Runner(tmp_path)
    runner.run(JOB.replace(f"range({STEPS})", "range(2)"), {"task_trace": "l0", "aicpu": "off"})
    summary = runner.device_dir() / "summary"
    assert list(summary.glob("op_summary_*.csv")), "the ops were captured (task_trace)"
    assert not list(summary.glob("aicpu_*"))


def test_host_mark_on_cuda_records():
    """The CUDA path on hand-made records (no GPU here): an operator whose subtree launched a
    kernel is not marked, one that launched nothing is ``[host]``."""
    from jobprof.plugin.opview import OpView
    from jobprof.plugins.aicpu.split import launching_tops, split

    tid, stream = 11, 7
    # fields: name, start, dur, tid, kind, device, corr, link, shapes, dtypes, strides, flops, extra
    records = [OpRecord(*r) for r in [
        ["aten::mm", 1000, 100, tid, "cpu_op", -1, 1, 0, None, None, None, 0, None],
        ["cudaLaunchKernel", 1040, 30, tid, "cuda_runtime", -1, 42, 0, None, None, None, 0, None],
        ["aten::nonzero", 1200, 50, tid, "cpu_op", -1, 2, 0, None, None, None, 0, None],
        ["aten::copy_", 1300, 80, tid, "cpu_op", -1, 3, 0, None, None, None, 0, None],
        ["cudaMemcpyAsync", 1310, 60, tid, "cuda_runtime", -1, 43, 0, None, None, None, 0, None],
        ["sgemm", 1100, 500, stream, "kernel", 0, 42, 42, None, None, None, 0, None],
        ["Memcpy HtoD", 1380, 20, stream, "gpu_memcpy", 0, 43, 43, None, None, None, 0, None],
    ]]
    view = OpView(records)
    assert view.has_device
    assert launching_tops(view) == {0, 3}
    mm, copy = split(view, 0), split(view, 3)
    assert (mm.compute, mm.memcpy, mm.dispatch) == (70, 0, 30)  # the launch call is dispatch
    assert (copy.compute, copy.memcpy, copy.dispatch) == (0, 80, 0)  # copy_'s self + cudaMemcpyAsync


def test_redispatched_operator_counts_once():
    """Under a Python dispatch mode (the l2 plugin's) Kineto records ``aten::mm >
    PythonDispatchMode > aten::mm``: the outer record's own time and the mode's are dispatch;
    the work is the inner one's.  (The same holds for a tensor subclass calling the same op.)"""
    from jobprof.plugin.opview import OpView
    from jobprof.plugins.aicpu.split import split

    def rec(name: str, start: int, dur: int) -> OpRecord:
        return OpRecord(name, start, dur, 5, "cpu_op")

    mode = [rec("aten::mm", 1000, 1000), rec("PythonDispatchMode", 1020, 950), rec("aten::mm", 1100, 800),
            rec("aten::resolve_conj", 1150, 10)]
    s = split(OpView(mode), 0)
    assert (s.compute, s.memcpy, s.dispatch, s.total) == (790, 0, 210, 1000)
    subclass = [rec("aten::mm", 1000, 1000), rec("aten::mm", 1100, 800)]
    s = split(OpView(subclass), 0)
    assert (s.compute, s.dispatch) == (800, 200)
