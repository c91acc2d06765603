"""task_memory on real jobs: a module that allocates a known 64 MiB tensor each iteration (rows,
holders and peaks exact to the KB), a loop that leaks one tensor per iteration (the creep finding
names the operator and its module), a job that runs out of memory (exit code and traceback
unchanged, the profile closed, the summary names the failure), the step tier alone, and the
c10 warning memory profiling causes kept off the job's stderr."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import Runner, check_timeline, jobprof_cli, read_csv

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

MODEL = 4294967295
STEPS = 5
MIB64_KB = "65536.000"
OPERATOR_HEADER = ("Device_id,Name,Size(KB),Allocation Time(us),Duration(us),"
                   "Allocation Total Allocated(KB),Allocation Total Reserved(KB),"
                   "Release Total Allocated(KB),Release Total Reserved(KB),Device")
RECORD_HEADER = "Device_id,Component,Timestamp(us),Total Allocated(KB),Total Reserved(KB),Device"

JOB = f"""
import sys
import torch
from torch import nn

class Big(nn.Module):  # 64 MiB of float32, freed before the module returns
    def forward(self, x):
        buf = torch.ones(16 * 1024 * 1024)
        return x + buf[: x.numel()].view_as(x).sum() * 0

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.big = Big()

    def forward(self, x):
        return self.big(self.lin(x))

if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    early = [torch.randn(100) for _ in range(40)]  # allocated before any capture
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    kept = []
    for step in range({STEPS}):
        x = torch.randn(32, 64)
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        del early[:10]  # blocks allocated before the capture, freed inside it
        if "leak" in sys.argv:
            kept.append(torch.zeros(256 * 1024))  # 1 MiB a step, never freed
        if "churn" in sys.argv:  # 600 blocks a step, freed by the next step
            held = [torch.empty(4) for _ in range(600)]
        if "oom" in sys.argv and step == 3:  # the CPU allocator refuses (a real allocation failure)
            torch.empty(2**62, dtype=torch.uint8)
        print(step, repr(loss.item()))
"""
OPERATOR_TIER = {"training_trace": "on", "task_trace": "l0", "task_memory": "on", "dp": "off"}
STEP_TIER = {"training_trace": "on", "task_trace": "off", "fusion_op": "off", "task_memory": "on",
             "dp": "off"}


def _files(device: Path, name: str) -> dict[int, Path]:
    return {int(p.stem.rsplit("_", 1)[1]): p for p in (device / "summary").glob(f"{name}_0_{MODEL}_*.csv")}


def _summary(prof: Path) -> dict:
    proc = jobprof_cli("summary", "--json", str(prof))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _section(model: dict, key: str) -> list[dict]:
    section = model["sections"][key]
    return [dict(zip(section["columns"], row, strict=True)) for row in section["rows"]]


@pytest.fixture(scope="module")
def leak(tmp_path_factory) -> tuple[Runner, object, object]:
    runner = Runner(tmp_path_factory.mktemp("memory_leak"))
    profiled = runner.run(JOB, {**OPERATOR_TIER, "kineto_trace": "on"}, args=["leak"], timeout=240)
    plain = runner.run(runner.tmp / "job.py", None, mode=None, args=["leak"])
    return runner, profiled, plain


def test_same_output_and_no_c10_warning(leak):
    """Blocks allocated before the capture and freed inside it make c10 print "Memory block of
    unknown size ..." under memory profiling; the job's stderr must stay as unprofiled."""
    _, profiled, plain = leak
    assert profiled.stdout == plain.stdout
    own = [line for line in profiled.stderr.splitlines() if not line.startswith("jobprof:")]
    assert own == plain.stderr.splitlines() == [], profiled.stderr


