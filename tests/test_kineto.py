"""kineto: per-iteration traces in PyTorch profiler's JSON format, read back by HTA.

A real 2-rank gloo DDP job (torch.multiprocessing.spawn) with training_trace, task_trace, hccl
and kineto_trace on: every iteration has one file per rank, with the rank's distributedInfo,
one ProfilerStep#<iteration - 1> spanning the iteration, the op_summary tasks as pseudo-device
kernels and the collectives; `jobprof kineto` gathers the ranks' files of an iteration and
Holistic Trace Analysis's temporal breakdown agrees with op_summary.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import Runner, free_port, jobprof_cli, raw, read_csv, stamp_ts, time_axis, ts_ns
from jobprof.plugins.kineto.writer import PSEUDO_PID_BASE

MODEL = 4294967295
STEPS = 4

DDP_JOB = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range({steps}):
        opt.zero_grad()
        model(torch.randn(16, 32)).sum().backward()
        dist.all_reduce(torch.ones(100))
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
""".replace("{steps}", str(STEPS))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runner, Path, str]:
    runner = Runner(tmp_path_factory.mktemp("kineto2"))
    proc = runner.run(DDP_JOB, {"training_trace": "on", "task_trace": "on", "hccl": "on",
                                "kineto_trace": "on"}, args=[str(free_port())], timeout=300)
    [prof] = runner.prof_dirs()
    return runner, prof, proc.stderr


def trace(device: Path, rank: int, iteration: int) -> dict:
    return json.loads((device / "timeline" / f"kineto_{rank}_{MODEL}_{iteration}.json").read_text())




def assert_tracks_nest(events: list[dict]) -> None:
    """X events on one (pid, tid) nest in integer ns (as Perfetto reads them)."""
    tracks: dict[tuple, list[tuple[int, int]]] = {}
    for e in events:
        if e["ph"] == "X":
            start = ts_ns(e["ts"])
            tracks.setdefault((e["pid"], e["tid"]), []).append((start, start + ts_ns(e["dur"])))
    for key, spans in tracks.items():
        stack: list[int] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"track {key}: ({start}, {end}) ns overlaps {stack[-1]}"
            stack.append(end)


@pytest.mark.slow
def test_files_per_rank_and_iteration(job: tuple[Runner, Path, str]) -> None:
    _, prof, stderr = job
    assert "jobprof: warning" not in stderr and "jobprof: error" not in stderr, stderr
    for rank in (0, 1):
        device = prof / f"device_{rank}"
        raws, axis = raw(device), time_axis(device)
        to_us = axis.us
        pid = int(json.loads((device / f"info.json.{rank}").read_text())["pid"])
        assert sorted(raws) == list(range(1, STEPS + 1))
        for i in range(1, STEPS + 1):
            doc = trace(device, rank, i)
            assert list(doc)[:3] == ["schemaVersion", "deviceProperties", "distributedInfo"]
            assert doc["distributedInfo"] == {"backend": "gloo", "rank": rank, "world_size": 2}
            assert doc["baseTimeNanoseconds"] == axis.base_ns and doc["displayTimeUnit"] == "ms"
            assert doc["traceName"] == f"kineto_{rank}_{MODEL}_{i}.json"
            assert doc["jobprof"]["device_tasks"] == "cpu_pseudo_device"
            events = doc["traceEvents"]
            assert_tracks_nest(events)
            # exactly one ProfilerStep, numbered as torch.profiler does, spanning the iteration
            steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
            assert [e["name"] for e in steps] == [f"ProfilerStep#{i - 1}"]
            it = raws[i]["iteration"][0]
            step = steps[0]
            assert step["cat"] == "user_annotation" and step["pid"] == pid
            assert step["ts"] == to_us(it["start_ns"])
            assert step["dur"] == (it["end_ns"] - it["start_ns"]) / 1000
            # every op_summary row is one kernel on the pseudo device, in order, same times
            rows = read_csv(device / "summary" / f"op_summary_{rank}_{MODEL}_{i}.csv")
            kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
            assert rows and len(kernels) == len(rows)
            for row, k in zip(rows, kernels, strict=True):
                assert k["name"] == row["Op Name"] and k["pid"] == PSEUDO_PID_BASE + rank
                assert k["args"]["stream"] == int(row["Stream ID"]) == k["tid"]
                assert k["args"]["jobprof pseudo device"] is True
                # exact: job-relative ts, dur from integer ns
                assert Decimal(repr(k["dur"])) == Decimal(row["Task Duration(us)"])
                assert Decimal(repr(k["ts"])) == stamp_ts(row["Task Start Time(us)"], device)
            # each kernel shares its correlation with exactly one cpu_op (its operator)
            ops = {e["args"]["correlation"]: e for e in events
                   if e.get("cat") == "cpu_op" and "correlation" in e["args"]}
            assert all(ops[k["args"]["correlation"]]["name"] == k["name"] for k in kernels)
            # every host operator record of the ops stream is there, as cpu_op or user_annotation
            host = [r for r in raws[i]["ops"] if r[4] in ("cpu_op", "user_annotation")]
            written = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")
                       and "jobprof source" not in e["args"] and not e["name"].startswith("ProfilerStep#")]
            assert len(written) == len(host)
            # the collectives of the hccl stream, with their sizes
            collectives = [e for e in events if e["args"].get("jobprof source") == "hccl"]
            assert len(collectives) == len(raws[i]["hccl"]) > 0
            names = sorted(e["args"]["Collective name"] for e in collectives)
            assert names == sorted(r["op"] for r in raws[i]["hccl"]) and "all_reduce" in names
            assert any(e["args"]["In msg nelems"] == 100 for e in collectives)
            phases = {e["name"] for e in events if e["args"].get("jobprof source") == "training_trace"}
            assert {"FP_BP", "Iteration Refresh"} <= phases


