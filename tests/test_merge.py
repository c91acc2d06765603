"""``jobprof merge`` on real 2-rank gloo jobs: every event once, one process group per rank, one
time axis (the clock, or offsets recovered from the collectives), selections, partial profiles,
bounded memory."""

from __future__ import annotations

import json
import shutil
import statistics
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
from test_hccl import KILLED

from conftest import Runner, check_timeline, free_port, jobprof_cli, raw, time_axis, torchrun
from jobprof.analysis.merge import group_of, merge
from jobprof.analysis.selection import ranges

MODEL = 4294967295
STEPS = 24
SKEW_S = 5

JOB = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn

def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, {steps} + 1):
        model(torch.randn(8, 16)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        dist.broadcast(torch.ones(10), src=1)
        dist.barrier()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
""".replace("{steps}", str(STEPS))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("merge2"))
    runner.run(JOB, {"training_trace": "on", "task_trace": "l0", "hccl": "on"},
               args=[str(free_port())], timeout=300)
    [prof] = runner.prof_dirs()
    return prof


def merged(prof: Path, out: Path, *args: str) -> tuple[dict, str]:
    proc = jobprof_cli("merge", str(prof), "-o", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stderr


def inputs(prof: Path, rank: int, iterations: range | None = None) -> list[dict]:
    events = []
    for path in sorted((prof / f"device_{rank}" / "timeline").glob(f"msprof_{rank}_{MODEL}_*.json")):
        if iterations is None or int(path.stem.rsplit("_", 1)[1]) in iterations:
            events += json.loads(path.read_text())
    return events


def key(e: dict) -> tuple:
    """An event without the fields merge rewrites (pid, flow id, process renames / sort)."""
    return (e["ph"], e["name"], e.get("tid"), e.get("ts"), e.get("dur"), e.get("cat"),
            json.dumps(e.get("args"), sort_keys=True) if e["ph"] != "M" else "")


def by_rank(events: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in events:
        out.setdefault(group_of(e["pid"]), []).append(e)
    return out


def comm_ends(events: list[dict]) -> dict[int, dict[tuple, float]]:
    """{rank: {(group, seq, op): end}} of the merged Communication events."""
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    ends: dict[int, dict[tuple, float]] = {}
    for e in events:
        if e["ph"] == "X" and names[e["pid"]].endswith("· Communication"):
            args = e["args"]
            ends.setdefault(group_of(e["pid"]), {})[(args["group"], args["seq"], e["name"])] = \
                float(e["ts"]) + e["dur"]
    return ends


def end_gap(events: list[dict]) -> float:
    """Median over shared collectives of rank 1's end minus rank 0's, in the merged file (µs)."""
    ends = comm_ends(events)
    shared = ends[0].keys() & ends[1].keys()
    assert len(shared) >= STEPS * 4, len(shared)
    return statistics.median(ends[1][k] - ends[0][k] for k in shared)


@pytest.mark.slow
def test_every_event_once_in_one_group_per_rank(job: Path, tmp_path: Path) -> None:
    trace, stderr = merged(job, tmp_path / "m.json")
    assert stderr == ""
    assert trace["displayTimeUnit"] == "ms"
    meta = trace["metadata"]["jobprof"]
    assert meta["clock"] == "clock" and set(meta["ranks"]) == {"0", "1"}
    events = trace["traceEvents"]
    groups = by_rank(events)
    assert sorted(groups) == [0, 1]
    for rank in (0, 1):
        want = inputs(job, rank)
        assert meta["ranks"][str(rank)]["events"] == len(want) == len(groups[rank])
        assert Counter(map(key, groups[rank])) == Counter(map(key, want)), rank
        assert meta["ranks"][str(rank)]["offset_us"] == 0
        names = [e["args"]["name"] for e in groups[rank] if e["name"] == "process_name"]
        assert names and all(n.startswith(f"Rank {rank} · ") for n in names), names
        assert {n.split(" · ", 1)[1] for n in names} >= {"Ascend Hardware", "CANN", "Communication"}
        labels = {e["args"]["labels"] for e in groups[rank] if e["name"] == "process_labels"}
        assert labels == {"CPU", f"NPU {rank}"}
    # distinct pids: one name, one pid, within a rank; none shared between ranks
    pid_names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert len({p for p, _ in pid_names}) == len(pid_names) == len({n for _, n in pid_names})
    assert {group_of(p) for p, _ in pid_names} == {0, 1}
    # rank 0's processes sort before rank 1's
    sort = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    first, second = ([v for p, v in sort.items() if group_of(p) == g] for g in (0, 1))
    assert max(first) < min(second)
    # the viewer's checks: schema, nesting per track, flows paired, every process named
    (tmp_path / "events.json").write_text(json.dumps(events))
    check_timeline(tmp_path / "events.json")
    flows: dict[int, list[str]] = {}
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            flows.setdefault(e["id"], []).append(e["ph"])
    assert len(flows) >= 2 * STEPS  # HostToDevice links and Data_aug Bound pairs, both ranks
    assert all(sorted(p) == ["f", "s"] for p in flows.values()), flows
    assert {group_of(e["pid"]) for e in events if e["ph"] == "s"} == {0, 1}


@pytest.mark.slow
def test_ts_within_iterations_and_collectives_line_up(job: Path, tmp_path: Path) -> None:
    trace, _ = merged(job, tmp_path / "m.json")
    groups = by_rank(trace["traceEvents"])
    for rank in (0, 1):
        device = job / f"device_{rank}"
        axis = time_axis(device)
        windows = [(axis.us(s["iteration"][0]["start_ns"]), axis.us(s["iteration"][0]["end_ns"]))
                   for s in raw(device).values()]
        stamped = [float(e["ts"]) for e in groups[rank] if "ts" in e]
        assert len(stamped) > STEPS * 10
        outside = [ts for ts in stamped if not any(lo - 0.5 <= ts <= hi + 0.5 for lo, hi in windows)]
        assert not outside, (rank, len(outside))
    # one host, one clock: a collective ends on both ranks within a few ms
    assert abs(end_gap(trace["traceEvents"])) < 3000


@pytest.mark.slow
def test_align_collectives_recovers_an_injected_clock_skew(job: Path, tmp_path: Path) -> None:
    baseline = merge(job, tmp_path / "base.json", how="collectives").alignment.offsets[1] / 1000  # µs
    assert abs(baseline) < 3000  # same host: the clocks already agree
    skewed = tmp_path / job.name
    shutil.copytree(job, skewed)
    start = skewed / "device_1" / "start_info.1"
    info = json.loads(start.read_text())
    info["collectionTimeBegin"] = str(int(info["collectionTimeBegin"]) + SKEW_S * 1_000_000)
    start.write_text(json.dumps(info))
    proc = jobprof_cli("export", str(skewed))
    assert proc.returncode == 0, proc.stderr

    by_clock, _ = merged(skewed, tmp_path / "clock.json")
    assert end_gap(by_clock["traceEvents"]) == pytest.approx(SKEW_S * 1e6, abs=3000)
    aligned, _ = merged(skewed, tmp_path / "aligned.json", "--align", "collectives")
    meta = aligned["metadata"]["jobprof"]
    assert meta["clock"] == "collectives"
    assert meta["ranks"]["0"]["offset_us"] == 0
    offset = meta["ranks"]["1"]["offset_us"]
    assert offset == pytest.approx(-SKEW_S * 1e6 + baseline, abs=2000)
    assert meta["ranks"]["1"]["matched"] >= STEPS * 4
    assert abs(end_gap(aligned["traceEvents"])) < 3000


@pytest.mark.slow
def test_align_collectives_without_hccl_falls_back_to_the_clock(job: Path, tmp_path: Path) -> None:
    bare = tmp_path / job.name
    shutil.copytree(job, bare)
    for path in bare.glob("device_*/timeline/hccl_*.json"):
        path.unlink()
    trace, stderr = merged(bare, tmp_path / "m.json", "--align", "collectives")
    assert "has no hccl timeline" in stderr and "aligned by the clock instead" in stderr
    assert trace["metadata"]["jobprof"]["clock"] == "clock"


@pytest.mark.slow
def test_rank_and_iteration_selection(job: Path, tmp_path: Path) -> None:
    trace, _ = merged(job, tmp_path / "r1.json", "--rank", "1")
    assert set(by_rank(trace["traceEvents"])) == {0}  # the only group, first block
    assert Counter(map(key, trace["traceEvents"])) == Counter(map(key, inputs(job, 1)))
    assert set(trace["metadata"]["jobprof"]["ranks"]) == {"1"}

    trace, _ = merged(job, tmp_path / "i.json", "--iterations", "3-5")
    groups = by_rank(trace["traceEvents"])
    for rank in (0, 1):
        assert Counter(map(key, groups[rank])) == Counter(map(key, inputs(job, rank, range(3, 6))))
        assert trace["metadata"]["jobprof"]["ranks"][str(rank)]["iterations"] == "3-5"

    for args, message in ((["--iterations", "500-600"], "nothing to merge"), (["--rank", "7"], "no rank 7"),
                          (["--iterations", "5-2"], "is empty")):
        proc = jobprof_cli("merge", str(job), "-o", str(tmp_path / "none.json"), *args)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)
        assert not (tmp_path / "none.json").exists()


@pytest.mark.slow
def test_default_output_is_the_current_folder_and_the_profile_is_untouched(job: Path, tmp_path: Path) -> None:
    """One rule for every command: only ``export`` writes into a profile (its own msprof files);
    merge, like report and kineto, writes into the current folder unless told otherwise."""
    def files() -> dict[str, tuple[int, int]]:
        return {str(p.relative_to(job)): (p.stat().st_size, p.stat().st_mtime_ns) for p in job.rglob("*")}

    before = files()
    proc = jobprof_cli("merge", str(job), "--iterations", "2-3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "merged.json").is_file()
    assert "merged.json" in proc.stdout, proc.stdout  # it says where it wrote
    assert files() == before


@pytest.mark.slow
def test_killed_rank_and_missing_timelines(runner: Runner, tmp_path: Path) -> None:
    launcher = torchrun(runner, runner.script(KILLED, "killed.py"), 2)
    runner.run(launcher, {"training_trace": "on", "task_trace": "off", "hccl": "on"},
               timeout=300, check=False)
    [prof] = runner.prof_dirs()
    assert not (prof / "device_1" / "end_info.1").exists()
    for path in (prof / "device_0" / "timeline").glob(f"msprof_0_{MODEL}_[23].json"):
        path.unlink()
    # rank 0 may itself be killed by torchrun before it renders its last iteration, so the
    # expected gap is what is on disk: the two deleted files plus any iteration never rendered
    timelines = (prof / "device_0" / "timeline").glob(f"msprof_0_{MODEL}_*.json")
    rendered = {int(p.stem.rsplit("_", 1)[1]) for p in timelines}
    missing = set(raw(prof / "device_0")) - rendered
    assert {2, 3} <= missing, missing
    trace, stderr = merged(prof, tmp_path / "m.json")
    gap = (f"rank 0: iterations {', '.join(ranges(missing))} have raw data but no timeline file: "
           "run `jobprof export")
    assert gap in stderr, stderr
    assert "rank 1: no end_info (the process did not finish)" in stderr
    groups = by_rank(trace["traceEvents"])
    assert Counter(map(key, groups[0])) == Counter(map(key, inputs(prof, 0)))
    assert Counter(map(key, groups[1])) == Counter(map(key, inputs(prof, 1)))
    assert trace["metadata"]["jobprof"]["ranks"]["1"]["finished"] is False


@pytest.mark.slow
def test_memory_stays_bounded(job: Path, tmp_path: Path) -> None:
    """Peak memory merging all iterations is about that of a quarter of them: one file at a time."""
    peaks = {}
    for last in (STEPS // 4, STEPS):
        tracemalloc.start()
        result = merge(job, tmp_path / f"m{last}.json", iterations=(1, last))
        peaks[last] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert result.files == 2 * last
        assert sum(result.events.values()) == sum(len(inputs(job, r, range(1, last + 1))) for r in (0, 1))
    size = sum(p.stat().st_size for p in job.glob(f"device_*/timeline/msprof_*_{MODEL}_*.json"))
    assert peaks[STEPS] < 1.5 * peaks[STEPS // 4], peaks
    assert peaks[STEPS] < size / 2, (peaks, size)  # far below holding every input at once


def test_the_closing_line_of_a_many_rank_merge_gives_totals_and_extremes() -> None:
    from jobprof.cli.merge import RANKS_LISTED, _per_rank

    few = {str(r): {"events": 10 + r, "offset_us": 0.5 * r} for r in range(2)}
    assert _per_rank(few) == "rank 0: 10 events (offset +0.0 us), rank 1: 11 events (offset +0.5 us)"
    many = {str(r): {"events": 100 + (r % 7), "offset_us": -3.0 if r == 9 else 0.1} for r in range(40)}
    line = _per_rank(many)
    assert len(many) > RANKS_LISTED
    assert line == ("40 ranks, 4,115 events (fewest: rank 0, 100; most: rank 6, 106); "
                    "largest offset: rank 9, -3.0 us")