def test_each_iteration_has_its_64_mib_row_exact(leak):
    runner, _, _ = leak
    device = runner.device_dir()
    found = _files(device, "operator_memory")
    assert sorted(found) == list(range(1, STEPS + 1))
    for index, path in found.items():
        assert path.read_text().splitlines()[0] == OPERATOR_HEADER
        rows = read_csv(path)
        big = [r for r in rows if r["Name"] == "aten::ones (Net.big)"]
        assert len(big) == 1, (index, [r["Name"] for r in rows])
        row = big[0]
        assert row["Size(KB)"] == MIB64_KB and row["Device"] == "CPU" and row["Device_id"] == "0"
        # freed inside the module: both ends in the iteration, the totals 64 MiB apart
        assert Decimal(row["Duration(us)"]) > 0 and row["Allocation Time(us)"].endswith("\t")
        assert Decimal(row["Allocation Total Allocated(KB)"]) - Decimal(row["Release Total Allocated(KB)"]) \
            >= Decimal(MIB64_KB) - 64
        assert row["Allocation Total Reserved(KB)"] == "N/A"  # the CPU allocator has no reserve
        # msprof's rules for an end outside the iteration
        for r in rows:
            if r["Name"] == "":
                assert Decimal(r["Size(KB)"]) < 0 and r["Allocation Time(us)"] == "" \
                    and r["Allocation Total Allocated(KB)"] == "" and r["Release Total Allocated(KB)"] != ""
            else:
                assert Decimal(r["Size(KB)"]) > 0
                assert (r["Duration(us)"] == "") == (r["Release Total Allocated(KB)"] == ""), r
        # the leaked MiB of the step before outlives this iteration
        if index > 1:
            leaked = [r for r in rows if r["Name"] == "aten::zeros"]
            assert [(r["Size(KB)"], r["Duration(us)"]) for r in leaked] == [("1024.000", "")]


def test_memory_record_and_counters(leak):
    runner, _, _ = leak
    device = runner.device_dir()
    for index, path in _files(device, "memory_record").items():
        assert path.read_text().splitlines()[0] == RECORD_HEADER
        rows = read_csv(path)
        pytorch = [r for r in rows if r["Component"] == "PyTorch"]
        rss = [r for r in rows if r["Component"] == "Process RSS"]
        assert pytorch and rss, index
        # the allocator's count passes 64 MiB in every iteration
        assert max(Decimal(r["Total Allocated(KB)"]) for r in pytorch) >= Decimal(MIB64_KB)
        assert all(r["Total Reserved(KB)"] == "N/A" and r["Device"] == "CPU" for r in rows)
        assert all(Decimal(r["Total Allocated(KB)"]) > 10_000 for r in rss)  # a Python with torch
        stamps = [Decimal(r["Timestamp(us)"]) for r in rows]
        assert stamps == sorted(stamps)
        events = check_timeline(device / "timeline" / f"msprof_0_{MODEL}_{index}.json")
        counters = [e for e in events if e.get("ph") == "C"]
        assert {e["name"] for e in counters} == {"PyTorch CPU (MB)", "Process RSS (MB)"}
        assert len([e for e in counters if e["name"] == "PyTorch CPU (MB)"]) == len(pytorch)
        # the PyTorch-profiler form (kineto_trace) carries them as Kineto writes them
        doc = json.loads((device / "timeline" / f"kineto_0_{MODEL}_{index}.json").read_text())
        memory = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
        assert len(memory) == len(pytorch)
        for e, r in zip(memory, pytorch, strict=True):  # the CSV's KB have 3 decimals
            assert abs(e["args"]["Total Allocated"] - Decimal(r["Total Allocated(KB)"]) * 1024) < 1
        kinds = {(e["ph"], e["cat"], e["args"]["Device Type"]) for e in memory}
        assert kinds == {("i", "cpu_instant_event", 0)}
        assert "op_memory" in doc["jobprof"]["sources"]


def test_summary_peak_holders_and_creep(leak):
    runner, _, _ = leak
    model = _summary(runner.prof_dirs()[0])
    [summary] = _section(model, "memory")
    assert summary["allocator"] == "CPU" and summary["peak_rss"] > 0
    held = _section(model, "memory_peak")
    assert held[0]["operator"] == "aten::ones (Net.big)" and held[0]["mib"] == 64
    # the peak: 64 MiB plus what was live, to the KB of the allocator's own count
    device = runner.device_dir()
    at = summary["at_iteration"]
    records = read_csv(_files(device, "memory_record")[at])
    top = max(Decimal(r["Total Allocated(KB)"]) for r in records if r["Component"] == "PyTorch")
    assert Decimal(str(summary["peak_allocated"])) == (top / 1024).quantize(Decimal("0.001"))
    iterations = _section(model, "memory_iterations")
    assert [r["iteration"] for r in iterations] == list(range(1, STEPS + 1))
    assert model["sections"]["memory_iterations"]["chart"] == ["peak_allocated", "peak_reserved", "peak_rss"]
    [creep] = [f for f in model["findings"] if f["key"] == "memory_creep"]
    assert creep["evidence"]["operator"] == "aten::zeros"
    assert creep["evidence"]["per_iteration"] == 1024 * 1024  # exactly the MiB a step keeps
    assert "aten::zeros" in creep["text"]
    [one] = [f for f in model["findings"] if f["key"] == "memory_one_op"]
    assert one["evidence"]["operator"] == "aten::ones (Net.big)" and one["evidence"]["bytes"] == 64 * 2**20
    report = jobprof_cli("report", str(runner.prof_dirs()[0]), "-o", str(runner.tmp / "r.html"))
    assert report.returncode == 0, report.stderr
    page = (runner.tmp / "r.html").read_text()
    assert 'class="chart section-lines"' in page and "Memory per iteration" in page


