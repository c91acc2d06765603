"""torch.compile (default inductor backend) training loops, profiled and unprofiled in the
same test: same losses, same compile counters (printed by the program), no new warning,
and, with ``TORCH_LOGS=recompiles``, the same recompile lines.  fusion_op is on in every
set with task_trace (its default); the ``kernels`` set also times each C++ kernel.

Each run gets its own cold inductor cache (a relative ``TORCHINDUCTOR_CACHE_DIR`` lies in the
run's own working folder): a warm cache changes the program's own counters (a cold compile
of a graph-broken function counts ~100 frames, a cached one 7), so the arms must start alike.
"""

from __future__ import annotations

import pytest

from harness import DEFAULT_SETS, TORCH_LOG, check_all, facts, run_matrix

#: (shape, optimizer steps)
ROWS = [("module", 5), ("function", 5)]
COLD_CACHE = {"TORCHINDUCTOR_CACHE_DIR": "inductor_cache"}


def torch_log_lines(run) -> list[str]:
    return [f"{m[1]} {m[2]}" for m in map(TORCH_LOG.match, run.stderr.splitlines()) if m]


def same_torch_logs(base, run):
    """No torch log record (warning, recompile) appears or disappears under profiling."""
    mine, theirs = torch_log_lines(run), torch_log_lines(base)
    assert mine == theirs, (f"{run.label}: torch log lines differ: "
                            f"{[x for x in mine if x not in theirs][:3]} new, "
                            f"{[x for x in theirs if x not in mine][:3]} gone")


def counters(run) -> str:
    line = [x for x in run.stdout.splitlines() if x.startswith("compile ")]
    assert len(line) == 1, run.describe()
    return line[0]


@pytest.mark.parametrize(("shape", "n"), ROWS, ids=[row[0] for row in ROWS])
def test_compiled_loop(tmp_path, shape, n):
    # fusion_op runs in every set with task_trace; "kernels" also times each C++ kernel
    base, runs = run_matrix("compiled.py", tmp_path, option_sets=(*DEFAULT_SETS, "kernels"),
                            args=[shape, str(n)], env=COLD_CACHE)
    assert base.code == 0, base.describe()
    assert int(facts(base)["STEPS"]) == n
    assert "unique_graphs" in counters(base), counters(base)  # it did compile
    check_all(base, runs, n, "optimizer_step", extra=[same_torch_logs])


@pytest.mark.parametrize(("shape", "n"), ROWS, ids=[row[0] for row in ROWS])
def test_compiled_recompiles(tmp_path, shape, n):
    env = {**COLD_CACHE, "TORCH_LOGS": "recompiles"}
    base, runs = run_matrix("compiled.py", tmp_path, option_sets=("l1",), args=[shape, str(n)], env=env)
    assert base.code == 0, base.describe()
    recompiling = [x for x in torch_log_lines(base) if "Recompiling function" in x]
    # the function row's smaller last batch recompiles once: proof the log reaches stderr
    assert len(recompiling) == (1 if shape == "function" else 0), base.stderr[-3000:]
    check_all(base, runs, n, "optimizer_step", extra=[same_torch_logs])
