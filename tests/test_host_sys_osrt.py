"""host_sys osrt: real perf runs on a real child process (tests/… skip only where perf cannot run)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobprof.plugin import ClockAnchor, Config, ExportContext, Iteration, Timeline
from jobprof.plugins.host_sys import osrt
from jobprof.plugins.host_sys.osrt import (
    HEADER,
    OSRT_STREAM,
    OsrtError,
    OsrtTracer,
    SyscallRecord,
    add_to_master,
    render_os_runtime_statistic,
)

SLEEPS, STATS = 6, 9
#: waits until the test says the tracer runs (a line on stdin), then stamps each call on its own
#: clock
CHILD = f"""
import os, sys, time
sys.stdin.readline()
for _ in range({SLEEPS}):
    a = time.monotonic_ns(); time.sleep(0.05); b = time.monotonic_ns(); print("sleep", a, b, flush=True)
for _ in range({STATS}):
    a = time.monotonic_ns(); os.stat("/"); b = time.monotonic_ns(); print("stat", a, b, flush=True)
print("pid", os.getpid(), flush=True)
"""

needs_perf = pytest.mark.skipif(osrt.available() is not None, reason=f"perf cannot run: {osrt.available()}")


Stamps = dict[str, list[tuple[int, int]]]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[SyscallRecord], Stamps]:
    folder = tmp_path_factory.mktemp("osrt")
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    tracer = OsrtTracer()
    try:
        tracer.start(child.pid, folder)
        out = child.communicate("go\n", timeout=60)[0]
        end = time.monotonic_ns()
        calls = tracer.take(0, end)
    finally:
        tracer.stop()
        child.kill()
    assert tracer.notes == []
    assert not any(folder.iterdir()), "the tracer leaves no perf data behind"
    stamps: dict[str, list[tuple[int, int]]] = {"sleep": [], "stat": []}
    for line in out.splitlines():
        kind, *values = line.split()
        if kind in stamps:
            stamps[kind].append((int(values[0]), int(values[1])))
    stamps["pid"] = [(child.pid, child.pid)]
    return calls, stamps


def _matching(calls: list[SyscallRecord], name: str, spans: list[tuple[int, int]]) -> list[SyscallRecord]:
    """The call of ``name`` inside each span the program stamped around it (one each: the clocks
    are the same, so the program's stamps enclose the kernel's)."""
    found = []
    for a, b in spans:
        inside = [c for c in calls if c.name == name and a <= c.start_ns <= c.end_ns <= b]
        assert len(inside) == 1, (name, a, b, inside)
        found.append(inside[0])
    return found


@needs_perf
def test_sleeps_counted_timed_and_aligned(traced):
    calls, stamps = traced
    sleeps = [c for c in calls if c.name == "clock_nanosleep"]
    assert len(sleeps) == SLEEPS  # the startup sleep was running when perf attached: not a call
    matched = _matching(calls, "clock_nanosleep", stamps["sleep"])
    for call, (a, b) in zip(matched, stamps["sleep"], strict=True):
        assert abs(call.dur_ns - 50_000_000) < 3_000_000
        # the same clock: the call lies within the program's own stamps, within 2 ms
        assert a - 2_000_000 <= call.start_ns and call.end_ns <= b + 2_000_000
        assert abs(call.start_ns - a) < 2_000_000 and abs(b - call.end_ns) < 2_000_000
        assert call.pid == call.tid == stamps["pid"][0][0]


@needs_perf
def test_stats_counted_and_aligned(traced):
    calls, stamps = traced
    stats = _matching(calls, "newfstatat" if any(c.name == "newfstatat" for c in calls) else "statx",
                      stamps["stat"])
    assert len(stats) == STATS
    for call, (a, b) in zip(stats, stamps["stat"], strict=True):
        assert a - 2_000_000 <= call.start_ns <= call.end_ns <= b + 2_000_000


@needs_perf
def test_csv_from_the_traced_calls(traced):
    calls, _ = traced
    anchor = ClockAnchor.now()
    raw = [list(c) for c in calls]  # as the stream stores them
    ctx = ExportContext(0, Iteration(1, 0, time.monotonic_ns(), "explicit"), os.getpid(),
                        {OSRT_STREAM: json.loads(json.dumps(raw))}, anchor, Config({"output": "."}))
    text = render_os_runtime_statistic(ctx)
    assert text is not None
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == HEADER
    sleep_rows = [r for r in rows[1:] if r[3] == "clock_nanosleep"]
    assert len(sleep_rows) == 1
    durs = [c.dur_ns for c in calls if c.name == "clock_nanosleep"]
    row = dict(zip(HEADER, sleep_rows[0], strict=True))
    # the device folder's id, as every host_sys file of the rank (msprof's own host folder says "host")
    assert row["Device_id"] == "0" and int(row["Count"]) == len(durs) == SLEEPS
    assert float(row["Time(us)"]) == pytest.approx(sum(durs) / 1000, abs=0.001)
    assert float(row["Avg(us)"]) == pytest.approx(sum(durs) / len(durs) / 1000, abs=0.001)
    assert float(row["Max(us)"]) == pytest.approx(max(durs) / 1000, abs=0.001)
    assert float(row["Min(us)"]) == pytest.approx(min(durs) / 1000, abs=0.001)
    for key in {(r[1], r[2]) for r in rows[1:]}:  # a thread's shares add up to 100
        assert sum(float(r[4]) for r in rows[1:] if (r[1], r[2]) == key) == pytest.approx(100, abs=0.1)


def test_statistic_rows_and_timeline_from_known_records():
    t0 = time.monotonic_ns()
    calls = [SyscallRecord("futex", t0, 3_000, 10, 11), SyscallRecord("futex", t0 + 10_000, 1_000, 10, 11),
             SyscallRecord("read", t0 + 20_000, 4_000, 10, 11), SyscallRecord("read", t0, 500, 10, 12)]
    rows = osrt.statistic_rows(calls)
    assert rows == [
        ["host", 10, 11, "futex", "50.00", "4.000", 2, "2.000", "3.000", "1.000"],
        ["host", 10, 11, "read", "50.00", "4.000", 1, "4.000", "4.000", "4.000"],
        ["host", 10, 12, "read", "100.00", "0.500", 1, "0.500", "0.500", "0.500"],
    ]
    ctx = ExportContext(0, Iteration(1, t0, t0 + 30_000, "explicit"), 10,
                        {OSRT_STREAM: [list(c) for c in calls]}, ClockAnchor.now(),
                        Config({"output": ".", "timeline_max_events": 3}))
    timeline = Timeline(10)
    add_to_master(ctx, timeline)
    spans = [e for e in timeline.events if e["ph"] == "X"]
    assert len(spans) == 3 and ctx.notes and "capped at 3" in ctx.notes[0]
    names = [m["args"]["name"] for m in timeline.metadata if m["name"] == "process_name"]
    assert names == [osrt.LAYER]


def test_no_stream_no_file():
    ctx = ExportContext(0, Iteration(1, 0, 1, "explicit"), 1, {}, ClockAnchor.now(), None)
    assert render_os_runtime_statistic(ctx) is None


def test_unavailable_gives_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(osrt.PERF_ENV, str(tmp_path / "no-such-perf"))
    reason = osrt.available()
    assert reason is not None and "perf not found" in reason and "install" in reason
    assert OsrtTracer.available() == reason
    with pytest.raises(OsrtError, match="perf not found"):
        OsrtTracer().start(os.getpid(), tmp_path)


@needs_perf
def test_refuses_a_linked_folder(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(OsrtError, match="link"):
        OsrtTracer().start(os.getpid(), link)
    assert not any(Path(real).iterdir())


JOB = """
import time, torch
from torch import nn
time.sleep(0.6)  # the tracer attaches off the training thread (~0.25 s): calls before are not traced
m = nn.Linear(8, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(5):
    for _ in range(step + 1):
        time.sleep(0.02)
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""
OSRT_OPTIONS = {"training_trace": "on", "task_trace": "off", "host_sys": "osrt", "export": "inline"}


def _osrt_files(device: Path) -> dict[int, Path]:
    return {int(p.stem.rsplit("_", 1)[1]): p for p in (device / "summary").glob("os_runtime_statistic_*.csv")}


@needs_perf
def test_a_profiled_job_has_its_sleeps_in_each_iteration(tmp_path):
    """The plugin's whole path: perf started by the job, each iteration's calls in its file (the
    job's own sleeps: 1, 2, ... per iteration on its main thread) and in the OS Runtime API layer;
    the tracer's own converting work is not the job's."""
    from conftest import Runner, check_timeline

    runner = Runner(tmp_path)
    proc = runner.run(runner.script(JOB), OSRT_OPTIONS, timeout=120)
    device = runner.device_dir()
    files = _osrt_files(device)
    assert sorted(files) == [1, 2, 3, 4, 5], sorted(files)
    info = json.loads(next(p for p in device.glob("info.json.*") if not p.name.endswith(".done")).read_text())
    pid = int(info["pid"])
    for index in range(2, 6):  # iteration 1 begins at the first forward, after its sleeps
        rows = list(csv.DictReader(files[index].open()))
        sleeps = [r for r in rows if r["Name"] == "clock_nanosleep" and int(r["Thread ID"]) == pid]
        assert len(sleeps) == 1 and int(sleeps[0]["Count"]) == index, (index, rows)
        assert 18_000 <= float(sleeps[0]["Avg(us)"]) <= 40_000, sleeps
        assert {int(r["Process ID"]) for r in rows} == {pid}, rows  # no `perf script` among them
        events = check_timeline(device / "timeline" / files[index].name.replace(
            "os_runtime_statistic", "msprof").replace(".csv", ".json"))
        layer = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
                 and e["args"]["name"] == "OS Runtime API"}
        drawn = [e for e in events if e["ph"] == "X" and e["pid"] in layer and e["name"] == "clock_nanosleep"]
        assert len(drawn) >= index, (index, len(drawn))
    assert info["jobprof"]["host_sys_osrt"]["collected"] is True
    assert "osrt" not in proc.stderr


