"""The README's first command, as written there: its example job profiled with its options writes
every file family for (nearly) every iteration, and jobprof has nothing to warn about.

The script and PROFILING_OPTIONS are read from the README's first ``bash`` block, so the test checks
what a new user runs; only ``output`` is redirected into the test's folder.  Carries the
``torch_versions`` marker: .ci/run also runs it on every torch of its version legs.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO, Runner

pytestmark = pytest.mark.torch_versions

MODEL = 4294967295
#: examples/train_mlp.py's default --steps (the README passes none)
STEPS = 60
#: the options these families come from; the README's command must keep enabling them
EXPECTED_OPTIONS = {"training_trace": "on", "task_trace": "on", "aicpu": "on",
                    "aic_metrics": "PipeUtilization", "msproftx": "on", "task_memory": "on"}
SUMMARIES = ("step_trace", "dp", "msprof_tx", "op_summary", "op_statistic", "task_time", "aicpu",
             "operator_memory", "memory_record")
TIMELINES = ("step_trace", "msprof", "task_time", "msprof_tx")


def readme_command() -> tuple[str, dict[str, str]]:
    """The script and the options of the README's first command."""
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    assert block, "README.md has no bash block"
    options = re.search(r"PROFILING_OPTIONS='([^']*)'", block[1])
    script = re.search(r"\bpython3? (examples/\S+\.py)", block[1])
    assert options and script, block[1]
    return script[1], json.loads(options[1])


def iterations(folder, family: str, ext: str) -> list[int]:
    pattern = re.compile(rf"{family}_0_{MODEL}_(\d+)\.{ext}")
    return sorted(int(m[1]) for p in folder.iterdir() if (m := pattern.fullmatch(p.name)))


def test_readme_first_command(runner: Runner) -> None:
    script, options = readme_command()
    assert script == "examples/train_mlp.py", script
    assert {k: v for k, v in options.items() if k != "output"} == EXPECTED_OPTIONS, options
    proc = runner.run(REPO / script, {k: v for k, v in options.items() if k != "output"}, timeout=300)
    warned = [line for line in proc.stderr.splitlines() if line.startswith(("jobprof: warning",
                                                                             "jobprof: error"))]
    assert not warned, "\n".join(warned)
    device = runner.device_dir()
    # one step_trace per optimizer step; the other families per iteration too, though the last
    # DataLoader batch / record_function range may fall after the last step
    for sub, families, ext in (("summary", SUMMARIES, "csv"), ("timeline", TIMELINES, "json")):
        for family in families:
            found = iterations(device / sub, family, ext)
            if family == "step_trace":
                assert found == list(range(1, STEPS + 1)), (sub, family, found)
            else:
                assert set(found) >= set(range(1, STEPS)) and set(found) <= set(range(1, STEPS + 1)), \
                    (sub, family, found)
