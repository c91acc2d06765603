"""task_trace against ground truth: a training loop that also calls operators of known shapes a
known number of times per iteration, checked in op_summary, op_statistic, task_time and the
master timeline; l0 / off levels; blocks open across iteration ends; fork workers; memory over
a long run; the aic_metrics columns of op_summary."""

from __future__ import annotations

import json
import math
import re
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import Runner, check_timeline, jobprof_cli, raw, read_csv, stamp_ts
from jobprof.plugins.training_trace.writer import step_trace_tid

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

MODEL = 4294967295
STEPS = 6
ON = {"task_trace": "on", "training_trace": "on"}

# Per iteration, after the model's forward and backward (so inside the iteration window, which
# the operator capture opens at the first forward): torch.mm(a, b) twice on contiguous inputs,
# once on a transposed view, and x.add_(1).  The model's own operators use other shapes
# (batch 4, 10 -> 5 -> 1), so the known calls can be picked out by their shapes.
JOB = """
import resource, sys, threading
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)
mode, steps = sys.argv[1], int(sys.argv[2])
model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
a, b, c = torch.randn(64, 32), torch.randn(32, 16), torch.randn(24, 32)
x = torch.zeros(4, 8)


class Items(Dataset):
    def __len__(self):
        return steps * 4

    def __getitem__(self, i):
        return torch.randn(10), torch.randn(1)


def batches():
    if mode == "loader":
        yield from DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    else:
        data = [(torch.randn(4, 10), torch.randn(4, 1)) for _ in range(steps)]
        yield from data


def step(xb, yb):
    opt.zero_grad()
    nn.functional.mse_loss(model(xb), yb).backward()
    torch.mm(a, b)
    torch.mm(a, b)
    torch.mm(a, c.t())
    x.add_(1)
    opt.step()


if mode == "block":  # a record_function block open across every iteration end
    with torch.autograd.profiler.record_function("loop"):
        for xb, yb in batches():
            step(xb, yb)
else:
    for xb, yb in batches():
        step(xb, yb)
print("TID", threading.get_native_id())
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

SUMMARY_HEADER = ("Device_id,Model ID,Task ID,Stream ID,Op Name,OP Type,OP State,Task Type,"
                  "Task Start Time(us),Task Duration(us),Task Wait Time(us),Block Dim,Mix Block Dim,"
                  "HF32 Eligible,Input Shapes,Input Data Types,Input Formats,Output Shapes,"
                  "Output Data Types,Output Formats,Context ID")
STATISTIC_HEADER = ("Device_id,OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),"
                    "Max Time(us),Ratio(%)")
TASK_TIME_HEADER = ("Device_id,kernel_name,kernel_type,stream_id,task_id,task_time(us),task_start(us),"
                    "task_stop(us)")
SHAPE_COLUMNS = ("Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                 "Output Data Types", "Output Formats")


class Run:
    def __init__(self, runner: Runner, proc) -> None:
        self.runner = runner
        self.device = runner.device_dir()
        self.tid = int(re.search(r"^TID (\d+)$", proc.stdout, re.M).group(1))
        self.maxrss_kb = int(re.search(r"^MAXRSS_KB (\d+)$", proc.stdout, re.M).group(1))
        self.stderr = proc.stderr

    def file(self, name: str, iteration: int, ext: str = "csv") -> Path:
        folder = "summary" if ext == "csv" else "timeline"
        return self.device / folder / f"{name}_0_{MODEL}_{iteration}.{ext}"

    def files(self, name: str, ext: str = "csv") -> list[Path]:
        folder = "summary" if ext == "csv" else "timeline"
        return sorted((self.device / folder).glob(f"{name}_0_{MODEL}_*.{ext}"),
                      key=lambda p: int(p.stem.rsplit("_", 1)[1]))


def run_job(tmp: Path, mode: str, steps: int, options: dict, timeout: float = 240) -> Run:
    tmp.mkdir(parents=True, exist_ok=True)
    runner = Runner(tmp)
    proc = runner.run(JOB, options, args=[mode, str(steps)], timeout=timeout)
    return Run(runner, proc)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Run:
    return run_job(tmp_path_factory.mktemp("plain"), "plain", STEPS, ON)


def us(cell: str) -> Decimal:
    """A CSV time cell (3 decimals, absolute ones with a trailing TAB) as an exact number."""
    return Decimal(cell.rstrip("\t"))


def jobprof_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "jobprof" in line]


# -- op_summary ------------------------------------------------------------------------------
def test_op_summary_lists_the_known_calls(plain):
    files = plain.files("op_summary")
    assert [int(p.stem.rsplit("_", 1)[1]) for p in files] == list(range(1, STEPS + 1))
    for path in files:
        assert path.read_text().splitlines()[0] == SUMMARY_HEADER
        rows = read_csv(path)
        mm = [r for r in rows if r["Op Name"] == "aten::mm"]
        plain_mm = [r for r in mm if r["Input Shapes"] == "64,32;32,16"]
        assert len(plain_mm) == 2, path.name
        for r in plain_mm:
            assert r["Input Data Types"] == "float32;float32"
            assert r["Input Formats"] == "contiguous;contiguous"
            assert (r["OP Type"], r["Task Type"]) == ("mm", "CPU")
        # c.t() is a transposed view of a (24, 32) tensor: strides (1, 32)
        transposed = [r for r in mm if r["Input Shapes"] == "64,32;32,24"]
        assert len(transposed) == 1 and transposed[0]["Input Formats"] == "contiguous;strided"
        # x.add_(1): PyTorch passes the Python number as a 0-dim int64 tensor (an empty item);
        # the Scalar alpha is not a tensor and is left out
        add = [r for r in rows if r["Op Name"] == "aten::add_" and r["Input Shapes"].startswith("4,8")]
        assert len(add) == 1
        assert (add[0]["Input Shapes"], add[0]["Input Data Types"]) == ("4,8;", "float32;int64")
        for r in rows:
            assert (r["Device_id"], r["Model ID"]) == ("0", str(MODEL))
            assert r["Stream ID"] == str(plain.tid)  # the training thread ran every operator
            assert r["Op Name"].startswith("aten::") and r["OP Type"] == r["Op Name"].split("::")[1]
            for column in ("OP State", "Block Dim", "Mix Block Dim", "HF32 Eligible", "Context ID"):
                assert r[column] == "N/A", column
            assert r["Task Start Time(us)"].endswith("\t")
        # one stream: task ids count 1, 2, ... in row order
        assert [int(r["Task ID"]) for r in rows] == list(range(1, len(rows) + 1))


def test_op_summary_quotes_shape_lists_with_the_csv_module(plain):
    text = plain.file("op_summary", 2).read_text()
    assert ',"64,32;32,16",float32;float32,contiguous;contiguous,' in text


def test_wait_time_follows_the_formula_from_the_row_times(plain):
    for path in plain.files("op_summary"):
        rows = read_csv(path)
        starts = [us(r["Task Start Time(us)"]) for r in rows]
        durs = [us(r["Task Duration(us)"]) for r in rows]
        assert starts == sorted(starts)
        assert us(rows[0]["Task Wait Time(us)"]) == 0
        for i in range(1, len(rows)):
            expected = max(Decimal(0), starts[i] - starts[i - 1] - durs[i - 1])
            assert us(rows[i]["Task Wait Time(us)"]) == expected, (path.name, i)


# -- op_statistic ----------------------------------------------------------------------------
def test_op_statistic_sums_the_op_summary_rows(plain):
    for iteration in range(1, STEPS + 1):
        path = plain.file("op_statistic", iteration)
        assert path.read_text().splitlines()[0] == STATISTIC_HEADER
        groups: dict[tuple[str, str], list[Decimal]] = defaultdict(list)
        for r in read_csv(plain.file("op_summary", iteration)):
            groups[(r["OP Type"], r["Task Type"])].append(us(r["Task Duration(us)"]))
        rows = read_csv(path)
        assert {(r["OP Type"], r["Core Type"]) for r in rows} == set(groups)
        grand = sum(sum(d) for d in groups.values())
        for r in rows:
            durs = groups[(r["OP Type"], r["Core Type"])]
            assert int(r["Count"]) == len(durs)
            assert us(r["Total Time(us)"]) == sum(durs)
            assert (us(r["Min Time(us)"]), us(r["Max Time(us)"])) == (min(durs), max(durs))
            assert abs(us(r["Avg Time(us)"]) - sum(durs) / len(durs)) <= Decimal("0.0005")
            assert abs(Decimal(r["Ratio(%)"]) - 100 * sum(durs) / grand) <= Decimal("0.0005")
        totals = [us(r["Total Time(us)"]) for r in rows]
        assert totals == sorted(totals, reverse=True)
        assert abs(sum(Decimal(r["Ratio(%)"]) for r in rows) - 100) <= Decimal("0.01")
        mm = next(r for r in rows if r["OP Type"] == "mm")
        assert int(mm["Count"]) >= 3  # the three known calls, plus the backward's


# -- task_time -------------------------------------------------------------------------------
def test_task_time_csv_lists_the_same_tasks(plain):
    for iteration in range(1, STEPS + 1):
        summary = read_csv(plain.file("op_summary", iteration))
        path = plain.file("task_time", iteration)
        assert path.read_text().splitlines()[0] == TASK_TIME_HEADER
        rows = read_csv(path)
        assert len(rows) == len(summary)
        for t, s in zip(rows, summary, strict=True):
            assert (t["kernel_name"], t["kernel_type"], t["stream_id"], t["task_id"]) == \
                (s["Op Name"], s["Task Type"], s["Stream ID"], s["Task ID"])
            assert t["task_time(us)"] == s["Task Duration(us)"]
            assert t["task_start(us)"] == s["Task Start Time(us)"]
            assert t["task_stop(us)"].endswith("\t")
            assert us(t["task_stop(us)"]) - us(t["task_start(us)"]) == us(t["task_time(us)"])


def test_task_time_json_has_one_event_per_task(plain):
    for iteration in range(1, STEPS + 1):
        events = check_timeline(plain.file("task_time", iteration, "json"))
        meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
        pid = processes(events)["Ascend Hardware"]
        assert meta[("process_labels", pid, 0)] == {"labels": "NPU 0"}
        assert meta[("thread_name", pid, plain.tid)] == {"name": f"Stream {plain.tid}"}
        xs = [e for e in events if e["ph"] == "X"]
        summary = read_csv(plain.file("op_summary", iteration))
        assert [e["name"] for e in xs] == [r["Op Name"] for r in summary]
        for e, r in zip(xs, summary, strict=True):
            assert (e["pid"], e["tid"]) == (pid, plain.tid)
            assert e["args"] == {"Model Id": MODEL, "Task Type": "CPU", "Stream Id": plain.tid,
                                 "Task Id": int(r["Task ID"])}
            # ts is job-relative and exact: the CSV's epoch stamp less the job's time base
            assert Decimal(repr(e["ts"])) == stamp_ts(r["Task Start Time(us)"], plain.device)
            assert Decimal(repr(e["dur"])) == us(r["Task Duration(us)"])


# -- master timeline -------------------------------------------------------------------------
def processes(events: list[dict]) -> dict[str, int]:
    return {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}


def test_master_timeline_layers_and_flows(plain):
    for iteration in range(1, STEPS + 1):
        events = check_timeline(plain.file("msprof", iteration, "json"))
        pids = processes(events)
        labels = {e["pid"]: e["args"]["labels"] for e in events if e["name"] == "process_labels"}
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
        cann, hw = pids["CANN"], pids["Ascend Hardware"]
        assert (labels[cann], labels[hw], labels[pids["Overlap Analysis"]]) == ("CPU", "NPU 0", "NPU 0")
        assert threads[(cann, plain.tid)] == f"Thread {plain.tid}"
        assert threads[(hw, plain.tid)] == f"Stream {plain.tid}"
        assert threads[(hw, step_trace_tid(MODEL))] == f"Step Trace(Model ID:{MODEL})"  # shares the process
        xs = [e for e in events if e["ph"] == "X"]
        host = [e for e in xs if e["pid"] == cann]
        # every host record: the operators and the optimizer's own record_function blocks
        names = {e["name"] for e in host}
        assert {"aten::mm", "aten::addmm", "aten::linear"} <= names
        assert any(n.startswith("Optimizer.step#SGD.step") for n in names)
        mm = next(e for e in host
                  if e["name"] == "aten::mm" and e["args"].get("Input Dims") == [[64, 32], [32, 16]])
        assert mm["args"]["Op Type"] == "mm" and mm["args"]["Input type"] == ["float", "float"]
        tasks = [e for e in xs if e["pid"] == hw and e["tid"] == plain.tid]
        summary = read_csv(plain.file("op_summary", iteration))
        assert [e["name"] for e in tasks] == [r["Op Name"] for r in summary]
        assert all(set(e["args"]) == {"Model Id", "Task Type", "Stream Id", "Task Id"} for e in tasks)
        # HostToDevice: one flow per task, from the operator on the host to the task; the end
        # has exactly the task event's (pid, tid, ts), the start lies on a host event
        flows: dict[int, dict[str, dict]] = defaultdict(dict)
        for e in events:
            if e.get("cat") == "HostToDevice":
                flows[e["id"]][e["ph"]] = e
        assert len(flows) == len(tasks)
        task_keys = {(e["pid"], e["tid"], e["ts"]) for e in tasks}
        host_keys = {(e["pid"], e["tid"], e["ts"]) for e in host}
        for pair in flows.values():
            assert pair["f"]["bp"] == "e"
            assert (pair["f"]["pid"], pair["f"]["tid"], pair["f"]["ts"]) in task_keys
            assert (pair["s"]["pid"], pair["s"]["tid"], pair["s"]["ts"]) in host_keys


def test_overlap_analysis_tiles_the_iteration(plain):
    iterations = {i: s["iteration"][0] for i, s in raw(plain.device).items()}
    for iteration in range(1, STEPS + 1):
        events = check_timeline(plain.file("msprof", iteration, "json"))
        pid = processes(events)["Overlap Analysis"]
        threads = {e["tid"]: e["args"]["name"] for e in events
                   if e["pid"] == pid and e["name"] == "thread_name"}
        assert threads == {0: "Computing", 1: "Communication", 2: "Communication(Not Overlapped)", 3: "Free"}
        xs = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
        assert all(e["name"] == threads[e["tid"]] for e in xs)
        assert not [e for e in xs if e["name"].startswith("Communication")]  # one CPU process
        it = iterations[iteration]
        span_us = (it["end_ns"] - it["start_ns"]) / 1000
        busy = sum(e["dur"] for e in xs)
        assert abs(busy - span_us) <= len(xs) * 1.0, (busy, span_us)
        computing = sum(e["dur"] for e in xs if e["name"] == "Computing")
        task_us = sum(float(r["Task Duration(us)"]) for r in read_csv(plain.file("op_summary", iteration)))
        assert abs(computing - task_us) <= len(xs) * 1.0  # tasks of one thread never overlap


def test_summary_lists_the_top_operators(plain):
    proc = jobprof_cli("summary", "--json", str(plain.device.parent))
    assert proc.returncode == 0, proc.stderr
    model = json.loads(proc.stdout)
    # a single process: its pid a number, its world size unknown (null, never the text "N/A")
    [rank] = model["ranks"]
    assert isinstance(rank["pid"], int) and rank["pid"] > 0 and rank["world_size"] is None, rank
    section = model["sections"]["top_operators"]
    assert section["columns"] == ["device", "op_type", "core_type", "count", "total_ms", "mean_us",
                                  "median_us", "p95_us", "pct_of_task_time"]
    rows = {(r[1], r[2]): r for r in section["rows"]}
    mm_rows = [r for path in plain.files("op_summary") for r in read_csv(path) if r["OP Type"] == "mm"]
    device, _, _, count, total_ms, mean_us, median_us, p95_us, _ = rows[("mm", "CPU")]
    assert (device, count) == (0, len(mm_rows))
    total = sum(us(r["Task Duration(us)"]) for r in mm_rows)
    assert abs(Decimal(str(total_ms)) - total / 1000) <= Decimal("0.001")
    assert abs(Decimal(str(mean_us)) - total / len(mm_rows)) <= Decimal("0.001")
    # median and p95 beside the mean (nearest rank, kept in 2% buckets: within 1%)
    durations = sorted(float(r["Task Duration(us)"]) for r in mm_rows)
    median = durations[math.ceil(0.5 * len(durations)) - 1]
    p95 = durations[math.ceil(0.95 * len(durations)) - 1]
    assert median_us == pytest.approx(median, rel=0.011) and p95_us == pytest.approx(p95, rel=0.011)
    shares = [float(r[8]) for r in section["rows"]]
    assert shares == sorted(shares, reverse=True) and all(0 <= s <= 100 for s in shares)

    # the drill-down: the top types' calls by input shapes, each shape's slowest call and where it is
    shapes = json.loads(proc.stdout)["sections"]["operator_shapes"]
    drill = [dict(zip(shapes["columns"], r, strict=True)) for r in shapes["rows"]]
    top_types = [r[1] for r in section["rows"][:5]]
    assert [r["op_type"] for r in drill] == sorted((r["op_type"] for r in drill), key=top_types.index)
    mm_drill = [r for r in drill if r["op_type"] == "mm"]
    named = {r["input_shapes"] for r in mm_drill}
    for row in mm_drill:  # at most 4 shapes, then the others pooled in one row
        other = row["input_shapes"].startswith("(other shapes: ")
        calls = [r for r in mm_rows if ((r["Input Shapes"] or "N/A") not in named if other else
                                        (r["Input Shapes"] or "N/A") == row["input_shapes"])]
        assert row["calls"] == len(calls) > 0
        slowest = max(calls, key=lambda r: float(r["Task Duration(us)"]))
        assert row["slowest_us"] == float(slowest["Task Duration(us)"])
        where = [path for path in plain.files("op_summary") if slowest in read_csv(path)]
        iteration = int(where[0].stem.rsplit("_", 1)[1])
        assert row["slowest_in_iteration"] == iteration
        assert (plain.device.parent / row["timeline"]).name == f"msprof_0_4294967295_{iteration}.json"
        assert (plain.device.parent / row["timeline"]).is_file()
    assert sum(r["calls"] for r in drill if r["op_type"] == "mm") == len(mm_rows)


# -- levels ----------------------------------------------------------------------------------
def data_bytes(device: Path) -> int:
    """The raw data's bytes: segments and the operator windows (data/kineto/)."""
    return sum(p.stat().st_size for p in (device / "data").rglob("*") if p.is_file())


