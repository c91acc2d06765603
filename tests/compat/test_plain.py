"""Plain PyTorch loops, profiled and unprofiled in the same test.

Each row runs ``programs/plain.py <shape> <n>`` unprofiled and profiled, then checks every
option set (all of them, so one failure names every option set it hits).  Every row runs the step
tier and ``l1``; ``l0`` (the operator tier without shapes) and ``aic`` (with the metric columns)
alternate between the rows, so each runs on half the loop shapes (since 2026-12: CI's time);
``sampled`` (``task_trace_every`` 2: Kineto paused and resumed at iteration ends) runs on every
third row.
"""

from __future__ import annotations

import pytest

from harness import DEFAULT_SETS, check_all, facts, run_matrix

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

#: (shape, argv n, iteration method jobprof must find)
ROWS = [
    ("optimizer", 6, "optimizer_step"),
    ("manual_sgd", 6, "backward"),
    ("accumulation", 6, "optimizer_step"),
    ("amp", 6, "optimizer_step"),
    ("lbfgs", 2, "optimizer_step"),
    ("gan", 6, "optimizer_step"),
    ("eval_between", 6, "optimizer_step"),
    ("inference", 8, "forward"),
    ("dataloader", 6, "optimizer_step"),
]




def option_sets(shape: str) -> tuple[str, ...]:
    """The row's option sets: all but one of l0 / aic, taking turns down the rows; in the full
    matrix (not the legs') every third row also runs the sampled operator tier, and the next
    one task_memory on the step tier; every third row (legs too) runs task_memory with the
    operator tier (Kineto's memory profiling differs between torch releases), and every third
    (legs too) dynamic mode with a trigger firing all through the run (Kineto started and
    stopped mid-run); the rows of memory_step also run every host value with runtime_api
    (``host``: samplers that do not depend on torch's release, so not in the legs)."""
    index = [row[0] for row in ROWS].index(shape)
    skipped = ("aic", "l0")[index % 2]
    sets = tuple(s for s in DEFAULT_SETS if s != skipped)
    full = {"l0", "l1", "aic"} <= set(DEFAULT_SETS)
    if index % 3 == 0 and full:
        sets += ("sampled",)
    if index % 3 == 0 and "l1" in DEFAULT_SETS:  # captures starting and ending mid-run
        sets += ("dynamic",)
    if index % 3 == 1 and "l1" in DEFAULT_SETS:
        sets += ("memory",)
    if index % 3 == 2 and full:
        sets += ("memory_step",)
    if index % 3 == 2 and full:  # the dataloader row among them: its workers' CPU
        sets += ("host",)
    return sets


@pytest.mark.parametrize(("shape", "n", "method"), ROWS, ids=[row[0] for row in ROWS])
def test_plain_loop(tmp_path, shape, n, method):
    base, runs = run_matrix("plain.py", tmp_path, option_sets=option_sets(shape), args=[shape, str(n)])
    assert base.code == 0, base.describe()
    found = facts(base)
    steps = int(found["STEPS"])
    assert steps == n, found
    if shape == "lbfgs":
        # the row exists for step(closure) calling the closure more often than jobprof's
        # tentative-segment limit (16): every call must still fold into its one step
        calls = [int(c) for c in found["CLOSURE_CALLS"].split()]
        assert len(calls) == n and min(calls) > 16, calls
    if shape == "amp":
        # no step skipped: each scaler.step was a true optimizer step
        scales = {line.split()[2] for line in base.stdout.splitlines() if line.startswith("scale ")}
        assert len(scales) == 1, scales
    check_all(base, runs, steps, method, extra=[memory_files, host_files])


def memory_files(base, run) -> None:
    """task_memory's files: memory_record for every iteration, operator_memory with the
    operator tier (where the iteration allocated anything; inference rows allocate too)."""
    if not run.label.startswith("memory"):
        return
    summary = run.prof_dir() / "device_0" / "summary"
    records = sorted(summary.glob("memory_record_*.csv"))
    steps = sorted(summary.glob("step_trace_*.csv"))
    assert len(records) == len(steps) > 0, (run.label, len(records), len(steps))
    operators = sorted(summary.glob("operator_memory_*.csv"))
    assert bool(operators) == (run.label == "memory"), (run.label, len(operators))


def host_files(base, run) -> None:
    """host_sys / host_sys_usage: each file for every iteration, with rows."""
    if run.label != "host":
        return
    summary = run.prof_dir() / "device_0" / "summary"
    steps = sorted(summary.glob("step_trace_*.csv"))
    for name in ("host_cpu_usage", "host_mem_usage", "host_disk_usage", "host_network_usage",
                 "cpu_usage", "process_cpu_usage", "sys_mem", "process_mem"):
        files = sorted(summary.glob(f"{name}_*.csv"))
        assert len(files) == len(steps) > 0, (name, len(files), len(steps))
        assert all(len(f.read_text().splitlines()) > 1 for f in files), name
    assert not list(summary.glob("api_statistic_*.csv")), "a CPU job has no runtime API"
