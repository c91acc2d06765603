"""task_trace, aicpu and l2 reduce each device to facts (``jobprof_rank_facts``) and build their
summary sections from them: the facts are small JSON (aggregates, no per-operator record), and
the sections are the same whether the facts come from the facts file the exporter wrote, are
computed while gathering, or are not gathered at all (computed by the section itself); once
gathered, a section reads no raw data and no rendered file.

One real profile, made once: examples/train_mlp.py with task_trace, aicpu and l2 on (l2 with the
diagnostic software events, so its operator counts are read from the raw stream on any machine),
and copies of it changed where a section has another path: an op_statistic file missing, and
the l2 source rewritten as cache counters (a hit rate) or as CUPTI.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Runner, loaded_manager
from jobprof.analysis import facts
from jobprof.analysis.profile import Profile
from jobprof.files import rawstore
from jobprof.plugin.results import Section
from jobprof.plugins.aicpu import report as aicpu_report
from jobprof.plugins.l2 import report as l2_report
from jobprof.plugins.task_trace import report as task_report

STEPS = 4
OPTIONS = {"training_trace": "on", "task_trace": "on", "aicpu": "on", "l2": "on"}
#: plugin (entry-point name) -> (its rank_facts, its section function)
PLUGINS: dict[str, tuple[Callable[[Profile, int], Any], Callable[[Profile], list[Section]]]] = {
    "task_trace": (task_report.rank_facts, task_report.top_sections),
    "aicpu": (aicpu_report.rank_facts, aicpu_report.aicpu_sections),
    "l2": (l2_report.rank_facts, l2_report.l2_sections),
}
#: a device's facts of one plugin stay below this (JSON bytes): aggregates, not records
SMALL = 8_000
#: the changed copies of the profile (see the module's docstring)
VARIANTS = ["as_run", "op_statistic_missing", "l2_llc", "l2_cupti"]


@pytest.fixture(scope="module")
def prof(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("mlp"))
    runner.run(REPO / "examples" / "train_mlp.py", OPTIONS,
               args=["--steps", str(STEPS), "--workers", "0", "--hidden", "64"],
               env={"JOBPROF_L2_EVENTS": "software"}, timeout=300)
    (found,) = runner.prof_dirs()
    return found


def _sections(profile: Profile) -> dict[str, list[Section]]:
    return {name: section(profile) for name, (_, section) in PLUGINS.items()}


def _refuse(profile: Profile, device: int) -> Any:
    raise AssertionError(f"device {device}: computed although its facts were gathered")


def _no_raw(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("raw data or a rendered file read after the facts were gathered")


def _variant(prof: Path, tmp: Path, variant: str) -> Path:
    """A copy of ``prof`` changed as ``variant`` says, without the facts files the exporter wrote
    (a changed copy's would be stale anyway)."""
    if variant == "as_run":
        return prof
    copy = tmp / "copy" / prof.name
    shutil.copytree(prof, copy)
    for kept in copy.glob("device_*/data/facts.*.json"):
        kept.unlink()
    device = copy / "device_0"
    if variant == "op_statistic_missing":
        first = sorted((device / "summary").glob("op_statistic_*"))[0]
        first.unlink()
    else:
        info_path = device / "info.json.0"
        info = json.loads(info_path.read_text())
        if variant == "l2_llc":  # the software counts read as cache accesses and misses
            info["jobprof"]["l2"] = {"available": True, "source": "LLC",
                                     "events": ["LLC-loads", "LLC-load-misses"]}
        else:
            info["jobprof"]["l2"] = {"available": True, "source": "CUPTI",
                                     "metrics": ["lts__t_sector_hit_rate.pct"]}
        info_path.write_text(json.dumps(info))
    return copy


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def test_facts_are_small_json_of_one_device(prof: Path) -> None:
    (device,) = Profile(prof).devices
    alone = Profile(prof, device=device)
    raw_bytes = sum(s.stat().st_size for s in rawstore.segments(alone.folder(device)))
    ops = sum(len(streams.get("ops", ())) for _, streams in alone.streams(device))
    answers = {name: rank_facts(alone, device) for name, (rank_facts, _) in PLUGINS.items()}
    for name, value in answers.items():
        assert value is not None, name
        text = json.dumps(value, allow_nan=False)
        assert json.loads(text) == value, name  # no tuple, no int key: the same after JSON
        assert len(text) < SMALL and len(text) < raw_bytes / 10, (name, len(text), raw_bytes)
        # no list as long as the operator stream: aggregates, not records
        assert all(len(v) < ops for v in _walk(value) if isinstance(v, list)), name
    assert len(answers["aicpu"]["top"]) == aicpu_report.TOP
    assert answers["task_trace"]["files"] == answers["task_trace"]["iterations"] == STEPS
    assert answers["l2"]["source"] == "software" and answers["l2"]["measured"] > 0
    # the hook answers the same, through the manager's contract check
    assert {name: value for name, value in loaded_manager().rank_facts(alone, device)
            if name in PLUGINS} == answers


@pytest.mark.parametrize("variant", VARIANTS)
def test_sections_from_gathered_facts_equal_the_direct_ones(prof: Path, tmp_path: Path, variant: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = _variant(prof, tmp_path, variant)
    expected = _sections(Profile(path))  # no facts attached: each section computes them
    assert all(expected.values()), expected
    gathered = Profile(path)
    kept = facts.gather(gathered, loaded_manager(), "local", 1)
    for device, one in kept.items():
        assert set(PLUGINS) <= set(one["asked"])
        for name in PLUGINS:
            gathered.facts(name, device, _refuse)
    with monkeypatch.context() as patch:
        patch.setattr(rawstore, "read", _no_raw)
        patch.setattr(rawstore, "segments", _no_raw)
        patch.setattr(Profile, "_files", _no_raw)
        found = _sections(gathered)
    assert found == expected
    top, _shapes = expected["task_trace"]  # the top operators, their drill-down by input shapes
    (l2,) = expected["l2"]
    if variant == "op_statistic_missing":
        assert f"1 of {STEPS} iterations have no op_statistic file yet" in " ".join(top.notes)
    else:
        assert not any("op_statistic" in note for note in top.notes)
    rate = l2.rows[0][3]
    if variant == "l2_llc":
        assert l2.rows[0][1] == "LLC" and rate != "N/A" and 0 <= float(rate) <= 1
    elif variant == "l2_cupti":  # a CPU job: no kernel, no rate
        assert list(l2.rows[0][1:]) == ["CUPTI", 0, "N/A"]
    else:
        assert l2.rows[0][1] == "software" and l2.rows[0][2] > 0 and rate == "N/A"


def test_the_exporter_wrote_the_facts(prof: Path) -> None:
    """The job's exit export kept every plugin's answer: the whole profile reads them back."""
    profile = Profile(prof)
    (device,) = profile.devices
    assert facts.read_cached(profile, device, facts.plugin_keys(loaded_manager())) is not None
    alone = Profile(prof, device=device)
    kept = facts.gather(profile, loaded_manager(), "local", 1)[device]
    for name, (rank_facts, _) in PLUGINS.items():
        assert kept["plugins"][name] == rank_facts(alone, device), name