@pytest.mark.slow
def test_export_renders_the_same_files(job: tuple[Runner, Path, str]) -> None:
    _, prof, _ = job
    before = {p: p.read_bytes() for p in sorted(prof.glob("device_*/timeline/kineto_*.json"))}
    assert len(before) == 2 * STEPS
    proc = jobprof_cli("export", str(prof))
    assert proc.returncode == 0, proc.stderr
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.slow
def test_hta_temporal_breakdown(job: tuple[Runner, Path, str], tmp_path: Path) -> None:
    """`jobprof kineto` makes one folder per iteration; HTA reads it and its numbers are ours."""
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    _, prof, _ = job
    out = tmp_path / "kineto"
    proc = jobprof_cli("kineto", str(prof), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(f"iteration_{i}" for i in range(1, STEPS + 1))
    iteration = 3
    folder = out / f"iteration_{iteration}"
    assert sorted(p.name for p in folder.iterdir()) == ["rank_0.pt.trace.json", "rank_1.pt.trace.json"]
    analysis = trace_analysis.TraceAnalysis(trace_dir=str(folder))
    table = analysis.get_temporal_breakdown(visualize=False)
    assert sorted(table["rank"]) == [0, 1]
    for rank in (0, 1):
        row = table[table["rank"] == rank].iloc[0]
        tasks = read_csv(prof / f"device_{rank}" / "summary" / f"op_summary_{rank}_{MODEL}_{iteration}.csv")
        durs = [float(t["Task Duration(us)"]) for t in tasks]
        starts = [float(t["Task Start Time(us)"]) for t in tasks]
        span = max(s + d for s, d in zip(starts, durs, strict=True)) - min(starts)
        # HTA rounds each ts and dur down to whole µs: up to 1 µs per task (2 at the span's ends)
        assert row["compute_time(us)"] == pytest.approx(sum(durs), abs=2 * len(tasks) + 2)
        assert row["kernel_time(us)"] == pytest.approx(span, abs=3)
        assert row["idle_time(us)"] == pytest.approx(span - sum(durs), abs=2 * len(tasks) + 3)
    # the grammar of every command: --iterations A-B and --rank R narrow what is gathered
    narrow = tmp_path / "narrow"
    proc = jobprof_cli("kineto", str(prof), "-o", str(narrow), "--iterations", "2-3", "--rank", "1")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in narrow.iterdir()) == ["iteration_2", "iteration_3"]
    assert [p.name for p in (narrow / "iteration_2").iterdir()] == ["rank_1.pt.trace.json"]
    bad = jobprof_cli("kineto", str(prof), "-o", str(tmp_path / "bad"), "--iterations", "x")
    assert bad.returncode == 1 and "iterations" in bad.stderr, bad.stderr


def test_task_trace_off_still_has_steps(runner: Runner) -> None:
    """Without task_trace: ProfilerStep and the step phases, no device work, a note at start;
    a job that is not distributed says rank 0 of 1 (torch omits distributedInfo, and HTA then
    warns that the file has no rank): HTA reads it without a warning."""
    proc = runner.run("""
        import torch
        from torch import nn
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    """, {"training_trace": "on", "task_trace": "off", "kineto_trace": "on"})
    assert "kineto_trace: task_trace is off" in proc.stderr
    assert "jobprof: warning" not in proc.stderr and "jobprof: error" not in proc.stderr, proc.stderr
    device = runner.device_dir()
    for i in (1, 2, 3):
        doc = trace(device, 0, i)
        assert doc["distributedInfo"] == {"rank": 0, "world_size": 1}
        assert doc["jobprof"]["device_tasks"] == "none"
        names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
        assert names.count(f"ProfilerStep#{i - 1}") == 1 and "FP_BP" in names
        assert not [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "cpu_op")]
    proc = jobprof_cli("kineto", str(runner.out), "--iterations", "2", cwd=runner.tmp)
    assert proc.returncode == 0, proc.stderr
    [prof] = runner.prof_dirs()
    assert not (prof / "kineto").exists()  # the default: ./kineto, never into the profile
    prof = runner.tmp
    assert [p.name for p in (prof / "kineto").iterdir()] == ["iteration_2"]
    trace_file = pytest.importorskip("hta.common.trace_file")
    # HTA's logger does not propagate (its logging.config): listen on it directly
    warned: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warned.append  # type: ignore[method-assign]
    hta_logger = logging.getLogger("hta")
    hta_logger.addHandler(handler)
    try:
        ok, ranks = trace_file.create_rank_to_trace_dict(
            [str(p) for p in (prof / "kineto" / "iteration_2").iterdir()])
    finally:
        hta_logger.removeHandler(handler)
    assert ok and list(ranks) == [0]
    assert not warned, [r.getMessage() for r in warned]


def test_option_off_writes_nothing(runner: Runner) -> None:
    runner.run("""
        import torch
        from torch import nn
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    """, {"task_trace": "l0"})
    assert not list(runner.device_dir().glob("timeline/kineto_*"))
    proc = jobprof_cli("kineto", str(runner.out))
    assert proc.returncode == 1 and "no kineto_*.json files" in proc.stderr