def test_l0_records_timing_only(plain, tmp_path):
    l0 = run_job(tmp_path, "plain", STEPS, {"task_trace": "l0", "training_trace": "on"})
    for path in l0.files("op_summary"):
        rows = read_csv(path)
        assert len([r for r in rows if r["Op Name"] == "aten::mm"]) >= 3
        for r in rows:
            assert all(r[c] == "N/A" for c in SHAPE_COLUMNS)
            assert r["OP Type"] == r["Op Name"].split("::")[1]  # filled even at l0
    assert len(l0.files("op_summary")) == STEPS
    assert data_bytes(l0.device) < data_bytes(plain.device)
    check_timeline(l0.file("msprof", STEPS, "json"))


def test_off_writes_no_operator_files(tmp_path):
    off = run_job(tmp_path, "plain", 3, {"task_trace": "off", "training_trace": "on"})
    assert len(off.files("step_trace")) == 3  # the job was profiled
    for name in ("op_summary", "op_statistic", "task_time"):
        assert not off.files(name)
    assert not off.files("task_time", "json")
    for path in off.files("msprof", "json"):
        assert "Ascend Hardware" in processes(check_timeline(path))  # the step trace only
        assert "CANN" not in processes(check_timeline(path))


# -- robustness ------------------------------------------------------------------------------
def test_block_open_across_iteration_ends(tmp_path):
    run = run_job(tmp_path, "block", STEPS, ON)
    assert len(run.files("op_summary")) == STEPS
    assert not [line for line in jobprof_lines(run.stderr) if "error" in line or "raised" in line]
    for iteration in range(1, STEPS + 1):
        rows = read_csv(run.file("op_summary", iteration))
        assert len([r for r in rows if r["Input Shapes"] == "64,32;32,16"]) == 2
        events = check_timeline(run.file("msprof", iteration, "json"))
        # the loop block is cut at each iteration end: one piece per iteration on the host
        assert [e["name"] for e in events if e["ph"] == "X" and e["name"] == "loop"] == ["loop"]


