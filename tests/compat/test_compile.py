"""torch.compile (default inductor backend) training loops, profiled and unprofiled in the
same test: same losses, same compile counters (printed by the program), no new warning, and
(``TORCH_LOGS=recompiles`` in every run) the same recompile lines.

Each row compiles cold once per option set, the costliest runs of the suite (a minute each on
2 CPUs), so the sets are split between the two rows instead of repeated: the step tier,
``l1``, ``memory`` (l1 with task_memory: Kineto's memory profiling, the module-call recorder)
and ``dynamic`` (captures begun and ended between compiled steps) on the module row; ``l0``,
``aic`` and ``kernels`` (fusion_op times each C++ kernel: a different compile of the same
graph) on the function row, the one with a graph break and a
recompile.  fusion_op is on in every set with task_trace (its default).  Until 2026-12 each row
ran every set and a separate test ran ``l1`` again for the recompile lines: 16 cold compiles
where 7 prove the same.

Each run gets its own cold inductor cache (a relative ``TORCHINDUCTOR_CACHE_DIR`` lies in the
run's own working folder): a warm cache changes the program's own counters (a cold compile
of a graph-broken function counts ~100 frames, a cached one 7), so the arms must start alike.
"""

from __future__ import annotations

import pytest

from harness import TORCH_LOG, check_all, facts, run_matrix

#: (shape, optimizer steps, the option sets of its row, recompiles its base run logs)
ROWS = [("module", 5, ("step", "l1", "memory", "dynamic"), 0),
        # the function row's smaller last batch recompiles once: proof the log reaches stderr
        ("function", 5, ("l0", "aic", "kernels"), 1)]
ENV = {"TORCHINDUCTOR_CACHE_DIR": "inductor_cache", "TORCH_LOGS": "recompiles"}


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


@pytest.mark.parametrize(("shape", "n", "sets", "recompiles"), ROWS, ids=[row[0] for row in ROWS])
def test_compiled_loop(tmp_path, shape, n, sets, recompiles):
    base, runs = run_matrix("compiled.py", tmp_path, option_sets=sets, args=[shape, str(n)], env=ENV)
    assert base.code == 0, base.describe()
    assert int(facts(base)["STEPS"]) == n
    assert "unique_graphs" in counters(base), counters(base)  # it did compile
    recompiling = [x for x in torch_log_lines(base) if "Recompiling function" in x]
    assert len(recompiling) == recompiles, base.stderr[-3000:]
    check_all(base, runs, n, "optimizer_step", extra=[same_torch_logs])