def test_where_perf_cannot_run_it_is_said_once_and_no_file(tmp_path):
    from conftest import Runner

    runner = Runner(tmp_path)
    proc = runner.run(runner.script(JOB), OSRT_OPTIONS, env={"JOBPROF_OSRT_PERF": "/nonexistent/perf"},
                      timeout=120)
    device = runner.device_dir()
    assert not _osrt_files(device)
    said = [line for line in proc.stderr.splitlines() if "osrt" in line]
    assert len(said) == 1 and "not collected" in said[0] and "perf" in said[0], proc.stderr
    info = json.loads(next(p for p in device.glob("info.json.*") if not p.name.endswith(".done")).read_text())
    assert info["jobprof"]["host_sys_osrt"]["collected"] is False
    assert "perf" in info["jobprof"]["host_sys_osrt"]["reason"]


THREADED = """
import threading, time, torch
from torch import nn
done = threading.Event()
helper = threading.Thread(target=done.wait)  # alive when perf attaches, ends mid-run
helper.start()
time.sleep(0.8)
m = nn.Linear(8, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(8):
    if step == 2:
        done.set()
        helper.join()
    time.sleep(0.25)
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@needs_perf
def test_perf_does_not_spin_when_a_traced_thread_ends(tmp_path):
    """perf 6.1's `record -p` spins a whole core once a thread that existed at its attach ends:
    the tracer sees it, attaches again, and the job's calls after that are still traced."""
    from conftest import Runner

    runner = Runner(tmp_path)
    runner.run(runner.script(THREADED), OSRT_OPTIONS, timeout=120)
    device = runner.device_dir()
    info = json.loads(next(p for p in device.glob("info.json.*") if not p.name.endswith(".done")).read_text())
    osrt_info = info["jobprof"]["host_sys_osrt"]
    # the job ran ~2.8 s: a spinning perf would have used about that much CPU
    assert osrt_info["perf_cpu_s"] < 1.2, osrt_info
    files = _osrt_files(device)
    pid = int(info["pid"])
    late = [i for i in files if i >= 6]
    assert late, sorted(files)
    for index in late:
        rows = list(csv.DictReader(files[index].open()))
        assert any(r["Name"] == "clock_nanosleep" and int(r["Thread ID"]) == pid for r in rows), (index, rows)