def test_fork_workers_under_task_trace(tmp_path):
    run = run_job(tmp_path, "loader", STEPS, ON)
    assert len(run.runner.prof_dirs()) == 1
    assert [p.name for p in run.device.parent.iterdir() if p.name.startswith("device_")] == ["device_0"]
    assert len(run.files("op_summary")) == STEPS
    assert not [line for line in jobprof_lines(run.stderr) if "error" in line or "raised" in line]
    for iteration in range(1, STEPS + 1):
        rows = read_csv(run.file("op_summary", iteration))
        assert len([r for r in rows if r["Input Shapes"] == "64,32;32,16"]) == 2
        assert {r["Stream ID"] for r in rows} == {str(run.tid)}  # nothing from the workers
        check_timeline(run.file("msprof", iteration, "json"))


@pytest.mark.slow
def test_memory_stays_flat_over_a_long_run(tmp_path):
    short = run_job(tmp_path / "short", "plain", 200, ON, timeout=600)
    long = run_job(tmp_path / "long", "plain", 2000, ON, timeout=1800)
    rendered = {int(p.stem.rsplit("_", 1)[1]) for p in long.files("op_summary")}
    missing = sorted(set(range(1, 2001)) - rendered)
    if missing:  # say whether the operators were never captured or not rendered
        stored = raw(long.device)
        ops = {i: len(stored.get(i, {}).get("ops", [])) for i in missing[:10]}
        pytest.fail(f"iterations without op_summary: {missing[:10]}; raw op records: {ops}; "
                    f"{jobprof_lines(long.stderr)}")
    grown_mb = (long.maxrss_kb - short.maxrss_kb) / 1024
    print(f"peak RSS: 200 iterations {short.maxrss_kb / 1024:.1f} MB, 2000 iterations "
          f"{long.maxrss_kb / 1024:.1f} MB (+{grown_mb:.1f} MB)")
    assert grown_mb <= 50


