"""Job shapes the profiled program must survive as it does unprofiled, and that jobprof's
commands must read: processes the job forks or spawns itself (issue 29)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli, raw_iterations

pytestmark = pytest.mark.torch_versions

# A child forked after the operator capture started (Kineto's config thread runs in the
# parent), which ends through exit(): sys.exit with a status, C-level stdio output pending
# (stdout is a pipe, so printf's buffer is flushed only at exit), or the end of an exception.
FORKING_JOB = """
import ctypes, os, sys, torch

libc = ctypes.CDLL(None)
model = torch.nn.Linear(8, 8)
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()

def child(how):
    pid = os.fork()
    if pid == 0:
        print("child", how, flush=True)
        libc.printf(b"c-level output of %s\\n", how.encode())
        if how == "exit":
            sys.exit(3)
        if how == "raise":
            raise RuntimeError("the child fails")
        model(torch.randn(4, 8)).sum().backward()  # falls off the end of the script
        return False
    _, status = os.waitpid(pid, 0)
    print("parent saw", how, os.waitstatus_to_exitcode(status), flush=True)
    return True

for how in ("exit", "raise", "end"):
    if not child(how):
        break
else:
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
    print("parent done")
"""


def test_a_forked_child_that_exits_ends_as_it_does_unprofiled(runner: Runner) -> None:
    script = runner.script(FORKING_JOB)
    plain = runner.run(script, mode=None, timeout=120)
    # before the fix the first child hung in Kineto's exit-time destructor, and the parent with it
    profiled = runner.run(script, {"training_trace": "on", "task_trace": "on"}, timeout=120)
    assert "parent saw exit 3" in plain.stdout and "parent done" in plain.stdout
    assert "c-level output of exit" in plain.stdout
    assert sorted(profiled.stdout.splitlines()) == sorted(plain.stdout.splitlines())
    assert profiled.returncode == plain.returncode == 0
    # the failing child's traceback, once, as unprofiled
    assert profiled.stderr.count("RuntimeError: the child fails") == 1
    assert "jobprof: warning" not in profiled.stderr and "jobprof: error" not in profiled.stderr
    # the parent's profile is whole: its five iterations, none of the children's
    steps = list(runner.device_dir().glob("summary/step_trace_0_*.csv"))
    assert len(steps) >= 4, sorted(p.name for p in steps)


# A parent that trains, then spawns two torch processes that train on their own (no process
# group): three processes profiled, with different iteration counts.
SPAWNING_JOB = """
import torch
import torch.multiprocessing as mp

def train(steps):
    model = torch.nn.Linear(8, 8)
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()

def child(index):
    train(3)

if __name__ == "__main__":
    train(2)
    mp.spawn(child, nprocs=2)
    print("done")
"""


def test_summary_and_report_of_a_parent_with_spawned_children(runner: Runner, tmp_path: Path) -> None:
    runner.run(SPAWNING_JOB, {"training_trace": "on", "task_trace": "on"}, timeout=180)
    [prof] = runner.prof_dirs()
    counts = sorted(len(list(d.glob("summary/step_trace_*.csv"))) for d in prof.glob("device_*"))
    assert counts == [2, 3, 3], counts
    summary = jobprof_cli("summary", str(runner.out))
    # before: "internal error ... KeyError: '0'" from the straggler finding
    assert summary.returncode == 0 and "internal error" not in summary.stderr, summary.stderr
    assert "Findings" in summary.stdout or "Ranks" in summary.stdout, summary.stdout
    # none of the three is a rank of a distributed job: the table says so (issue 29 item 6)
    assert len(re.findall(r"^[012]\* ", summary.stdout, re.M)) == 3, summary.stdout
    assert "not a rank of a distributed job" in summary.stdout
    report = jobprof_cli("report", str(runner.out), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0 and "internal error" not in report.stderr, report.stderr


# Three finished iterations, then an exit that runs no atexit handler: os._exit, or exec of the
# program itself (a restart); before, the sink thread's queue (all of a short job) was lost and
# Kineto's scratch files stayed behind.
EXITING_JOB = """
import os, sys, torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
print("trained", sys.argv[1:], flush=True)
import pickle  # the wrapped functions pickle as the builtins do
print(pickle.dumps(os._exit), pickle.loads(pickle.dumps(os.execv)) is os.execv, os._exit.__name__, flush=True)
if sys.argv[1:] == ["exit"]:
    os._exit(7)
if sys.argv[1:] == ["exec"]:
    os.execv(sys.executable, [sys.executable, __file__, "after-exec"])
