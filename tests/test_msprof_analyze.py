"""Huawei's msprof-analyze (PyPI, its own venv: .ci/run installs it and names it in
``JOBPROF_MSPROF_ANALYZE``) reads jobprof's CANN 8 export and finds what is true of the job.

Each test runs a job built to show (or not to show) one finding and asserts the tool's answer
(docs/msprof-tools.md lists every tool and mode, and what it cannot read honestly)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli

TOOL = os.environ.get("JOBPROF_MSPROF_ANALYZE", "")
pytestmark = pytest.mark.skipif(not TOOL, reason="JOBPROF_MSPROF_ANALYZE names no msprof-analyze (.ci/run installs it)")


def msprof_analyze(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    assert Path(TOOL).is_file(), f"JOBPROF_MSPROF_ANALYZE={TOOL}: no such file"
    return subprocess.run([TOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def advisor_problems(prof_dir: Path, cwd: Path) -> list[str]:
    """`advisor all` in agent mode (JSON on stdout), English: the problems' categories."""
    out = cwd / "advisor"
    out.mkdir()
    proc = msprof_analyze("advisor", "all", "-d", str(prof_dir), "-o", str(out), "-l", "en", "--agent", cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["status"] == "success", answer
    message = answer["message"]
    if not isinstance(message, dict):  # "no optimization suggestions"
        return []
    return [row[0] for row in message.get("problems", {}).get("data", [])]


INFERENCE = """
import sys
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).eval()
dynamic = sys.argv[1] == "dynamic"
with torch.no_grad():
    for i in range(8):
        model(torch.randn(8 + 5 * i if dynamic else 8, 16))  # a batch that grows, or one size
print("DONE")
"""


@pytest.mark.parametrize("shapes", ["dynamic", "static"])
def test_advisor_finds_dynamic_shapes_only_in_a_job_that_has_them(runner: Runner, shapes: str) -> None:
    """advisor's "all operators are dynamic shape" reads OP State: a job whose batch grows every
    iteration gets it, the same job with one batch size does not (every eager job got it while
    OP State was N/A)."""
    runner.run(INFERENCE, {"task_trace": "on", "training_trace": "on"}, args=[shapes])
    assert jobprof_cli("export", str(runner.out), "--layout", "cann8").returncode == 0
    [prof] = runner.prof_dirs()
    problems = advisor_problems(prof, runner.tmp)
    dynamic = [p for p in problems if "Dynamic Shape" in p]
    assert len(dynamic) == (1 if shapes == "dynamic" else 0), problems
