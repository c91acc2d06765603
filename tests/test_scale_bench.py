"""bench/scale.py's replication: a real 2-rank gloo DDP profile (torchrun) replicated to 5 ranks is
read by ``jobprof summary`` as 5 ranks 0..4, each with its source rank's iterations, its raw data
hard-linked, and the source left as it was."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli, torchrun
from jobprof.analysis import facts
from jobprof.analysis.profile import Profile
from jobprof.engine.manager import PluginManager
from jobprof.plugin.reporter import Reporter

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"training_trace": "on", "hccl": "on", "dp": "on", "task_trace": "l0"}
STEPS = 6


@pytest.fixture(scope="module")
def scale():
    sys.path.insert(0, str(ROOT / "bench"))  # bench/scale.py imports its siblings by name
    try:
        yield importlib.import_module("scale")
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("scale"))
    runner.run(torchrun(runner, ROOT / "examples" / "train_ddp.py", 2, "--steps", str(STEPS), "--batch", "8"),
               OPTIONS, timeout=300)
    (prof,) = runner.prof_dirs()
    return prof


def _state(prof: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(prof)): (p.stat().st_mtime_ns, hashlib.sha1(p.read_bytes()).hexdigest())
            for p in sorted(prof.rglob("*")) if p.is_file()}


def _summary(prof: Path) -> dict:
    proc = jobprof_cli("summary", "--json", str(prof))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_replica_of_five_ranks(scale, source: Path, tmp_path: Path) -> None:
    before = _state(source)
    counts = {r["rank"]: r["iterations"]["count"] for r in _summary(source)["ranks"]}
    assert counts == {0: STEPS, 1: STEPS}

    replica = scale.replicate(source, tmp_path / "five", 5)
    model = _summary(replica)
    assert [(r["rank"], r["device"]) for r in model["ranks"]] == [(k, k) for k in range(5)]
    assert [r["iterations"]["count"] for r in model["ranks"]] == [counts[k % 2] for k in range(5)]
    assert {r["world_size"] for r in model["ranks"]} == {5}
    assert not [m for m in model["missing"] if "world size" in m]

    for k in range(5):
        device = replica / f"device_{k}"
        raw = sorted(device.glob("data/raw.*.jsonl"))
        assert raw and all(p.stat().st_nlink > 1 for p in raw)
        assert all(p.stat().st_nlink > 1 for p in device.glob("data/kineto/*"))
        info = json.loads((device / f"info.json.{k}").read_text())
        assert (info["rank_id"], info["jobprof"]["world_size"]) == (k, 5)
        assert (device / f"info.json.{k}.done").read_text() == \
            f"filesize:{(device / f'info.json.{k}').stat().st_size}\n"
        assert list(device.glob(f"summary/step_trace_{k}_*.csv"))  # linked under the new device's name

    # the rewritten facts files are valid and say what the raw data says
    cold = scale.replicate(source, tmp_path / "cold", 5, facts=False)
    assert not list(cold.glob("device_*/data/facts.*.json"))
    manager = PluginManager(Reporter())
    manager.load_entry_points()
    profile, asked = Profile(replica), facts.plugin_keys(manager)
    assert all(facts.read_cached(profile, d, asked) is not None for d in range(5))
    assert {**_summary(cold), "prof_dir": None} == {**model, "prof_dir": None}

    assert _state(source) == before


def test_twenty_ranks_from_facts_files_as_when_computed(scale, source: Path, tmp_path: Path) -> None:
    """Past 16 ranks: the facts files answer as a cold computation on two workers does, ``--json``
    is one line, and the terminal shows distributions across ranks, not one row per rank."""
    replica = scale.replicate(source, tmp_path / "twenty", 20)
    warm = jobprof_cli("summary", "--json", str(replica))
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.count("\n") == 1  # one line above 16 ranks
    cold = scale.replicate(source, tmp_path / "cold20", 20, facts=False)
    computed = jobprof_cli("summary", "--json", str(cold), "--jobs", "2")
    assert computed.returncode == 0, computed.stderr
    assert {**json.loads(warm.stdout), "prof_dir": None} == {**json.loads(computed.stdout), "prof_dir": None}
    text = jobprof_cli("summary", str(replica)).stdout
    assert "distributed across 20 ranks" in text
    assert "\n     19  " not in text  # no per-rank row for the last rank in the breakdown