def test_no_leak_no_creep(tmp_path):
    runner = Runner(tmp_path)
    runner.run(JOB, OPERATOR_TIER, timeout=240)
    model = _summary(runner.prof_dirs()[0])
    assert not [f for f in model["findings"] if f["key"] == "memory_creep"]
    assert _section(model, "memory")[0]["growth_per_iteration"] == 0


def test_out_of_memory_keeps_exit_code_and_traceback(tmp_path):
    """The CPU allocator cannot allocate (torch raises a RuntimeError, "DefaultCPUAllocator:
    can't allocate memory"): the job dies as unprofiled, the profile closes and names it."""
    runner = Runner(tmp_path)
    profiled = runner.run(JOB, OPERATOR_TIER, args=["oom"], timeout=240, check=False)
    plain = runner.run(runner.tmp / "job.py", None, mode=None, args=["oom"], check=False)
    assert plain.returncode == 1 and profiled.returncode == plain.returncode
    assert profiled.stdout == plain.stdout
    own = [line for line in profiled.stderr.splitlines() if not line.startswith("jobprof:")]
    assert own == plain.stderr.splitlines()
    assert own[-1].startswith("RuntimeError: ") and "can't allocate memory" in own[-1]
    info = json.loads((runner.device_dir() / "info.json.0").read_text())["jobprof"]
    assert info["end_reason"] == "exception: RuntimeError"
    oom = info["memory_oom"]
    # raised after step 4 ended: in iteration 5
    assert oom["error"] == "RuntimeError" and oom["iteration"] == 5 and oom["rss_bytes"] > 0
    assert oom["asked_bytes"] == 2**62
    model = _summary(runner.prof_dirs()[0])
    [finding] = [f for f in model["findings"] if f["key"] == "memory_oom"]
    assert "RuntimeError" in finding["text"] and "iteration 5" in finding["text"]
    assert "aten::ones (Net.big)" in finding["text"]  # what held the most at the peak
    assert model["findings"][0]["key"] == "memory_oom"  # the first thing to read


def test_step_tier_alone(tmp_path):
    """No operator capture: the process's RSS sampled, no operator_memory file."""
    runner = Runner(tmp_path)
    runner.run(JOB, STEP_TIER, timeout=240)
    device = runner.device_dir()
    assert not _files(device, "operator_memory") and not list((device / "data").glob("kineto/*"))
    found = _files(device, "memory_record")
    assert sorted(found) == list(range(1, STEPS + 1))
    for path in found.values():
        rows = read_csv(path)
        assert rows and {r["Component"] for r in rows} == {"Process RSS"}
    model = _summary(runner.prof_dirs()[0])
    [row] = _section(model, "memory")
    # the 64 MiB tensor's pages are the process's at its peak: RSS above that
    assert row["allocator"] is None and row["peak_rss"] > 64
    assert [r["peak_rss"] is not None for r in _section(model, "memory_iterations")] == [True] * STEPS


def test_timeline_counters_open_in_perfetto(leak):
    pytest.importorskip("playwright")
    import perfetto_check

    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no chromium here (.ci/run installs it)")
    runner, _, _ = leak
    path = runner.device_dir() / "timeline" / f"msprof_0_{MODEL}_2.json"
    events = json.loads(path.read_text())
    values = sum(len(e["args"]) for e in (events if isinstance(events, list) else events["traceEvents"])
                 if e.get("ph") == "C")
    [result] = perfetto_check.check([path])
    assert not result.problems, result.problems
    assert result.counters == values > 0


