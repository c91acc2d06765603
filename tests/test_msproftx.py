"""msproftx: user markers (jobprof.mstx), record_function capture and the msprof_tx files.

Real runs of one small training loop (torch.optim, so iterations are found by the optimizer
step) share module-scoped fixtures; the lane function, the recorder's hand-over, the NVTX and
record_function wrappers are also tested in-process.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import types
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import Runner, check_timeline, jobprof_cli, raw, read_csv
from jobprof import mstx
from jobprof.plugin.clock import ClockAnchor
from jobprof.plugin.lanes import LANE_STRIDE, assign_lanes
from jobprof.plugins.msproftx import capture
from jobprof.plugins.msproftx.recorder import DomainFilter, Recorder, clip
from jobprof.plugins.msproftx.writer import HEADER
from jobprof.runtime import _state

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

STEPS = 4
MAIN_TRUNCATED = "é" * 200  # 400 UTF-8 bytes
# A loop with markers on the main thread and on a worker thread that runs in lock-step with it
# (so each iteration's rows are known exactly): nested start/end and push/pop ranges, two
# partially overlapping ranges, a range handed to the worker to end, one crossing iterations
# 1 -> 3, a decorated function, record_function blocks, a truncated message, and a range and a
# push left open at exit.
MAIN = f"""
import json, os, sys, threading, time
import torch
from torch import nn
from jobprof import mstx

torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
io = mstx.domain("io")
go, done = threading.Event(), threading.Event()
handoff = []
out = {{"pid": os.getpid(), "main": threading.get_native_id()}}


def worker():
    out["worker"] = threading.get_native_id()
    while True:
        go.wait(); go.clear()
        if not handoff:
            return
        with io.range("load"):
            io.push("decode"); time.sleep(0.001); io.pop()
            io.mark("loaded")
        mstx.range_end(handoff.pop())  # started on the main thread
        done.set()


@mstx.range("decorated")
def helper():
    return 42


thread = threading.Thread(target=worker)
thread.start()
for i in range(1, {STEPS} + 1):
    if i == 1:
        out["across"] = mstx.range_start("across")
    x = torch.randn(4, 8)
    with mstx.range("compute"):
        mstx.push("forward")
        loss = model(x).pow(2).mean()
        mstx.pop()
        a = mstx.range_start("overlap A")
        b = mstx.range_start("overlap B")
        mstx.range_end(a)
        handoff.append(mstx.range_start("handoff"))
        go.set(); done.wait(); done.clear()
        mstx.range_end(b)
        with torch.profiler.record_function("my_block"):
            loss.backward()
        assert helper() == 42
    if i == 3:
        mstx.range_end(out["across"])
    mstx.mark(f"step {{i}}")
    if i == 2:
        mstx.mark({MAIN_TRUNCATED!r})
    opt.step()
    opt.zero_grad()
