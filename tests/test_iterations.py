"""Iteration detection on real loops of every shape, with no user code (tests/loops.py)."""

from __future__ import annotations

import itertools
import shutil

import pytest

from conftest import raw
from jobprof.analysis.profile import Profile

LOOPS = __import__("pathlib").Path(__file__).with_name("loops.py")


def profile_loop(runner, shape: str, n: int) -> tuple[list, dict]:
    script = runner.tmp / "loops.py"
    shutil.copy(LOOPS, script)
    runner.run(script, {"training_trace": "on"}, args=[shape, str(n)])
    profile = Profile(runner.prof_dirs()[0])
    info = profile.info(0)["jobprof"]
    return profile.iterations(0), info


@pytest.mark.parametrize(("shape", "n", "expected", "method"), [
    ("optimizer_loop", 6, 6, "optimizer_step"),
    ("accumulation", 4, 4, "optimizer_step"),
    ("lbfgs", 4, 4, "optimizer_step"),
    ("backward_only", 20, 20, "backward"),
    ("tensor_backward_only", 20, 20, "backward"),
    ("inference", 20, 20, "forward"),
    ("two_optimizers", 5, 5, "optimizer_step"),
    ("eval_between", 5, 5, "optimizer_step"),
])
def test_loop_shapes(runner, shape, n, expected, method):
    iterations, info = profile_loop(runner, shape, n)
    assert [it.index for it in iterations] == list(range(1, expected + 1))
    assert {it.method for it in iterations} == {method}
    assert info["iteration_method"] == method
    for prev, it in itertools.pairwise(iterations):
        assert it.start_ns == prev.end_ns  # iterations tile the run
        assert it.end_ns > it.start_ns


def test_accumulation_window_holds_every_micro_batch(runner):
    iterations, _ = profile_loop(runner, "accumulation", 4)
    # the first window merges its tentative backward boundaries into one iteration
    first, rest = iterations[0], iterations[1:]
    assert first.fp_start_ns is not None and first.bp_end_ns is not None
    assert all(it.bp_end_ns < it.end_ns for it in rest)


def test_grad_scaler_skipped_step_still_ends_the_iteration(runner):
    iterations, _ = profile_loop(runner, "grad_scaler", 5)
    assert [it.index for it in iterations] == [1, 2, 3, 4, 5]
    assert [it.skipped for it in iterations] == [False, False, True, False, False]
    assert raw(runner.device_dir())[3]["iteration"][0]["skipped"] is True


def test_eval_forward_is_not_fp_start(runner):
    """FP Start is the first grad-enabled forward, not a validation forward before it."""
    iterations, _ = profile_loop(runner, "eval_between", 3)
    for it in iterations[1:]:
        assert it.fp_start_ns > it.start_ns


EXPLICIT = """
import sys
import torch
import jobprof
from loops import data, model

m, loss_fn = model(), torch.nn.MSELoss()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for i, (x, y) in enumerate(data(int(sys.argv[1]) * 2), 1):
    opt.zero_grad()
    loss_fn(m(x), y).backward()
    opt.step()
    if i % 2 == 0 and sys.argv[2] == "call":
        jobprof.step()
"""


@pytest.mark.parametrize(("n", "how", "expected", "method"), [
    (4, "call", 4, "explicit"),  # explicit marks win, from the first iteration
    # the script mentions jobprof.step() but never calls it: after the tentative window,
    # automatic detection takes over and nothing is lost
    (10, "never", 20, "optimizer_step"),
])
def test_explicit_step_wins(runner, n, how, expected, method):
    shutil.copy(LOOPS, runner.tmp / "loops.py")
    runner.run(EXPLICIT, {"training_trace": "on"}, args=[str(n), how])
    profile = Profile(runner.prof_dirs()[0])
    iterations = profile.iterations(0)
    assert [it.index for it in iterations] == list(range(1, expected + 1))
    assert {it.method for it in iterations} == {method}
    assert profile.info(0)["jobprof"]["iteration_method"] == method