# -- the CUDA path, on data in the form torch writes it (no GPU here: UNVERIFIED on a GPU) -------------
# Kineto's [memory] events on CUDA carry Device Type 1, the device index and the caching allocator's
# Total Reserved; torch.cuda.memory._snapshot() has the documented Snapshot / Segment / Block /
# TraceEntry shape (torch/cuda/memory.py).

def _cuda_trace() -> dict:
    base = 1_000_000.0

    def mem(ts: float, size: int, addr: int, allocated: int, reserved: int) -> dict:
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 7, "tid": 7,
                "ts": base + ts, "args": {"Total Reserved": reserved, "Total Allocated": allocated,
                                          "Bytes": size, "Device Id": 0, "Device Type": 1, "Addr": addr}}

    op = {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 7, "tid": 7, "ts": base + 5, "dur": 10,
          "args": {"External id": 1, "Ev Idx": 0}}
    return {"baseTimeNanoseconds": 0, "traceEvents": [
        op, mem(6, 1 << 30, 0xA000, 1 << 30, 3 << 30),
        mem(20, 1 << 20, 0xB000, (1 << 30) + (1 << 20), 3 << 30),
        mem(30, -(1 << 30), 0xA000, 1 << 20, 3 << 30), mem(40, -(1 << 20), 0xC000, 0, 3 << 30)]}


def test_cuda_events_rows_and_fragmentation():
    from jobprof.files.kinetotrace import records_of
    from jobprof.plugin import MemoryEvent, OpView
    from jobprof.plugins.task_memory import ledger, report

    memory: list[MemoryEvent] = []
    ops = records_of(_cuda_trace(), 0, False, memory)
    assert [e.device_type for e in memory] == [1] * 4 and memory[0].total_reserved == 3 << 30
    assert [ledger.device_label(e) for e in memory] == ["cuda:0"] * 4
    namer = ledger.Namer(OpView(ops))
    rows = ledger.allocations(memory, namer)
    # allocation freed inside, allocation outliving the window, a free whose allocation came before
    assert [(r.name, r.size, r.release is not None) for r in rows] == [
        ("aten::empty", 1 << 30, True), ("N/A", 1 << 20, False), ("", -(1 << 20), True)]
    [peak] = ledger.peaks(memory, ledger.names_of(memory, namer))
    assert (peak.device, peak.allocated, peak.reserved) == ("cuda:0", (1 << 30) + (1 << 20), 3 << 30)
    assert peak.holders == [("aten::empty", 1 << 30), ("N/A", 1 << 20)] and peak.earlier == 0
    facts = {"peak": {"iteration": 3, "allocated": peak.allocated, "reserved": peak.reserved,
                      "holders": [list(h) for h in peak.holders], "earlier": 0}}
    found = {f.key: f for f in report._findings("", 0, facts)}
    assert set(found) == {"memory_fragmentation", "memory_one_op"}
    assert found["memory_fragmentation"].evidence["reserved"] == 3 << 30


def test_cuda_step_tier_peak_is_exact_when_the_allocator_mark_rose():
    from jobprof.plugins.task_memory import report

    before = {"ns": 0, "rss": 1, "hwm": 1, "allocated": 10, "reserved": 40, "max_allocated": 50,
              "device": 0, "before": True}
    during = [{"ns": 5, "rss": 1, "hwm": 1, "allocated": 20, "reserved": 40, "max_allocated": 90,
               "device": 0},
              {"ns": 9, "rss": 1, "hwm": 1, "allocated": 15, "reserved": 48, "max_allocated": 90,
               "device": 0}]
    # the allocator's own high-water mark rose from 50 to 90 during the iteration: its peak was 90
    assert report._sampled_cuda([before, *during]) == (90, 48, 15, "cuda:0")
    # it did not rise: the highest sample is all that is known
    flat = [{**d, "max_allocated": 50} for d in during]
    assert report._sampled_cuda([before, *flat]) == (20, 48, 15, "cuda:0")


