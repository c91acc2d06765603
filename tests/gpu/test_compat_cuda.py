"""The compatibility matrix's rule on a GPU: a program on ``cuda:0`` runs the same profiled and
unprofiled (exit code, stdout with its losses as repr floats, its own stderr, RNG streams
CUDA's included), and jobprof finds one iteration per optimizer step with a sane summary.

Rows (tests/gpu/programs/cuda_loops.py): a plain AdamW loop, a ``torch.compile``d model, and
Lightning's ``Trainer.fit(accelerator="gpu")``; each runs unprofiled, under the step tier and
under the operator tier, all three at once.  Skipped where torch sees no CUDA device (CI);
on a GPU machine: ``python -m pytest -q tests/gpu/test_compat_cuda.py`` (tests/gpu/check.sh).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# tests/compat's tests import the harness from their own folder (pytest puts it on sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))
from harness import OPTION_SETS, STEP_TIER, Run, check_all, facts, run

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")

PROGRAM = Path(__file__).resolve().parent / "programs" / "cuda_loops.py"
#: the matrix's "step" set leaves task_trace at its default, which is on: the step tier proper
#: says off.  "l1" is the matrix's operator tier (task_trace l1 + aicpu, with the step tier).
SETS = {"step": {**STEP_TIER, "task_trace": "off"}, "l1": OPTION_SETS["l1"]}
#: (shape, optimizer steps, environment); each compiled run starts from its own cold inductor
#: cache (relative: it lies in the run's working folder), as tests/compat/test_compile.py does
ROWS = [("loop", 6, {}), ("compiled", 5, {"TORCHINDUCTOR_CACHE_DIR": "inductor_cache"}),
        ("lightning", 6, {})]


def matrix(tmp: Path, shape: str, n: int, env: dict[str, str]) -> tuple[Run, dict[str, Run]]:
    """The unprofiled run and one run per option set, all at once (a GPU machine has the cores)."""
    jobs = {"unprofiled": None, **SETS}
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {label: pool.submit(run, PROGRAM, tmp, label, opts, [shape, str(n)], env, 240)
                   for label, opts in jobs.items()}
        runs = {label: f.result() for label, f in futures.items()}
    return runs.pop("unprofiled"), runs


@pytest.mark.parametrize(("shape", "n", "env"), ROWS, ids=[row[0] for row in ROWS])
def test_cuda_row(tmp_path, shape, n, env):
    base, runs = matrix(tmp_path, shape, n, env)
    assert base.code == 0, base.describe()
    assert int(facts(base)["STEPS"]) == n, base.describe()
    assert "rng cuda" in base.stdout, "the program ran without CUDA"
    if shape == "compiled":
        assert "unique_graphs" in base.stdout, base.describe()  # it did compile
    check_all(base, runs, n, "optimizer_step")