# -- in-process: the metric columns and the cell formats ---------------------------------------
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[list[list], int, int]:
    """Operators recorded for real by the core's capture, in this process."""
    import opwindow

    a, b = torch.randn(64, 32), torch.randn(32, 16)

    def work() -> None:
        torch.mm(a, b)
        torch.mm(a, b.t().contiguous().t())
        torch.relu(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last))

    return opwindow.record(torch, work, tmp_path_factory.mktemp("task_trace"))


def context(recorded, metrics=None):
    from jobprof.plugin.clock import ClockAnchor
    from jobprof.plugin.values import Config, ExportContext, Iteration

    records, begin, end = recorded
    config = Config({"task_trace": "on", "output": "."})
    return ExportContext(0, Iteration(1, begin, end + 1, "explicit"), 4242, {"ops": records},
                         ClockAnchor.now(), config, "job.py", metrics)


def test_metric_columns_are_appended(recorded):
    from jobprof.plugin.values import MetricSet
    from jobprof.plugins.task_trace.summary import render_op_summary

    metrics = MetricSet("X", ["a_col"], values=lambda task, machine: [task.dur])
    text = render_op_summary(context(recorded, metrics))
    assert text.splitlines()[0] == SUMMARY_HEADER + ",a_col"
    rows = read_rows(text)
    assert len(rows) >= 4  # mm, mm, randn, to / relu...
    for r in rows:  # the value is the task's duration in ns
        assert int(r["a_col"]) == us(r["Task Duration(us)"]) * 1000


