"""The core's operator capture on real jobs: every iteration gets exactly its operators, in
every iteration-finding mode, across record_function blocks that span the cut, with forked
DataLoader workers, and when the program starts torch.profiler itself."""

from __future__ import annotations

import json

import pytest

from conftest import Runner, raw

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

JOB = """
import sys
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
a, b = torch.randn(24, 12), torch.randn(12, 8)
MODE = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8

def work():
    out = model(torch.randn(8, 16)).sum()
    for _ in range(3):  # ground truth: exactly three mm per iteration, after the forward
        torch.mm(a, b)
    for _ in range(2):  # and two cumsum, an operator the model itself never runs
        torch.cumsum(a, 0)
    return out

if MODE == "optimizer":
    for i in range(N):
        opt.zero_grad()
        work().backward()
        opt.step()
elif MODE == "backward":  # no optimizer: iterations found from backward(), confirmed in bursts
    for i in range(N):
        work().backward()
elif MODE == "wrapped":  # record_function blocks open across every iteration end
    with torch.autograd.profiler.record_function("whole-loop"):
        for i in range(N):
            with torch.profiler.record_function("one-step"):
                opt.zero_grad()
                work().backward()
                opt.step()
elif MODE == "user-profiler":  # the program profiles iterations 4-5 itself
    # a block open as it does: continued under the program's session (it sees the block end)
    outer = torch.autograd.profiler.record_function("around-user-profiler")
    outer.__enter__()
    for i in range(N):
        if i == 3:
            prof = torch.profiler.profile(record_shapes=True)
            prof.__enter__()
        opt.zero_grad()
        work().backward()
        opt.step()
        if i == 4:
            outer.__exit__(None, None, None)
            prof.__exit__(None, None, None)
            names = {e.key for e in prof.key_averages()}
            assert "aten::mm" in names and "around-user-profiler" in names, names
            print("USER-PROFILER-OK")
"""


def _mm_counts(device_dir) -> dict[int, int]:
    return {i: sum(1 for r in s.get("ops", []) if r.name == "aten::mm" and r.shapes == [[24, 12], [12, 8]])
            for i, s in raw(device_dir).items()}


def _jobprof_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "jobprof" in line]


@pytest.mark.parametrize("mode", ["optimizer", "backward"])
def test_every_iteration_gets_exactly_its_operators(runner: Runner, mode: str) -> None:
    proc = runner.run(JOB, {"task_trace": "on"}, args=[mode, "8"])
    assert "USDT" not in proc.stderr, "Kineto's session log must not reach the job's stderr"
    streams = raw(runner.device_dir())
    counts = _mm_counts(runner.device_dir())
    # backward mode confirms its iterations in bursts, the last one at exit: all 8 are there
    assert sorted(counts) == list(range(1, 9)), counts
    # iteration 1 starts at the first forward: its three mm follow it, like every later one
    assert set(counts.values()) == {3}, counts
    for index, s in streams.items():
        it = s["iteration"][0]
        starts = [r.start for r in s["ops"]]
        assert starts == sorted(starts)
        assert it["start_ns"] <= starts[0] and starts[-1] < it["end_ns"], index


def test_l0_records_no_shapes(runner: Runner) -> None:
    runner.run(JOB, {"task_trace": "l0"}, args=["optimizer", "4"])
    ops = [r for s in raw(runner.device_dir()).values() for r in s["ops"]]
    assert ops and all(r.shapes is None for r in ops)
    assert sum(r.name == "aten::cumsum" for r in ops) == 8


def test_blocks_open_across_the_cut_are_split_not_crashed(runner: Runner) -> None:
    runner.run(JOB, {"task_trace": "on"}, args=["wrapped", "6"])
    streams = raw(runner.device_dir())
    assert set(_mm_counts(runner.device_dir()).values()) == {3}
    for index, s in streams.items():
        blocks = {r.name for r in s["ops"] if r.kind == "user_annotation"}
        # the loop-wide block is carried into every window as a piece of its own
        assert "whole-loop" in blocks, (index, blocks)
        assert "one-step" in blocks, (index, blocks)


def test_program_starting_torch_profiler_wins(runner: Runner) -> None:
    proc = runner.run(JOB, {"task_trace": "on"}, args=["user-profiler", "8"])
    assert "USER-PROFILER-OK" in proc.stdout
    notes = _jobprof_lines(proc.stderr)
    assert any("torch.profiler" in line and "gave way" in line for line in notes), proc.stderr
    counts = _mm_counts(runner.device_dir())
    # iterations 1-3 have their operators; from the program's profiler on, none
    assert [counts[i] for i in (1, 2, 3)] == [3, 3, 3]
    assert all(counts.get(i, 0) == 0 for i in range(4, 9)), counts
    assert sorted(raw(runner.device_dir())) == list(range(1, 9))  # the step trace carries on


def test_profiler_already_running_at_first_forward(runner: Runner) -> None:
    job = """
    import torch
    from torch import nn
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile() as prof:
        for i in range(4):
            opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
    print("EVENTS", len(prof.events()))
    """
    proc = runner.run(job, {"task_trace": "on", "training_trace": "on"})
    assert int(proc.stdout.split("EVENTS")[1]) > 0
    assert any("already running" in line for line in _jobprof_lines(proc.stderr)), proc.stderr
    assert all("ops" not in s for s in raw(runner.device_dir()).values())


def test_forked_dataloader_workers_with_capture(runner: Runner) -> None:
    job = """
    import os, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(ds, batch_size=8, num_workers=2,
                        multiprocessing_context="fork", persistent_workers=True)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
    print("DONE", os.getpid())
    """
    proc = runner.run(job, {"task_trace": "on", "training_trace": "on"})
    assert "DONE" in proc.stdout
    streams = raw(runner.device_dir())
    assert len(streams) == 16
    assert all(any(r.name == "aten::addmm" for r in s["ops"]) for s in streams.values())
    assert len(list(runner.prof_dirs()[0].glob("device_*"))) == 1


