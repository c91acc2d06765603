"""Each rank reduced once to its facts: written at the job's exit and by ``jobprof export``, read by
``summary`` / ``report`` instead of the raw data, computed on any engine with the same answer.

One real 2-rank gloo DDP job (torchrun, training_trace + hccl + dp + msproftx + task_trace l0) is
profiled once; each test works on its own copy of the profile.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli, loaded_manager, torchrun
from jobprof.analysis import facts, summary
from jobprof.analysis.profile import Profile
from jobprof.analysis.selection import Selection
from jobprof.engine.manager import PluginManager
from jobprof.files import rawstore
from jobprof.plugin.hookspec import hookimpl
from jobprof.plugin.reporter import Reporter

ROOT = Path(__file__).resolve().parent.parent
#: task_memory: its facts come from per-iteration digests (jobprof_iteration_facts), kept as the
#: export renders, so the decode-once check covers them
OPTIONS = {"training_trace": "on", "hccl": "on", "dp": "on", "msproftx": "on", "task_trace": "l0",
           "task_memory": "on"}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("facts"))
    launcher = torchrun(runner, ROOT / "examples" / "train_ddp.py", 2, "--steps", "12")
    runner.run(launcher, OPTIONS, timeout=300)
    (prof,) = runner.prof_dirs()
    return prof


@pytest.fixture
def prof(made: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "out" / made.name
    shutil.copytree(made, copy)
    return copy


def _files(prof: Path) -> list[Path]:
    return sorted(prof.glob("device_*/data/facts.*.json"))


def _model(prof: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = jobprof_cli("summary", "--json", str(prof), *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_job_writes_each_ranks_facts_at_exit(prof: Path) -> None:
    files = _files(prof)
    assert [f.name for f in files] == ["facts.0.json", "facts.1.json"]
    for device, path in enumerate(files):
        kept = facts.read_file(path)
        assert kept["stamp"] == facts.stamp(path.parent.parent, facts.plugin_keys(loaded_manager()))
        mine = kept["facts"]
        assert (mine["schema"], mine["device"], mine["rank"]) == (facts.SCHEMA, device, device)
        assert [r["iteration"] for r in mine["rows"]] == list(range(1, 13))
        assert len(mine["iterations"]) == 12 and mine["problems"] == []
        # aggregates, not records: far smaller than the raw data it was computed from
        assert path.stat().st_size < sum(s.stat().st_size for s in rawstore.segments(path.parent.parent))


def test_summary_reads_the_facts_and_no_raw_data(prof: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = loaded_manager()
    expected = summary.summarize(Profile(prof), manager)  # from the facts files

    def refused(*_: object) -> None:
        raise AssertionError("a raw read while every rank's facts file is valid")

    monkeypatch.setattr(rawstore, "read", refused)
    again = summary.summarize(Profile(prof), manager)
    assert again == expected
    assert [r["rank"] for r in again["ranks"]] == [0, 1]
    assert {"communication", "markers"} <= set(again["sections"])


def test_the_model_is_the_same_without_orjson(prof: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobprof.files import jsonread

    manager = loaded_manager()
    for path in _files(prof):  # from raw data (raw lines, Kineto windows), then from facts files
        path.unlink()
    fast = summary.summarize(Profile(prof), manager)
    facts.write(prof, manager)
    cached = summary.summarize(Profile(prof), manager)
    monkeypatch.setattr(jsonread, "_fast", lambda: None)
    assert summary.summarize(Profile(prof), manager) == cached
    for path in _files(prof):
        path.unlink()
    assert summary.summarize(Profile(prof), manager) == fast
    assert json.dumps(fast) == json.dumps(cached)


def test_every_engine_and_the_facts_files_give_the_same_model(prof: Path) -> None:
    cached = _model(prof)
    for path in _files(prof):  # an old profile: no facts file, everything computed from raw data
        path.unlink()
    serial = _model(prof, "--jobs", "1")
    pooled = _model(prof, "--jobs", "2")
    dask = _model(prof, "--engine", "dask", "--jobs", "2")
    assert serial == cached
    assert pooled == cached
    assert dask == cached
    assert not _files(prof), "summary is read-only: it computes facts, it does not write them"
    model = json.loads(cached)
    assert model["cross_rank"]["iterations_compared"] == 12


def _diff(prof: Path, *args: str) -> str:
    proc = jobprof_cli("diff", "--json", str(prof), str(prof), *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_diff_reads_the_facts_and_no_raw_data(prof: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobprof.analysis import diff
    from jobprof.plugins.task_trace import diff as task_diff

    manager = loaded_manager()
    everything = Selection(None)
    expected = diff.compare(diff.load(prof, everything, manager), diff.load(prof, everything, manager))

    def refused(*_: object) -> None:
        raise AssertionError("a raw read while every rank's facts file is valid")

    monkeypatch.setattr(rawstore, "read", refused)
    monkeypatch.setattr(task_diff, "read_op_statistic", refused)
    side = diff.load(prof, everything, manager)
    assert diff.compare(side, side) == expected
    assert {"operators", "collectives"} <= set(side.tables) and side.ranks == [0, 1]
    assert expected["counts"]["operators"] > 5 and expected["counts"]["collectives"] >= 1


def test_summary_leaves_diffs_tables_undecoded(prof: Path) -> None:
    # the second line of a facts file (diff's tables) is damaged: summary never decodes it, and
    # diff, which does, computes that rank's facts again and gives the same answer
    cached = _model(prof)
    diff_before = _diff(prof)
    path = _files(prof)[0]
    head, _, _ = path.read_text().partition("\n")
    path.write_text(head + "\n{\"diff_tables\": [")
    assert _model(prof) == cached
    assert _diff(prof) == diff_before


def test_diff_from_facts_files_equals_diff_from_raw_data_on_every_engine(prof: Path) -> None:
    cached = _diff(prof)
    window = _diff(prof, "--iterations", "3-9")  # a window is always computed
    for path in _files(prof):
        path.unlink()
    assert _diff(prof, "--jobs", "1") == cached
    assert _diff(prof, "--jobs", "2") == cached
    assert _diff(prof, "--engine", "dask", "--jobs", "2") == cached
    assert _diff(prof, "--iterations", "3-9", "--jobs", "1") == window
    model = json.loads(cached)
    assert model["a"]["iterations"] == 24 and model["a"]["op_statistic_files"] == 24
    assert json.loads(window)["a"]["iterations"] == 14


def test_the_report_takes_the_engine_too(prof: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    proc = jobprof_cli("report", str(prof), "-o", str(out), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert "<svg" in out.read_text()


def test_a_stale_facts_file_is_not_used(prof: Path) -> None:
    truth = json.loads(_model(prof))
    path = _files(prof)[1]
    kept = facts.read_file(path)
    kept["facts"]["rows"][0]["iteration_ms"] = 123456.0  # planted: shows whether the file is read
    path.write_text(facts.file_text(kept["stamp"], kept["facts"]))
    planted = json.loads(_model(prof))
    assert planted["iterations"][12]["iteration_ms"] == 123456.0
    # a window: facts of the whole run do not answer for part of it
    window = json.loads(_model(prof, "--iterations", "1-5"))
    assert window["iterations"][5]["iteration_ms"] == truth["iterations"][12]["iteration_ms"]
    # the raw data changes (here only its mtime): the file is stale, the rank is computed again
    segment = rawstore.segments(path.parent.parent)[0]
    os.utime(segment, ns=(segment.stat().st_atime_ns, segment.stat().st_mtime_ns + 10**9))
    assert json.loads(_model(prof)) == truth


def test_export_rebuilds_the_facts_files(prof: Path) -> None:
    before = _model(prof)
    for path in _files(prof):
        path.unlink()
    proc = jobprof_cli("export", str(prof))
    assert proc.returncode == 0, proc.stderr
    assert "problem" not in proc.stderr
    assert len(_files(prof)) == 2
    assert _model(prof) == before


def test_export_decodes_each_operator_window_once(prof: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts take each iteration's parts as the export renders it: the windows (most of an
    export's reading) are decoded once, not again for the facts, and the facts are the same as
    computed from the raw data alone."""
    from jobprof.cli.main import main
    from jobprof.files import kinetotrace

    # compressed, and the last of each rank as Kineto wrote it (saved as the job ended)
    windows = sorted(p.name for p in prof.glob("device_*/data/kineto/window.*.json*"))
    assert len(windows) >= 20  # 2 ranks x 12 iterations, l0
    decoded: list[str] = []
    read = kinetotrace._read_window

    def counted(path: Path) -> bytes:
        decoded.append(Path(path).name)
        return read(path)

    monkeypatch.setattr(kinetotrace, "_read_window", counted)
    assert main(["export", str(prof)]) == 0
    assert sorted(decoded) == windows  # each once
    # the plain ones compressed since (read once more for that, not decoded)
    assert not list(prof.glob("device_*/data/kineto/window.*.json"))
    exported = {p.name: p.read_text().split("\n", 1)[1] for p in _files(prof)}  # below the stamp
    assert all(facts.read_file(p)["facts"]["plugins"]["task_memory"]["peak"]["allocated"] > 0
               for p in _files(prof))
    monkeypatch.undo()
    for path in _files(prof):
        path.unlink()
    manager = PluginManager(Reporter())
    manager.load_entry_points()
    facts.write(prof, manager)  # every part from the raw data
    assert {p.name: p.read_text().split("\n", 1)[1] for p in _files(prof)} == exported