"""


@pytest.mark.parametrize("how", ["exit", "exec"])
def test_finished_iterations_survive_os_exit_and_exec(runner: Runner, how: str) -> None:
    script = runner.script(EXITING_JOB)
    plain = runner.run(script, mode=None, timeout=120, args=[how], check=False)
    profiled = runner.run(script, {"training_trace": "on", "task_trace": "on"}, timeout=120, args=[how],
                          check=False)
    assert (profiled.returncode, profiled.stdout) == (plain.returncode, plain.stdout)
    assert plain.returncode == (7 if how == "exit" else 0)
    assert "jobprof: error" not in profiled.stderr and "Traceback" not in profiled.stderr, profiled.stderr
    [prof] = runner.prof_dirs()
    devices = sorted(prof.glob("device_*"))
    assert len(devices) == (1 if how == "exit" else 2)  # exec: the new image profiles itself too
    first = devices[0] if how == "exit" else next(d for d in devices if (d / "end_info.0").exists())
    assert raw_iterations(first) == [1, 2, 3]
    assert not list(prof.rglob(".scratch*")), sorted(prof.rglob(".scratch*"))
    info = json.loads((first / f"info.json.{first.name.split('_')[1]}").read_text())
    assert info["jobprof"]["end_reason"] == ("os._exit(7)" if how == "exit" else "exec")
    summary = jobprof_cli("summary", "--json", str(runner.out))
    assert summary.returncode == 0, summary.stderr
    ranks = json.loads(summary.stdout)["ranks"]
    assert all(r["finished"] and r["iterations"]["count"] == 3 for r in ranks), ranks
    assert all(r["distributed"] is False for r in ranks)
    if how == "exec":  # one process, two images: said
        text = jobprof_cli("summary", str(runner.out)).stdout
        assert f"devices 0, 1 have one process id (pid {ranks[0]['pid']})" in text, text


# Training off the main thread: in one thread, in two threads with a loop each, in a daemon
# thread still training when the program ends.  Before (issue 29 item 9): Kineto's errors on
# the job's stderr, a segfault with two threads (a cut from the thread that had not started
# Kineto), a hang with the daemon thread (the detector's and the session's locks taken in
# opposite orders at exit).
THREADED_JOB = """
import sys, threading, time, torch
def train(n, ready=None):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(n):
        model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        if ready is not None and i == 3:
            ready.set()
how = sys.argv[1]
if how == "thread":
    t = threading.Thread(target=train, args=(5,)); t.start(); t.join()
elif how == "two":
    ts = [threading.Thread(target=train, args=(5,)) for _ in range(2)]
    [t.start() for t in ts]; [t.join() for t in ts]
else:
    # still training at exit, after a few iterations (however slow the machine)
    ready = threading.Event()
    threading.Thread(target=train, args=(10**9, ready), daemon=True).start()
    ready.wait(60); time.sleep(0.5)
print("done", flush=True)
"""
KINETO_NOISE = ("External init callback", "Requested callback", "Leaked callback", "disableProfiler",
                "Segmentation", "Fatal Python error", "jobprof: error")


@pytest.mark.parametrize("how", ["thread", "two", "daemon"])
def test_training_off_the_main_thread(runner: Runner, how: str) -> None:
    script = runner.script(THREADED_JOB)
    plain = runner.run(script, mode=None, timeout=120, args=[how], check=False)
    profiled = runner.run(script, {"training_trace": "on", "task_trace": "on"}, timeout=120, args=[how],
                          check=False)
    assert profiled.stdout == plain.stdout == "done\n", profiled.stderr
    if how == "daemon":  # computing at exit, torch itself may abort (it does on 2.13), whether
        # profiled or not: which one happens is a race; before, the profiled job hung
        assert {plain.returncode, profiled.returncode} <= {0, -6, 134}, profiled.stderr
    else:
        assert profiled.returncode == plain.returncode == 0, profiled.stderr
    assert not [n for n in KINETO_NOISE if n in profiled.stderr], profiled.stderr
    other = "iterations end on more than one thread"
    # with two loops, whether iterations end on both threads depends on their interleaving
    assert profiled.stderr.count(other) <= (1 if how == "two" else 0), profiled.stderr
    device = runner.device_dir()
    if how == "thread":  # the training thread's operators, every iteration
        assert raw_iterations(device, "ops") == [1, 2, 3, 4, 5]
    assert raw_iterations(device)


# record_function blocks that fail as they open or close, inside profiled iterations: the
# program's tracebacks (as it prints them) name only its own frames and torch's, and a
# block entered before the capture or across cuts still closes (issue 29 item 10)
FAILING_BLOCK_JOB = """
import traceback, torch
from torch.autograd.profiler import record_function

model = torch.nn.Linear(8, 8)
outer = record_function("outer block")
outer.__enter__()
for step in range(4):
    with record_function("step block"):
        model(torch.randn(4, 8)).sum().backward()
    try:
        record_function(step).__enter__()  # not a name: the op refuses it
    except Exception:
        print(traceback.format_exc().replace("\\n", "|"))
    try:
        record_function("never entered").__exit__(None, None, None)
    except BaseException:
        print(traceback.format_exc().replace("\\n", "|"))
outer.__exit__(None, None, None)
print(sorted(vars(record_function("x"))))
"""


def test_a_failing_record_function_shows_no_jobprof_frame(runner: Runner) -> None:
    script = runner.script(FAILING_BLOCK_JOB)
    plain = runner.run(script, mode=None, timeout=120)
    profiled = runner.run(script, {"training_trace": "on", "task_trace": "on"}, timeout=120)
    assert plain.returncode == profiled.returncode == 0, profiled.stderr
    assert plain.stdout.count("Traceback") == 8, plain.stdout
    # before: a frame of jobprof's record_function wrapper in every one of them
    assert "opcapture" not in profiled.stdout
    assert profiled.stdout == plain.stdout
    # the blocks that did open are still each iteration's (the loop-wide one across every cut)
    ops = runner.device_dir() / "timeline"
    names = "".join(p.read_text() for p in ops.glob("msprof_*.json"))
    assert names.count('"step block"') >= 3 and '"outer block"' in names
