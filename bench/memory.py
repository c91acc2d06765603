"""memory: task_memory's cost against torch.profiler's ``profile_memory`` on the same jobs.

Workloads: bench/_optier_job.py's ``mlp`` and ``lm`` (quick: ``lm``).  Arms, one process each,
order rotated every round:

* ``base``: unprofiled;
* ``step`` / ``step_mem``: jobprof's step tier (training_trace), without and with task_memory
  (its sampler thread: RSS every 20 ms and at each hand-over);
* ``l1`` / ``l1_mem``: the operator tier (task_trace on), without and with task_memory (Kineto's
  memory profiling, the module-call recorder);
* ``torch`` / ``torch_mem``: ``torch.profiler`` (CPU, ``record_shapes``, a Chrome trace per
  step), without and with ``profile_memory=True``.

Each step's wall time is measured inside the loop (``prof.step()`` and jobprof's hand-over
included); t = the median steady-state step of an arm in a round, ratios per round, then the
median over rounds.  Rows:

* the step tier with task_memory / without: <= x1.01;
* the operator tier with task_memory: ``(t_l1_mem - t_base) / (t_torch_mem - t_base)`` <= 0.8
  (the operator tier's own target against torch.profiler, memory on both sides);
* what memory adds, per step: ``t_l1_mem - t_l1`` beside ``t_torch_mem - t_torch`` (info).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from optier_vs_torch import background_exporters

from common import HarnessError, clean_env, rotated, timed_run
from common import table_row as _row

JOB = Path(__file__).resolve().parent / "_optier_job.py"
WORKLOADS = ("mlp", "lm")
ARMS = ("base", "step", "step_mem", "l1", "l1_mem", "torch", "torch_mem")
STEP = {"training_trace": "on", "task_trace": "off"}
OPTIONS = {
    "step": STEP,
    "step_mem": {**STEP, "task_memory": "on"},
    "l1": {"training_trace": "on", "task_trace": "on"},
    "l1_mem": {"training_trace": "on", "task_trace": "on", "task_memory": "on"},
}
WARMUP = 10
TARGETS = {"step_mem": 1.01, "l1_mem": 0.8}


def _one(work: Path, workload: str, arm: str, tag: str, steps: int) -> float:
    out = work / tag
    timings = work / f"{tag}.json"
    extra: list[str] = []
    env = clean_env()
    if arm in OPTIONS:
        env = clean_env({"PROFILING_MODE": "true",
                         "PROFILING_OPTIONS": json.dumps({"output": str(out), **OPTIONS[arm]})})
    elif arm.startswith("torch"):
        env = clean_env({"KINETO_LOG_LEVEL": "6"})
        extra = ["--torch-profiler", str(out), *(["--profile-memory"] if arm == "torch_mem" else [])]
    cmd = [sys.executable, str(JOB), "--model", workload, "--steps", str(steps), "--timings", str(timings),
           *extra]
    ran = timed_run(cmd, env, cwd=str(work), timeout=900)
    times = json.loads(timings.read_text())
    if len(times) != steps:
        raise HarnessError(f"{workload}/{arm}: {len(times)} step times, {steps} expected\n"
                           f"{ran.stderr[-2000:]}")
    if arm in OPTIONS:
        background_exporters(out)  # rendered after the job: not in its steps, waited for here
        if arm.endswith("_mem") and not list(out.glob("PROF_*/device_*/summary/memory_record_*")):
            raise HarnessError(f"{workload}/{arm}: no memory_record file\n{ran.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(times[WARMUP:])


def run(rounds: int, steps: int, workloads: tuple[str, ...] = WORKLOADS) -> dict[str, Any]:
    data: dict[str, list[dict[str, float]]] = {w: [] for w in workloads}
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-mem-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            for w in workloads:
                order = rotated(ARMS, i)
                data[w].append({arm: _one(work, w, arm, f"{w}_{arm}{i}", steps) for arm in order})
    return {"rounds": rounds, "steps": steps, "warmup": WARMUP, "workloads": list(workloads), "data": data}


def _spread(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}} .. {max(values):{fmt}}" if len(values) > 1 else ""


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    n = f"{result['rounds']} rounds x {result['steps']} steps"
    for w, rounds in result["data"].items():
        ms = {a: statistics.median(r[a] for r in rounds) * 1e3 for a in ARMS}
        step = [r["step_mem"] / r["step"] for r in rounds]
        out.append(_row(f"memory {w}: task_memory on the step tier / the step tier alone ({n})",
                        f"{ms['step']:.2f} ms", f"{ms['step_mem']:.2f} ms", f"x{statistics.median(step):.3f}",
                        f"<= x{TARGETS['step_mem']}", statistics.median(step) <= TARGETS["step_mem"],
                        _spread(step, ".3f")))
        ratio = [(r["l1_mem"] - r["base"]) / (r["torch_mem"] - r["base"]) for r in rounds]
        out.append(_row(f"memory {w}: operator tier + task_memory overhead / torch.profiler profile_memory's",
                        f"{ms['base']:.2f} ms base, {ms['torch_mem']:.2f} torch", f"{ms['l1_mem']:.2f} ms",
                        f"{statistics.median(ratio):.3f}", f"<= {TARGETS['l1_mem']}",
                        statistics.median(ratio) <= TARGETS["l1_mem"], _spread(ratio, ".3f")))
        ours = [(r["l1_mem"] - r["l1"]) * 1e3 for r in rounds]
        theirs = [(r["torch_mem"] - r["torch"]) * 1e3 for r in rounds]
        out.append(_row(f"memory {w}: what memory adds per step, jobprof (l1) vs torch.profiler",
                        f"{statistics.median(theirs):+.2f} ms torch", f"{statistics.median(ours):+.2f} ms",
                        f"{statistics.median(ours):+.2f} vs {statistics.median(theirs):+.2f} ms", "-", None))
    return out