def test_metric_values_that_raise_give_na(recorded):
    from jobprof.plugin.values import MetricSet
    from jobprof.plugins.task_trace.summary import render_op_summary

    def broken(task, machine):
        if task.name == "aten::mm":
            raise RuntimeError("third-party bug")
        return [1.5, "x,y"]

    metrics = MetricSet("X", ["a_col", "b_col"], values=broken)
    rows = read_rows(render_op_summary(context(recorded, metrics)))
    assert [(r["a_col"], r["b_col"]) for r in rows if r["Op Name"] == "aten::mm"] == [("N/A", "N/A")] * 2
    assert {(r["a_col"], r["b_col"]) for r in rows if r["Op Name"] != "aten::mm"} == {("1.5", "x,y")}


def read_rows(text: str) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))


def test_fast_csv_text_equals_the_csv_module(recorded):
    """The writers join their rows themselves; the text must be what ExportContext.csv writes."""
    from jobprof.plugins.task_trace import summary

    ctx = context(recorded)
    for render in (summary.render_op_summary, summary.render_op_statistic, summary.render_task_time_csv):
        text = render(ctx)
        rows = [list(r.values()) for r in read_rows(text)]
        assert text == ctx.csv(text.splitlines()[0].split(","), rows)


def test_cells_of_the_recorded_calls(recorded):
    ctx = context(recorded)
    from jobprof.plugins.task_trace.summary import render_op_summary

    rows = read_rows(render_op_summary(ctx))
    mm = [r for r in rows if r["Op Name"] == "aten::mm"]
    assert [r["Input Formats"] for r in mm] == ["contiguous;contiguous", "contiguous;strided"]
    relu = next(r for r in rows if r["Op Name"] == "aten::relu")
    assert (relu["Input Shapes"], relu["Input Formats"]) == ("2,3,4,5", "channels_last")