handoff.clear(); go.set(); thread.join()
out["open"] = mstx.range_start("never closed")
mstx.push("never popped")
mstx.range_end(987654)  # unknown id: ignored and counted
print(json.dumps(out))
"""

#: per iteration, the rows of the user's own domains: (message, event_type, domain, thread)
PER_ITERATION = Counter({
    ("compute", "start/end", "default", "main"): 1, ("forward", "push/pop", "default", "main"): 1,
    ("overlap A", "start/end", "default", "main"): 1, ("overlap B", "start/end", "default", "main"): 1,
    ("handoff", "start/end", "default", "main"): 1, ("decorated", "start/end", "default", "main"): 1,
    ("load", "start/end", "io", "worker"): 1, ("decode", "push/pop", "io", "worker"): 1,
    ("loaded", "marker", "io", "worker"): 1, ("my_block", "start/end", "record_function", "main"): 1,
})
OPTIMIZER_STEP = "Optimizer.step#SGD.step"


class Run:
    """One finished real run: the runner, its process and what the script printed."""

    def __init__(self, runner: Runner, proc) -> None:
        self.runner, self.proc = runner, proc
        self.out = json.loads(proc.stdout.strip().splitlines()[-1])

    @property
    def device_dir(self) -> Path:
        return self.runner.device_dir()

    def csv(self, iteration: int) -> Path:
        return self.device_dir / "summary" / f"msprof_tx_0_4294967295_{iteration}.csv"

    def rows(self, iteration: int) -> list[dict[str, str]]:
        return read_csv(self.csv(iteration))

    def json(self, iteration: int, name: str = "msprof_tx") -> Path:
        return self.device_dir / "timeline" / f"{name}_0_4294967295_{iteration}.json"

    def thread(self, tid: str) -> str:
        return {str(self.out["main"]): "main", str(self.out["worker"]): "worker"}.get(tid, tid)


def _run(tmp_path_factory, name: str, options: dict | None, **kwargs) -> Run:
    runner = Runner(tmp_path_factory.mktemp(name))
    return Run(runner, runner.run(MAIN, options, **kwargs))


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> Run:
    return _run(tmp_path_factory, "mstx", {"msproftx": "on", "training_trace": "on"})


#: the variants checked for what they leave out; run side by side (each is mostly torch's
#: import time, and nothing they check depends on timing)
VARIANTS = {
    "include": {"msproftx": "on", "mstx_domain_include": "io"},
    "exclude": {"msproftx": "on", "mstx_domain_exclude": "io, record_function"},
    "txoff": {"training_trace": "on", "task_trace": "off"},
}


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict[str, Run]:
    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        futures = {name: pool.submit(_run, tmp_path_factory, name, options)
                   for name, options in VARIANTS.items()}
        return {name: future.result() for name, future in futures.items()}


# -- the main run: CSV ---------------------------------------------------------------------
def test_csv_rows_per_iteration(main_run: Run) -> None:
    for k in range(1, STEPS + 1):
        text = main_run.csv(k).read_text()
        assert text.splitlines()[0].split(",") == HEADER
        rows = main_run.rows(k)
        got = Counter((r["message"], r["event_type"], r["domain"], main_run.thread(r["tid"]))
                      for r in rows)
        expected = PER_ITERATION + Counter({(f"step {k}", "marker", "default", "main"): 1})
        if k == 2:
            expected[("é" * 127, "marker", "default", "main")] = 1  # 254 bytes: cut at a character
        if k == 3:
            expected[("across", "start/end", "default", "main")] = 1
        if k > 1:  # torch's own blocks: the step of iteration k-1 ends after k-1's boundary
            expected[(OPTIMIZER_STEP, "start/end", "record_function", "main")] = 1
            expected[("Optimizer.zero_grad#SGD.zero_grad", "start/end", "record_function", "main")] = 1
        assert got == expected, k
        for r in rows:
            assert r["Device_id"] == "0" and r["pid"] == str(main_run.out["pid"])
            assert [r[c] for c in ("category", "payload_type", "payload_value", "Device Start_time(us)",
                                   "Device End_time(us)")] == ["N/A"] * 5
            assert r["message_type"] == "string"


def test_csv_times(main_run: Run) -> None:
    device_dir = main_run.device_dir
    begin = Decimal(json.loads((device_dir / "start_info.0").read_text())["collectionTimeBegin"])
    end = Decimal(json.loads((device_dir / "end_info.0").read_text())["collectionTimeEnd"])
    for k in range(1, STEPS + 1):
        rows = main_run.rows(k)
        starts = []
        for r in rows:
            assert r["Start_time(us)"].endswith("\t") and r["End_time(us)"].endswith("\t")
            s, e = Decimal(r["Start_time(us)"]), Decimal(r["End_time(us)"])
            assert begin <= s <= e <= end
            assert (s == e) == (r["event_type"] == "marker")
            starts.append(s)
        assert starts == sorted(starts)
        span = {r["message"]: (Decimal(r["Start_time(us)"]), Decimal(r["End_time(us)"])) for r in rows}
        for inner, outer in [("forward", "compute"), ("decode", "load"), ("my_block", "compute"),
                             ("load", "handoff"), ("decorated", "compute")]:
            assert span[outer][0] <= span[inner][0] <= span[inner][1] <= span[outer][1], (inner, outer)
        # the worker sleeps 1 ms inside decode
        assert span["decode"][1] - span["decode"][0] >= 1000


def test_range_crossing_iterations_keeps_true_start(main_run: Run) -> None:
    streams = raw(main_run.device_dir)
    across = [r for k, s in streams.items() for r in s.get("msproftx", []) if r["m"] == "across"]
    assert len(across) == 1 and across[0]["si"] == 1
    third = streams[3]
    assert across[0] in third["msproftx"]
    first = streams[1]["iteration"][0]
    assert across[0]["s"] < first["end_ns"] and third["iteration"][0]["start_ns"] < across[0]["e"]
    anchor = ClockAnchor.from_info(json.loads((main_run.device_dir / "start_info.0").read_text()))
    row = next(r for r in main_run.rows(3) if r["message"] == "across")
    assert row["Start_time(us)"] == anchor.stamp(across[0]["s"]) + "\t"
    event = next(e for e in json.loads(main_run.json(3).read_text()) if e["name"] == "across")
    assert event["args"]["Start Iteration"] == 1
    # torch's optimizer block contains the iteration boundary: stored where it ends, flagged
    for k in range(2, STEPS + 1):
        step = [r for r in streams[k]["msproftx"] if r["m"] == OPTIMIZER_STEP]
        assert [r["si"] for r in step] == [k - 1]


def test_range_ended_on_another_thread(main_run: Run) -> None:
    for k in range(1, STEPS + 1):
        records = [r for r in raw(main_run.device_dir)[k]["msproftx"] if r["m"] == "handoff"]
        assert [(r["t"], r["et"]) for r in records] == [(main_run.out["main"], main_run.out["worker"])]
        events = json.loads(main_run.json(k).read_text())
        handoff = next(e for e in events if e["name"] == "handoff")
        assert handoff["tid"] == main_run.out["main"]
        assert handoff["args"]["End Thread"] == main_run.out["worker"]


# -- the main run: timelines ---------------------------------------------------------------
def test_json_tracks_nest_and_overlaps_get_lanes(main_run: Run) -> None:
    main, worker = main_run.out["main"], main_run.out["worker"]
    for k in range(1, STEPS + 1):
        events = check_timeline(main_run.json(k))
        meta = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
        assert meta[("process_name", 0)] == {"name": "job.py"}
        assert meta[("process_labels", 0)] == {"labels": "CPU"}
        assert meta[("thread_name", main)] == {"name": f"Thread {main}"}
        assert meta[("thread_name", worker)] == {"name": f"Thread {worker}"}
        assert meta[("thread_name", main + LANE_STRIDE)] == {"name": f"Thread {main} (lane 1)"}
        x = {e["name"]: e for e in events if e["ph"] == "X"}
        assert x["overlap A"]["tid"] == main and x["overlap B"]["tid"] == main + LANE_STRIDE
        assert {x[n]["tid"] for n in ("load", "decode", "loaded")} == {worker}
        assert x[f"step {k}"]["dur"] == 0 and x[f"step {k}"]["args"]["event_type"] == "marker"
        assert x["forward"]["args"] == {"event_type": "push/pop", "domain": "default"}
        assert x["load"]["args"] == {"event_type": "start/end", "domain": "io"}
        assert len([e for e in events if e["ph"] == "X"]) == len(main_run.rows(k))


def test_master_timeline_holds_the_marker_tracks(main_run: Run) -> None:
    for k in range(1, STEPS + 1):
        master = check_timeline(main_run.json(k, "msprof"))
        own = json.loads(main_run.json(k).read_text())
        names = {e["pid"]: e["args"]["name"] for e in master if e["name"] == "process_name"}
        assert "job.py" in names.values() and "Ascend Hardware" in names.values()  # + step trace
        pid = next(p for p, n in names.items() if n == "job.py")
        x = lambda evs, p: sorted((e["name"], e["tid"], e["ts"], e["dur"])  # noqa: E731
                                  for e in evs if e["ph"] == "X" and e["pid"] == p)
        assert x(master, pid) == x(own, own[0]["pid"])
        threads = lambda evs, p: {(e["tid"], e["args"]["name"]) for e in evs  # noqa: E731
                                  if e["name"] == "thread_name" and e["pid"] == p}
        assert threads(master, pid) == threads(own, own[0]["pid"])


# -- the main run: messages ----------------------------------------------------------------
def test_truncation_warned_once(main_run: Run) -> None:
    lines = [ln for ln in main_run.proc.stderr.splitlines() if "truncated" in ln]
    assert len(lines) == 1 and lines[0].startswith("jobprof: warning: msproftx: a marker message longer")


def test_open_ranges_reported_at_exit(main_run: Run) -> None:
    line = next(ln for ln in main_run.proc.stderr.splitlines() if "still open at exit" in ln)
    main = main_run.out["main"]
    assert "1 range (range_start) and 1 push (push/pop) still open at exit" in line
    assert f"'never closed' (domain default, thread {main}, started " in line
    assert f"'never popped' (domain default, thread {main}, started " in line
    info = json.loads((main_run.device_dir / "info.json.0").read_text())
    assert line in info["jobprof"]["messages"]
    assert ("jobprof: warning: msproftx: 1 range_end call(s) with an unknown range id were ignored"
            in info["jobprof"]["messages"])
    # nothing else went wrong
    assert all(m.startswith("jobprof: warning: msproftx:") for m in info["jobprof"]["messages"])


def test_summary_section(main_run: Run) -> None:
    proc = jobprof_cli("summary", str(main_run.runner.out))
    assert proc.returncode == 0, proc.stderr
    assert "Markers (msproftx): top ranges by total time" in proc.stdout
    compute = next(ln for ln in proc.stdout.splitlines() if ln.startswith("compute "))
    assert compute.split()[1:3] == ["default", str(STEPS)]
    # mean, then median and p95 (a first call's warm-up moves the mean alone): within 1% of the
    # ranges' own durations in the msprof_tx files (kept in 2% buckets)
    header = next(ln for ln in proc.stdout.splitlines() if ln.lstrip().startswith("message "))
    assert "mean ms" in header and "median ms" in header and "p95 ms" in header
    durations = sorted((float(r["End_time(us)"]) - float(r["Start_time(us)"])) / 1000
                       for i in range(1, STEPS + 1) for r in read_csv(main_run.csv(i))
                       if r["message"] == "compute")
    assert len(durations) == STEPS
    mean, median, p95 = (float(v) for v in compute.split()[4:7])
    assert median == pytest.approx(statistics.median_low(durations), rel=0.011)  # nearest rank
    assert p95 == pytest.approx(durations[-1], rel=0.011)  # nearest rank of 4: the largest
    assert mean == pytest.approx(statistics.fmean(durations), abs=0.002)


def test_ranges_enclosing_an_iteration_end_leave_out_jobprofs_hand_over(main_run: Run) -> None:
    """"across" runs from iteration 1 to 3 and holds two iteration ends, each with jobprof's
    hand-over: the markers table gives its duration less that time (the job's), says so, and
    leaves a range without an iteration end (compute) as it was."""
    from jobprof.plugin import TxRecord, records_of

    streams = raw(main_run.device_dir)
    own = sorted(tuple(span) for it in streams.values() for span in it.get("profiler", ()))
    assert own, "the hand-over is recorded"
    tx = [r for it in streams.values() for r in records_of(it, TxRecord)]
    [across] = [r for r in tx if r.message == "across"]

    def inside(r) -> int:
        return sum(max(0, min(b, r.end_ns) - max(a, r.start_ns)) for a, b in own)

    assert inside(across) > 0
    summary = jobprof_cli("summary", "--json", str(main_run.runner.out))
    model = json.loads(summary.stdout)["sections"]["markers"]
    rows = {r[0]: r for r in model["rows"]}
    total = model["columns"].index("total_ms")
    wall = across.end_ns - across.start_ns
    assert rows["across"][total] == pytest.approx((wall - inside(across)) / 1e6, abs=0.0011)
    compute = [r for r in tx if r.message == "compute"]
    assert not any(inside(r) for r in compute)
    walls = sum(r.end_ns - r.start_ns for r in compute)
    assert rows["compute"][total] == pytest.approx(walls / 1e6, abs=0.0011)
    [note] = [n for n in model["notes"] if n.startswith("jobprof's own time taken out of")]
    affected = [r for r in tx if not r.is_marker and inside(r)]
    assert f"out of {len(affected)} range(s)" in note


def test_export_renders_the_same_files(main_run: Run) -> None:
    files = sorted(main_run.device_dir.glob("*/msprof*_4294967295_*"))
    before = {p: p.read_bytes() for p in files}
    for path in files:
        path.unlink()
    proc = jobprof_cli("export", str(main_run.device_dir.parent))
    assert proc.returncode == 0, proc.stderr
    assert {p: p.read_bytes() for p in files} == before


# -- domains -------------------------------------------------------------------------------
def jobprof_lines(stderr: str) -> str:
    """What jobprof printed (torch may warn on its own, e.g. without numpy installed)."""
    return "".join(line + "\n" for line in stderr.splitlines() if line.startswith("jobprof"))


def test_domain_include(variants: dict[str, Run]) -> None:
    include_run = variants["include"]
    for k in range(1, STEPS + 1):
        got = Counter((r["message"], r["domain"]) for r in include_run.rows(k))
        assert got == Counter({("load", "io"): 1, ("decode", "io"): 1, ("loaded", "io"): 1})
    # filtered calls are no-ops: no truncation, and the default-domain ranges are not "open"
    assert jobprof_lines(include_run.proc.stderr) == (
        "jobprof: warning: msproftx: 1 range_end call(s) with an unknown range id were ignored\n")
    assert include_run.out["across"] == 0 and include_run.out["open"] == 0


def test_domain_exclude(variants: dict[str, Run]) -> None:
    exclude_run = variants["exclude"]
    for k in range(1, STEPS + 1):
        assert {r["domain"] for r in exclude_run.rows(k)} == {"default"}
    assert "still open at exit" in exclude_run.proc.stderr


def test_include_and_exclude_together_is_an_options_error(runner: Runner) -> None:
    probe = ("from jobprof import mstx\nfrom jobprof.runtime import _state\n"
             "print(_state.SESSION is not None, mstx.range_start('x'))\n")
    proc = runner.run(probe, {"msproftx": "on", "mstx_domain_include": "io",
                              "mstx_domain_exclude": "default"})
    assert proc.stdout == "False 0\n"
    assert "jobprof: error: PROFILING_OPTIONS: 1 problem; the job runs unprofiled" in proc.stderr
    assert "mstx_domain_include" in proc.stderr and "mstx_domain_exclude" in proc.stderr
    assert runner.prof_dirs() == []
    check = jobprof_cli("check", "--options", json.dumps({"msproftx": "on", "mstx_domain_include": "a",
                                                          "mstx_domain_exclude": "b"}))
    assert check.returncode != 0 and "mstx_domain_exclude" in check.stdout + check.stderr
    # one of them set, the other empty: valid
    check = jobprof_cli("check", "--options", json.dumps({"msproftx": "on", "mstx_domain_include": "a",
                                                          "mstx_domain_exclude": ""}))
    assert check.returncode == 0, check.stdout + check.stderr


# -- off -----------------------------------------------------------------------------------
OFF = """
from jobprof.runtime import _state
from jobprof import mstx
ran = []

@mstx.range("decorated")
def helper(x):
    ran.append(x)
    return x * 2

with mstx.range("block"), mstx.domain("io").range("inner"):
    ran.append("block")
mstx.push("p"); mstx.mark("m"); mstx.pop(); mstx.range_end(mstx.range_start("r"))
print(_state.SESSION, mstx.range_start("x"), mstx.domain("io").range_start("y"), helper(21), ran)
"""


def test_profiling_off_api_still_runs_the_code(runner: Runner) -> None:
    proc = runner.run(OFF, {"msproftx": "on"}, mode=None)
    assert proc.stdout == "None 0 0 42 ['block', 21]\n" and jobprof_lines(proc.stderr) == ""
    assert not runner.out.exists()


def test_msproftx_off_writes_no_marker_files(variants: dict[str, Run]) -> None:
    run = variants["txoff"]
    files = {p.name.rsplit("_", 3)[0] for p in run.device_dir.rglob("*_4294967295_*")}
    assert files == {"step_trace", "msprof"}
    assert run.out["across"] == 0
    assert "msproftx" not in run.proc.stderr
    for path in (run.device_dir / "timeline").glob("msprof_*.json"):
        names = {e["args"]["name"] for e in check_timeline(path) if e["name"] == "process_name"}
        assert names == {"Ascend Hardware"}


# -- in-process: the API with no session ---------------------------------------------------
def test_api_without_session() -> None:
    assert _state.SESSION is None
    ran = []

    @mstx.range("f")
    def f(x):
        ran.append(x)
        return x * 2

    with mstx.range("block") as block:
        ran.append("block")
    assert isinstance(block, mstx.range)
    d = mstx.domain("io")
    assert f(2) == 4 and ran == ["block", 2]
    assert mstx.range_start("x") == 0 and d.range_start("x") == 0
    assert mstx.mark("m") is None and mstx.push("p") is None and mstx.pop() is None
    assert mstx.range_end(0) is None and mstx.range_end(12345) is None and d.range_end(7) is None
    assert d.mark(object()) is None and d.push("p") is None and d.pop() is None
    with d.range("r"):
        pass
    assert mstx.domain("").name == "default" and mstx.domain(3).name == "3"


# -- in-process: pure parts and the recorder -----------------------------------------------
@pytest.mark.parametrize(("spans", "lanes"), [
    ([], []),
    ([(0, 10), (2, 5), (5, 8)], [0, 0, 0]),  # nested, touching siblings
    ([(0, 10), (5, 15)], [0, 1]),  # partial overlap
    ([(0, 10), (5, 15), (8, 12), (9, 20), (12, 14)], [0, 1, 1, 2, 0]),  # lowest lane that nests
    ([(5, 15), (0, 10)], [1, 0]),  # input order does not matter
    ([(0, 10), (3, 3), (10, 10), (10, 12)], [0, 0, 0, 0]),  # marks inside and at the edges
    ([(0, 4), (1, 5), (2, 6), (3, 7)], [0, 1, 2, 3]),  # a staircase needs a lane per step
])
def test_assign_lanes(spans: list[tuple[int, int]], lanes: list[int]) -> None:
    assert assign_lanes(spans) == lanes
    by_lane: dict[int, list[tuple[int, int]]] = {}
    for span, lane in zip(spans, assign_lanes(spans), strict=True):
        by_lane.setdefault(lane, []).append(span)
    for group in by_lane.values():  # every pair nests or is disjoint
        for a in group:
            for b in group:
                assert a[1] <= b[0] or b[1] <= a[0] or (a[0] <= b[0] and b[1] <= a[1]) \
                    or (b[0] <= a[0] and a[1] <= b[1])


@pytest.mark.parametrize(("message", "expected", "cut"), [
    ("a" * 255, "a" * 255, False),
    ("a" * 256, "a" * 255, True),
    ("é" * 200, "é" * 127, True),  # 2-byte characters: 254 bytes, never half a character
    ("a" * 254 + "é", "a" * 254, True),
    ("€" * 85, "€" * 85, False),  # exactly 255 bytes
])
def test_clip(message: str, expected: str, cut: bool) -> None:
    assert clip(message) == (expected, cut)


def test_domain_filter() -> None:
    assert DomainFilter.from_options(" io , ,default", "").include == {"io", "default"}
    f = DomainFilter.from_options("", "record_function,nvtx")
    assert f.allows("default") and not f.allows("nvtx")
    assert not DomainFilter.from_options("io").allows("default")


def test_take_splits_a_burst_by_end_time() -> None:
    rec = Recorder()
    t0 = time.monotonic_ns()
    long = rec.range_start("default", "long")
    rec.mark("default", "in 1")
    t1 = time.monotonic_ns()
    rec.push("default", "p")
    rec.mark("default", "in 2")
    rec.range_end(long)
    rec.pop("default")
    t2 = time.monotonic_ns()
    rec.mark("default", "in 3")
    # iterations 1 and 2 delivered together, after iteration 3's marker was recorded
    first = rec.take(1, t0, t1)
    second = rec.take(2, t1, t2)
    assert [r["m"] for r in first] == ["in 1"]
    assert [(r["m"], r["k"], r.get("si")) for r in second] == [("in 2", "m", None), ("long", "r", 1),
                                                               ("p", "p", None)]
    assert [r["m"] for r in rec.take(3, t2, time.monotonic_ns())] == ["in 3"]
    assert rec.take(4, t2, time.monotonic_ns()) == []


def test_start_iteration_of_a_long_range_survives_trimming() -> None:
    rec = Recorder(keep_ends=4)
    rec.take(1, 0, time.monotonic_ns())
    long = rec.range_start("default", "long")  # starts in iteration 2
    for k in range(2, 40):
        t = time.monotonic_ns()
        rec.push("default", "short")
        rec.pop("default")
        assert [r["m"] for r in rec.take(k, t, time.monotonic_ns())] == ["short"]
    assert len(rec._ends) == 38  # the open range keeps every end since its start
    t = time.monotonic_ns()
    rec.range_end(long)
    assert [(r["m"], r["si"]) for r in rec.take(40, t, time.monotonic_ns())] == [("long", 2)]
    for k in range(41, 120):  # nothing open: trimmed back (the threshold doubled meanwhile)
        rec.take(k, time.monotonic_ns(), time.monotonic_ns())
    assert len(rec._ends) <= 2 * 4


def test_recorder_never_raises_and_counts() -> None:
    warnings: list[str] = []
    rec = Recorder(origin_ns=time.monotonic_ns(), warn=warnings.append)

    class Bad:
        def __str__(self) -> str:
            raise ValueError("no")

    rec.mark("default", Bad())
    rec.range_end([1])  # unhashable
    rec.range_end(42)
    rec.range_end(0)  # "not recorded": not counted
    rec.pop("default")
    rec.mark("default", 12)
    rec.mark("default", "x" * 300)
    rec.mark("default", "y" * 300)
    records = rec.take(1, 0, time.monotonic_ns())
    assert [r["m"] for r in records] == ["<unprintable Bad>", "12", "x" * 255, "y" * 255]
    assert len(warnings) == 1 and "truncated" in warnings[0]
    rid = rec.range_start("default", "open")
    assert rid > 0
    notes = list(rec.exit_notes())
    assert notes[0].startswith("msproftx: 1 range (range_start) still open at exit")
    assert "2 range_end call(s) with an unknown range id" in notes[1]
    assert "1 pop call(s) without an open push" in notes[2]
    rec.close()
    assert rec.range_start("default", "late") == 0


def test_queue_is_bounded_and_drops_are_counted() -> None:
    rec = Recorder(max_pending=5)
    for i in range(7):
        rec.mark("default", str(i))
    ids = [rec.range_start("default", "r") for _ in range(2)]
    for range_id in ids:
        rec.range_end(range_id)
    assert [r["m"] for r in rec.take(1, 0, time.monotonic_ns())] == ["0", "1", "2", "3", "4"]
    assert rec.dropped == 4 and "4 marker(s) were not recorded" in next(iter(rec.exit_notes()))
    rec.mark("default", "after")  # room again once an iteration took the queue
    assert [r["m"] for r in rec.take(2, 0, time.monotonic_ns())] == ["after"]


def test_threads_end_each_others_ranges() -> None:
    rec = Recorder()
    ids = [rec.range_start("default", f"r{i}") for i in range(200)]
    workers = [threading.Thread(target=lambda part=ids[i::4]: [rec.range_end(r) for r in part])
               for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    records = rec.take(1, 0, time.monotonic_ns())
    assert sorted(r["m"] for r in records) == sorted(f"r{i}" for i in range(200))
    assert all(r["et"] != r["t"] for r in records) and not rec.still_open()


def test_record_function_capture_in_process() -> None:
    import torch

    rec = Recorder()
    restores: list = []
    cls = torch.autograd.profiler.record_function
    enter, exit_ = cls.__dict__["__enter__"], cls.__dict__["__exit__"]
    capture.install(rec, torch, restores, cuda=False)
    try:
        @torch.profiler.record_function("deco")
        def recurse(n):
            return 0 if n == 0 else 1 + recurse(n - 1)

        with torch.autograd.profiler.record_function("outer"):
            assert recurse(2) == 2
        with pytest.raises(KeyError), torch.profiler.record_function("raising"):
            raise KeyError("x")
    finally:
        for restore in restores:
            restore()
    assert cls.__dict__["__enter__"] is enter and cls.__dict__["__exit__"] is exit_
    records = rec.take(1, 0, time.monotonic_ns())
    assert {r["d"] for r in records} == {"record_function"} and not rec.still_open()
    spans = sorted((r["s"], -r["e"], r["m"]) for r in records)
    assert [m for _, _, m in spans] == ["outer", "deco", "deco", "deco", "raising"]
    deco = [(s, -e) for s, e, m in spans if m == "deco"]
    assert deco[0][0] <= deco[1][0] <= deco[2][0] <= deco[2][1] <= deco[1][1] <= deco[0][1]


def test_nvtx_capture_with_a_stand_in_module() -> None:
    """The CUDA path, on a stand-in for torch.cuda.nvtx (no GPU here): originals still called."""
    calls: list[tuple] = []
    fake = types.SimpleNamespace(
        range_push=lambda msg: calls.append(("push", msg)) or 0,
        range_pop=lambda: calls.append(("pop",)) or 0,
        range_start=lambda msg: calls.append(("start", msg)) or 1000 + len(calls),
        range_end=lambda handle: calls.append(("end", handle)),
        mark=lambda msg: calls.append(("mark", msg)),
    )
    originals = dict(vars(fake))
    rec = Recorder()
    restores: list = []
    import torch

    capture.install(rec, types.SimpleNamespace(autograd=torch.autograd), restores, cuda=True,
                    nvtx_module=fake)
    try:
        assert fake.range_push("outer") == 0
        handle = fake.range_start("cross")
        fake.mark("m")
        assert fake.range_pop() == 0
        fake.range_end(handle)
        fake.range_end(99)  # not ours: passed through, nothing recorded
    finally:
        for restore in restores:
            restore()
    assert vars(fake) == originals
    assert calls == [("push", "outer"), ("start", "cross"), ("mark", "m"), ("pop",), ("end", handle),
                     ("end", 99)]
    records = rec.take(1, 0, time.monotonic_ns())
    assert sorted((r["m"], r["k"], r["d"]) for r in records) == [
        ("cross", "r", "nvtx"), ("m", "m", "nvtx"), ("outer", "p", "nvtx")]
    assert rec.unknown_ends == 0


def test_nvtx_not_installed_without_cuda_or_when_filtered() -> None:
    fake = types.SimpleNamespace(**{n: (lambda *a: None) for n in capture.NVTX_CALLS})
    before = dict(vars(fake))
    restores: list = []
    torchish = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    # filtered out (and record_function too: torchish has no autograd to patch)
    capture.install(Recorder(DomainFilter.from_options("default")), torchish, restores, cuda=True,
                    nvtx_module=fake)
    # allowed, but torch.cuda.is_available() says no
    capture.install(Recorder(DomainFilter.from_options("nvtx")), torchish, restores, nvtx_module=fake)
    assert vars(fake) == before and restores == []