def test_info_records_nothing_when_capture_is_off(runner: Runner) -> None:
    runner.run(JOB, {"task_trace": "off", "training_trace": "on"}, args=["optimizer", "3"])
    assert all("ops" not in s for s in raw(runner.device_dir()).values())
    info = json.loads((runner.device_dir() / "info.json.0").read_text())
    assert "task_trace" not in info["jobprof"]["plugins"]


# what both jobs below share: the model, and the job's own cleanup taking jobprof's window
# folder, a file taking its place
BROKEN_WINDOWS_JOB = """
import glob, os, shutil, sys, threading, time
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def take_the_window_folder():
    [kineto] = glob.glob(os.path.join(sys.argv[1], "PROF_*", "device_0", "data", "kineto"))
    shutil.rmtree(kineto)
    open(kineto, "w").close()
"""

BREAKS_WINDOWS = BROKEN_WINDOWS_JOB + """
for i in range(10):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    if i == 4:
        time.sleep(0.3)  # the sink has written the first windows
        take_the_window_folder()
print("DONE")
"""


def test_a_broken_operator_capture_is_said_once_and_listed_as_missing(runner: Runner) -> None:
    """Every later window fails to be saved: one warning (not one per iteration), the step tier
    goes on to the last iteration, and `jobprof summary` lists the capture under Missing."""
    from conftest import jobprof_cli

    proc = runner.run(BREAKS_WINDOWS, {"task_trace": "on", "training_trace": "on"}, args=[str(runner.out)])
    assert "DONE" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("jobprof:")]
    stopped = [line for line in lines if "operator capture stopped" in line]
    assert len(stopped) == 1 and len(lines) == 1, proc.stderr
    device = runner.device_dir()
    assert len(list((device / "summary").glob("step_trace_*.csv"))) == 10
    assert 0 < len(list((device / "summary").glob("op_summary_*.csv"))) < 10
    info = json.loads((device / "info.json.0").read_text())["jobprof"]
    [disabled] = info["disabled"]
    assert disabled["what"] == "operator capture" and isinstance(disabled["iteration"], int)
    summary = jobprof_cli("summary", str(runner.out))
    assert summary.returncode == 0, summary.stderr
    missing = summary.stdout.split("\nMissing\n", 1)[1]
    assert f"operator capture was disabled from iteration {disabled['iteration']} on every rank" in missing


BREAKS_AT_EXIT = BROKEN_WINDOWS_JOB + """
from jobprof.runtime import sink as sink_module

slow, inside = threading.Event(), threading.Event()
original = sink_module.Sink._flush_raw


def flush_raw(self):
    # the exporting thread is mid-flush as the program returns (a loaded machine's timing)
    if slow.is_set() and threading.current_thread().name == "jobprof-sink":
        inside.set()
        time.sleep(0.5)
    return original(self)


sink_module.Sink._flush_raw = flush_raw
for i in range(10):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    if i == 9:  # the last iteration's window cannot be saved, found by that flush
        time.sleep(0.3)
        slow.set()
        inside.wait(10)
        take_the_window_folder()
    opt.step()
print("DONE")
"""


def test_a_capture_broken_while_the_job_ends_does_not_hang_it(runner: Runner) -> None:
    """The exporting thread finds the broken capture while the training thread ends the session
    (CI run 72, 2.14.1 leg: the job hung after its last line): the failure is said once, the job
    ends, the step tier has every iteration.  It hung for ever when the failure took the
    session's lock, which the ending thread held while it waited for the exporting thread."""
    proc = runner.run(BREAKS_AT_EXIT, {"task_trace": "on", "training_trace": "on"}, args=[str(runner.out)],
                      timeout=60)
    assert "DONE" in proc.stdout
    stopped = [line for line in proc.stderr.splitlines() if "operator capture stopped" in line]
    assert len(stopped) == 1 and "iteration 10 " in stopped[0], proc.stderr
    device = runner.device_dir()
    assert len(list((device / "summary").glob("step_trace_*.csv"))) == 10
    [disabled] = json.loads((device / "info.json.0").read_text())["jobprof"]["disabled"]
    assert disabled["what"] == "operator capture" and disabled["iteration"] == 10


def test_the_window_offset_ignores_a_preemption_between_the_clock_reads(monkeypatch) -> None:
    """Kineto stamps the wall clock, every other stream the monotonic one: the offset taken at
    each cut maps a whole window.  A thread preempted between the two reads (tens of us on a
    loaded CI machine) shifted every operator of that window off its counter records (CI run
    of stop 45, torch 2.9.1 leg); the tightest of several bracketed samples is used instead."""
    from jobprof.plugin import clock

    true_offset = 1_700_000_000_000_000_000
    now = [5_000_000]
    # (monotonic before, wall, monotonic after) gaps: the first sample preempted for 40 us
    delays = iter([40_000, 300, 250, 260, 400, 350, 270, 280, 290, 300])

    def monotonic_ns() -> int:
        now[0] += 100
        return now[0]

    def time_ns() -> int:
        now[0] += next(delays)  # the thread sleeps before the wall read
        return now[0] + true_offset

    monkeypatch.setattr(clock.time, "monotonic_ns", monotonic_ns)
    monkeypatch.setattr(clock.time, "time_ns", time_ns)
    offset = clock.wall_minus_monotonic_ns()
    # the chosen bracket is 100 + 250 + 100 ns wide: its midpoint is within half of it
    assert abs(offset - true_offset) <= 225