@pytest.mark.parametrize("make, expected", [
    (lambda: torch.zeros(3, 4), "contiguous"),
    (lambda: torch.zeros(3, 4).t(), "strided"),
    (lambda: torch.zeros(3, 1).expand(3, 4), "strided"),
    (lambda: torch.zeros(6)[::2], "strided"),
    (lambda: torch.zeros(0, 4).t(), "contiguous"),
    (lambda: torch.zeros(1, 4).t(), "contiguous"),
    (lambda: torch.zeros(()), "contiguous"),
    (lambda: torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last), "channels_last"),
    (lambda: torch.zeros(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d), "channels_last_3d"),
    (lambda: torch.zeros(2, 3, 4, 5).permute(0, 1, 3, 2), "strided"),
])
def test_memory_format_agrees_with_torch(make, expected):
    from jobprof.plugins.task_trace.formats import memory_format

    tensor = make()
    got = memory_format(list(tensor.shape), list(tensor.stride()))
    assert got == expected
    # the ground truth: torch's own contiguity checks
    assert (got == "contiguous") == tensor.is_contiguous()
    if got == "channels_last":
        assert tensor.is_contiguous(memory_format=torch.channels_last)
    if got == "channels_last_3d":
        assert tensor.is_contiguous(memory_format=torch.channels_last_3d)