def test_export_never_writes_facts_through_a_symlink(prof: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text("untouched")
    path = _files(prof)[0]
    path.unlink()
    path.symlink_to(victim)
    proc = jobprof_cli("export", str(prof))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "untouched"
    assert not path.is_symlink() and facts.read_file(path)["facts"]["device"] == 0


class _NotJson:
    @hookimpl
    def jobprof_rank_facts(self, profile: Profile, device: int) -> object:
        return {"a set": {1, 2}}


def test_a_plugin_whose_facts_are_not_json_is_failed_by_name(prof: Path) -> None:
    reporter = Reporter(stream=open(os.devnull, "w"))  # noqa: SIM115 (the reporter's stream for the test)
    manager = PluginManager(reporter)
    manager.load_entry_points()
    manager.register(_NotJson(), name="not_json")
    model = summary.summarize(Profile(prof), manager)
    assert [r["rank"] for r in model["ranks"]] == [0, 1]
    assert any("not_json" in m and "not JSON" in m for m in reporter.messages), reporter.messages


def test_bad_engine_arguments_are_refused_by_name(prof: Path) -> None:
    proc = jobprof_cli("summary", str(prof), "--jobs", "0")
    assert proc.returncode == 2 and "--jobs 0" in proc.stderr
    proc = jobprof_cli("summary", str(prof), "--engine", "spark")
    assert proc.returncode == 2 and "spark" in proc.stderr


def test_dask_workers_that_do_not_see_the_profile_are_named_before_any_task(prof: Path) -> None:
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        facts.check_workers(client, str(prof))  # a real worker sees a real folder: no error
        with pytest.raises(ValueError, match=r"2 of 2 Dask worker\(s\) do not see /nowhere/PROF_1 .*"
                                             r"same path on every worker"):
            facts.check_workers(client, "/nowhere/PROF_1")
