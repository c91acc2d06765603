"""Huawei's msprof-analyze and MindInsight (PyPI, each in its own venv: .ci/run installs them and
names them in ``JOBPROF_MSPROF_ANALYZE`` / ``JOBPROF_MINDINSIGHT_PYTHON``) read jobprof's CANN 8
export and find what is true of the job.

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
#: the python of a venv holding MindInsight (.ci/run installs it)
MINDINSIGHT = os.environ.get("JOBPROF_MINDINSIGHT_PYTHON", "")
needs_tool = pytest.mark.skipif(not TOOL, reason="JOBPROF_MSPROF_ANALYZE names no msprof-analyze "
                                                 "(.ci/run installs it)")


def msprof_analyze(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    assert Path(TOOL).is_file(), f"JOBPROF_MSPROF_ANALYZE={TOOL}: no such file"
    return subprocess.run([TOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def advisor_problems(prof_dir: Path, cwd: Path) -> list[str]:
    """`advisor all` in agent mode (JSON on stdout), English: the problems' categories."""
    out = cwd / "advisor"
    out.mkdir()
    proc = msprof_analyze("advisor", "all", "-d", str(prof_dir), "-o", str(out), "-l", "en", "--agent",
                          cwd=cwd)
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


@needs_tool
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


SLOW_RANK = """
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn

def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range({steps}):
        if rank == 1:
            time.sleep({sleep_s})  # rank 1 is late to every iteration's all-reduce: rank 0 waits
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
"""
STEPS, SLEEP_S = 8, 0.15


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank DDP job whose rank 1 sleeps 150 ms before each iteration, exported one PROF_ per rank."""
    from conftest import free_port

    runner = Runner(tmp_path_factory.mktemp("msprof_analyze"))
    job = SLOW_RANK.replace("{steps}", str(STEPS)).replace("{sleep_s}", str(SLEEP_S))
    runner.run(job, {"training_trace": "on", "task_trace": "on", "hccl": "on"}, args=[str(free_port())],
               timeout=300)
    out = runner.tmp / "ranks"
    proc = jobprof_cli("export", str(runner.out), "--per-rank", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "2 PROF_ folder(s), one per rank" in proc.stdout, proc.stdout
    return out


@needs_tool
def test_cluster_step_time_and_communication_show_the_rank_that_made_the_other_wait(per_rank: Path) -> None:
    """`cluster -m all` on the per-rank export: two ranks in cluster_step_trace_time.csv; rank 0
    (which waits at every all-reduce for rank 1) has the uncovered communication, rank 1 (which
    sleeps) the free time; cluster_communication.json's wait says the same."""
    out = per_rank.parent / "cluster"
    proc = msprof_analyze("cluster", "-d", str(per_rank), "-m", "all", "-o", str(out), cwd=per_rank.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = out / "cluster_analysis_output"
    import csv

    rows = {int(r["Index"]): r for r in csv.DictReader((result / "cluster_step_trace_time.csv").open())}
    assert sorted(rows) == [0, 1], rows
    slept_us = (STEPS - 1) * SLEEP_S * 1e6  # the first iteration's wait may hide in set-up
    uncovered = {r: float(rows[r]["Communication(Not Overlapped)"]) for r in rows}
    free = {r: float(rows[r]["Free"]) for r in rows}
    # half of it at least: on a loaded machine rank 0 is sometimes late too
    assert uncovered[0] - uncovered[1] > 0.5 * slept_us, rows
    assert free[1] - free[0] > 0.5 * slept_us, rows
    communication = json.loads((result / "cluster_communication.json").read_text())
    [(group, steps)] = communication.items()
    assert json.loads(group.replace("(", "[").replace(")", "]")) == [0, 1]
    # the all-reduces of the loop (the set-up's collectives wait for whichever rank started last)
    waits = {0: 0.0, 1: 0.0}
    for op, per_rank in steps["step"].items():
        if op.startswith("hcom_allReduce"):
            for rank, info in per_rank.items():
                waits[int(rank)] += info["Communication Time Info"]["Wait Time(ms)"]
    assert waits[0] > 0.5 * slept_us / 1000 and waits[1] < waits[0] / 2, waits


@needs_tool
def test_compare_shows_the_waiting_rank_waiting(per_rank: Path) -> None:
    """`compare` of rank 1 (-d) against rank 0 (-bp, the base, printed first): rank 0's
    uncovered communication is mostly wait; rank 1's is not."""
    import re

    [base] = per_rank.glob("PROF_*R000/mindstudio_profiler_output/msprof_*.json")
    [other] = per_rank.glob("PROF_*R001/mindstudio_profiler_output/msprof_*.json")
    out = per_rank.parent / "compare"
    out.mkdir()
    proc = msprof_analyze("compare", "-d", str(other), "-bp", str(base), "-o", str(out), cwd=per_rank.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # | NPU | ... | <uncovered>s(<wait>s) | <free>s | <e2e>s |: the base's row first
    rows = re.findall(r"\|\s*NPU\s*\|.*?([\d.]+)s\(([\d.]+)s\)", proc.stdout)
    assert len(rows) == 2, proc.stdout
    (base_uncovered, base_wait), (_, other_wait) = ((float(a), float(b)) for a, b in rows)
    slept_s = (STEPS - 1) * SLEEP_S
    assert base_wait > 0.5 * slept_s and base_wait <= base_uncovered, proc.stdout
    assert float(other_wait) < base_wait / 2, proc.stdout


MINDINSIGHT_READ = """
import collections, json, sys
from mindinsight.profiler.analyser.msprof_timeline_analyser import MsprofTimelineAnalyser
analyser = MsprofTimelineAnalyser(sys.argv[1])
events = analyser.get_merged_timeline([], [], "detail")
names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
spans = collections.Counter(names.get(e["pid"], "?") for e in events if e.get("ph") == "X")
print(json.dumps({"ranks": analyser.get_option()["rank_list"], "spans": spans}))
"""


@pytest.mark.skipif(not MINDINSIGHT, reason="JOBPROF_MINDINSIGHT_PYTHON names no MindInsight "
                                             "(.ci/run installs it)")
def test_mindinsight_merges_both_ranks_of_the_per_rank_export(per_rank: Path) -> None:
    """MindInsight's msprof timeline analyser on the per-rank export: ranks 0 and 1, each with
    its own hardware and HCCL tracks holding that rank's operators and collectives (on the
    job's one PROF_ it saw a single "Rank1")."""
    proc = subprocess.run([MINDINSIGHT, "-c", MINDINSIGHT_READ, str(per_rank)], capture_output=True,
                          text=True, timeout=300, cwd=per_rank.parent)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["ranks"] == [0, 1], answer
    for rank in (0, 1):
        [folder] = per_rank.glob(f"PROF_*R{rank:03d}")
        [timeline] = (folder / "mindstudio_profiler_output").glob("msprof_*.json")
        ours = json.loads(timeline.read_text())
        pid = {e["args"]["name"]: e["pid"] for e in ours if e["ph"] == "M" and e["name"] == "process_name"}
        device = pid["Ascend Hardware"]
        # its own track for the step trace, which jobprof (as msprof) draws in the device process
        steps = {e["tid"] for e in ours if e["ph"] == "M" and e["name"] == "thread_name"
                 and e["pid"] == device and e["args"]["name"].startswith(("Step Trace", "Reduce"))}
        tasks = sum(1 for e in ours if e["ph"] == "X" and e["pid"] == device and e["tid"] not in steps)
        assert answer["spans"][f"Ascend Hardware Rank{rank}"] == tasks > 0, answer
        # the collectives, and their wait / transit tasks (docs/msprof-tools.md)
        collectives = sum(1 for e in ours if e["ph"] == "X" and e["pid"] == pid["HCCL"])
        assert answer["spans"][f"HCCL Rank{rank}"] == collectives > 0, answer