# -- the CUDA path, on records shaped like Kineto's (no GPU here: the capture itself is unverified)
KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
          "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")
# Kineto's kernel metadata (libkineto CuptiActivity metadataJson: an args fragment, no braces)
META = ('\n      "queued": 0, "device": 0, "context": 1,\n      "stream": 7, "correlation": 41,\n'
        '      "registers per thread": 32,\n      "shared memory": 0,\n      "blocks per SM": 0.5,\n'
        '      "warps per SM": 2.0,\n      "grid": [128, 2, 1],\n      "block": [256, 1, 1],\n'
        '      "est. achieved occupancy %": 3')


def cuda_records(t0: int) -> list:
    """aten::fill_ launching a kernel on stream 7, aten::copy_ launching a host-to-device copy
    on stream 13, and a kernel whose launch was not recorded."""
    from jobprof.plugin import OpRecord

    host = 4321
    return [OpRecord(*r) for r in [
        ["aten::fill_", t0, 10_000, host, "cpu_op", -1, 0, 0, [[64, 32], []], ["float", "Scalar"],
         [[32, 1], []], 0, None],
        ["cudaLaunchKernel", t0 + 2_000, 5_000, host, "cuda_runtime", -1, 41, 0, None, None, None, 0, None],
        ["aten::copy_", t0 + 12_000, 20_000, host, "cpu_op", -1, 0, 0, [[8], [8], []],
         ["float", "float", "Scalar"], [[1], [1], []], 0, None],
        ["cudaMemcpyAsync", t0 + 13_000, 15_000, host, "cuda_runtime", -1, 42, 0, None, None, None, 0, None],
        [KERNEL, t0 + 8_000, 3_000, 7, "kernel", 0, 41, 41, None, None, None, 0, META],
        ["Memcpy HtoD (Pageable -> Device)", t0 + 20_000, 4_000, 13, "gpu_memcpy", 0, 42, 42, None, None,
         None, 0, '"device": 0, "stream": 13, "bytes": 32'],
        ["orphan_kernel", t0 + 30_000, 1_000, 7, "kernel", 0, 99, 99, None, None, None, 0, None],
    ]]