def test_cuda_oom_digest_from_a_snapshot():
    from jobprof.plugins.task_memory import oom

    frames = [{"filename": "/x/torch/nn/functional.py", "line": 10, "name": "linear"},
              {"filename": "/job/train.py", "line": 42, "name": "forward"}]
    snapshot = {"segments": [{"device": 0, "address": 1, "total_size": 8 << 30, "stream": 0,
                              "segment_type": "large", "allocated_size": 6 << 30, "active_size": 6 << 30,
                              "blocks": [{"size": 4 << 30, "requested_size": 4 << 30, "address": 1,
                                          "state": "active_allocated", "frames": frames},
                                         {"size": 2 << 30, "requested_size": (2 << 30) - 5, "address": 2,
                                          "state": "active_allocated", "frames": []},
                                         {"size": 2 << 30, "requested_size": 0, "address": 3,
                                          "state": "inactive", "frames": []}]}],
                "device_traces": [[{"action": "alloc", "addr": 1, "size": 4 << 30, "frames": frames},
                                   {"action": "oom", "size": 3 << 30, "frames": frames}]]}

    class Memory:
        @staticmethod
        def _snapshot():
            return snapshot

    class Cuda:
        memory = Memory

        @staticmethod
        def is_initialized():
            return True

    class Torch:
        cuda = Cuda

    digest = oom.cuda_digest(Torch, 0)
    assert digest["live_bytes"] == (6 << 30) - 5 and digest["reserved_bytes"] == 8 << 30
    assert digest["largest"][0] == {"bytes": 4 << 30, "where": "/job/train.py:42 forward"}
    assert digest["last_events"][-1]["action"] == "oom"


def test_sampled_capture_keeps_stderr_and_names_its_iterations(tmp_path):
    """task_trace_every 2: Kineto pauses and resumes at iteration ends; the 600 blocks a paused
    iteration allocates are freed in the next, sampled one: 1,200 frees of blocks c10 did not see
    allocated, whose warning would print at the 1000th if only the capture's start absorbed it."""
    runner = Runner(tmp_path)
    profiled = runner.run(JOB, {**OPERATOR_TIER, "task_trace_every": 2}, args=["churn"], timeout=240)
    plain = runner.run(runner.tmp / "job.py", None, mode=None, args=["churn"])
    assert profiled.stdout == plain.stdout
    assert [line for line in profiled.stderr.splitlines() if not line.startswith("jobprof:")] == []
    device = runner.device_dir()
    assert sorted(_files(device, "operator_memory")) == [1, 3, 5]  # the sampled iterations
    assert sorted(_files(device, "memory_record")) == list(range(1, STEPS + 1))  # RSS: every one


def test_oom_errors_are_recognised():
    from jobprof.plugins.task_memory import oom

    cpu = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
           "you tried to allocate 35184372088832 bytes. Error code 12 (Cannot allocate memory)")
    cuda = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.11 GiB "
            "of which 3.06 MiB is free.")
    assert oom.asked_bytes(cpu) == 35184372088832 and oom.asked_bytes(cuda) == 20 << 20
    assert oom.OOM_TEXT.search(cpu) and oom.OOM_TEXT.search(cuda)
    assert oom.asked_bytes("something else") is None and not oom.OOM_TEXT.search("index out of range")


def test_dataloader_batches_are_shared_memory_not_the_cpu_allocator(tmp_path):
    """The batches DataLoader workers hand over live in shared memory, whose reporter writes its
    own total where the CPU allocator's count goes: told apart, the CPU allocator's series keeps
    its own count."""
    runner = Runner(tmp_path)
    runner.run('''
import torch
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 1024), torch.randn(64, 1))
    net = torch.nn.Linear(1024, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for x, y in DataLoader(data, batch_size=8, num_workers=1):
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
''', OPERATOR_TIER, timeout=240)
    device = runner.device_dir()
    shared = cpu = 0
    for path in _files(device, "operator_memory").values():
        for r in read_csv(path):
            if r["Device"] == "CPU shared memory":
                shared += 1
                if r["Name"]:  # allocated here: the batch of the loop's next()
                    assert r["Name"].startswith("enumerate(DataLoader)"), r
                    assert r["Size(KB)"] in ("32.000", "0.031"), r  # 8 x 1024 floats, 8 x 1 float
            else:
                cpu += 1
                assert r["Device"] == "CPU"
    assert shared and cpu
    for path in _files(device, "memory_record").values():
        rows = [r for r in read_csv(path) if r["Device"] == "CPU" and r["Component"] == "PyTorch"]
        # the CPU allocator's own count: the model's gradients and the batch's copies stay above 0
        assert rows and min(Decimal(r["Total Allocated(KB)"]) for r in rows) > 0
    [row] = _section(_summary(runner.prof_dirs()[0]), "memory")
    assert row["allocator"] == "CPU"
