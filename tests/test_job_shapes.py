"""Job shapes the profiled program must survive exactly as it does unprofiled: processes it
forks itself (issue 29).  Each test runs the same job profiled and unprofiled and compares what
a user sees: exit codes, output, the parent's view of its children."""

from __future__ import annotations

import pytest

from conftest import Runner

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