def test_cuda_shaped_tasks_in_op_summary_and_timeline(tmp_path):
    from jobprof.plugin.clock import ClockAnchor
    from jobprof.plugin.timeline import Timeline
    from jobprof.plugin.values import Config, ExportContext, Iteration
    from jobprof.plugins.task_trace import summary, trace

    t0 = time.monotonic_ns()
    config = Config({"task_trace": "on", "output": "."})
    ctx = ExportContext(0, Iteration(1, t0 - 1_000, t0 + 40_000, "explicit"), 4242,
                        {"ops": cuda_records(t0)}, ClockAnchor.now(), config)
    rows = read_rows(summary.render_op_summary(ctx))
    assert [(r["Op Name"], r["OP Type"], r["Task Type"], r["Stream ID"], r["Task ID"], r["Block Dim"])
            for r in rows] == [
        (KERNEL, "fill_", "CUDA", "7", "1", "256"),
        ("Memcpy HtoD (Pageable -> Device)", "copy_", "MEMCPY", "13", "1", "N/A"),
        ("orphan_kernel", "orphan_kernel", "CUDA", "7", "2", "N/A"),
    ]
    # the kernel's inputs are its operator's; the orphan has no operator
    assert (rows[0]["Input Shapes"], rows[0]["Input Data Types"]) == ("64,32", "float32")
    assert rows[2]["Input Shapes"] == "N/A"
    assert [r["Task Wait Time(us)"] for r in rows] == ["0.000", "9.000", "6.000"]
    timeline = Timeline(ctx.pid)
    trace.add_to_master(ctx, timeline)
    path = tmp_path / "msprof.json"
    path.write_text(timeline.render())
    events = check_timeline(path)
    pids = processes(events)
    tasks = {e["name"]: e for e in events if e["ph"] == "X" and e["pid"] == pids["Ascend Hardware"]}
    launches = {e["name"]: e for e in events if e["ph"] == "X" and e["pid"] == pids["CANN"]}
    flows: dict[int, dict[str, dict]] = defaultdict(dict)
    for e in events:
        if e.get("cat") == "HostToDevice":
            flows[e["id"]][e["ph"]] = e
    pairs = {(p["s"]["ts"], p["f"]["tid"], p["f"]["ts"]) for p in flows.values()}
    # one flow per launched task, from the runtime call to the task; none for the orphan
    assert pairs == {(launches["cudaLaunchKernel"]["ts"], 7, tasks[KERNEL]["ts"]),
                     (launches["cudaMemcpyAsync"]["ts"], 13, tasks["Memcpy HtoD (Pageable -> Device)"]["ts"])}
    json_events = json.loads(trace.render_task_time_json(ctx))
    assert [e["name"] for e in json_events if e["ph"] == "X"] == [r["Op Name"] for r in rows]


def test_timeline_events_encode_the_same_with_or_without_orjson(tmp_path, monkeypatch):
    """The master timeline's operator events are encoded by orjson (events_text): the events
    read back the same as the standard library's encoding of them, and what orjson refuses (a
    lone surrogate in a name, an integer beyond 64 bits) is encoded by the standard library."""
    from jobprof.plugin import timeline

    t0 = time.monotonic_ns()
    events = [{"name": r[0], "pid": 7, "args": {"Input Dims": r[8]}, "tid": r[3], "ts": r[1] / 1000,
               "dur": r[2] / 1000, "ph": "X"} for r in cuda_records(t0)]
    fast = timeline.events_text(events)
    assert json.loads(f"[{fast}]") == events
    monkeypatch.setattr(timeline, "_orjson", lambda: None)
    assert json.loads(f"[{timeline.events_text(events)}]") == events
    monkeypatch.undo()
    odd = [{"name": "a\udcff", "id": 2**70}]
    assert timeline.events_text(odd) == json.dumps(odd, ensure_ascii=False)[1:-1]
    assert timeline.events_text([]) == ""
