"""bigop: one iteration of very many tiny operators, whole process, against torch.profiler.

Workload (``JOB`` below): three iterations of a small Linear model, the middle one with N
in-place negations (200k by default: the case issue 29 found turning a 2.7 s job into 123 s).
Arms, one process each, order rotated every round:

* ``base``: unprofiled;
* ``jobprof``: training_trace + task_trace on (operators with shapes: msprof's default tier),
  every file rendered at exit;
* ``torch``: ``torch.profiler`` (CPU, ``record_shapes``) around the same loop, then
  ``export_chrome_trace``: what a user of it waits for to get one file.

Rows (medians over rounds): whole-process wall time added, jobprof's over torch's
``(t_jobprof - t_base) / (t_torch - t_base)`` <= 1.0; the peak RSS of the process
(``wait4``'s ru_maxrss: this harness imports no torch, so its own size, a floor carried into
the child, is far below either arm's) jobprof / torch <= 1.0.  Printed whatever the outcome.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env

ARMS = ("base", "jobprof", "torch")
TARGETS = {"time": 1.0, "rss": 1.0}
JOB = """
import sys, torch
n, trace = int(sys.argv[1]), sys.argv[2]
model, x = torch.nn.Linear(4, 4), torch.zeros(4)
if trace:
    prof = torch.profiler.profile(record_shapes=True)
    prof.__enter__()
for step in range(3):
    out = model(torch.randn(2, 4)).sum()
    if step == 1:
        for _ in range(n):
            x.neg_()
    out.backward()
if trace:
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(trace)
print(float(x[0]))
"""


def _once(arm: str, n: int, work: Path) -> dict[str, float]:
    script = work / "bigop_job.py"
    script.write_text(JOB)
    out = work / f"out_{arm}"
    env = clean_env({"KINETO_LOG_LEVEL": "6"})
    trace = str(work / "torch_trace.json") if arm == "torch" else ""
    if arm == "jobprof":
        env.update(PROFILING_MODE="true", PROFILING_OPTIONS=json.dumps(
            {"output": str(out), "export": "inline", "training_trace": "on", "task_trace": "on"}))
    began = time.perf_counter()
    child = subprocess.Popen([sys.executable, str(script), str(n), trace], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    stderr = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise HarnessError(f"bigop {arm} exited {os.waitstatus_to_exitcode(status)}:\n{stderr[-2000:]}")
    if arm == "jobprof" and not list(out.glob("PROF_*/device_0/summary/op_summary_*.csv")):
        raise HarnessError(f"bigop: the profiled run wrote no op_summary:\n{stderr[-2000:]}")
    return {"wall_s": wall, "rss_mb": usage.ru_maxrss / 1024}


def run(rounds: int, n: int = 200_000) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for arm in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:
            with tempfile.TemporaryDirectory() as work:
                runs[arm].append(_once(arm, n, Path(work)))
    med = {arm: {k: statistics.median(x[k] for x in runs[arm]) for k in ("wall_s", "rss_mb")}
           for arm in ARMS}
    added = {arm: med[arm]["wall_s"] - med["base"]["wall_s"] for arm in ("jobprof", "torch")}
    return {"rounds": rounds, "operators": n, "runs": runs, "median": med,
            "time_ratio": added["jobprof"] / added["torch"] if added["torch"] > 0 else float("inf"),
            "rss_ratio": med["jobprof"]["rss_mb"] / med["torch"]["rss_mb"]}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    m = result["median"]
    shape = f"({result['rounds']} rounds, one iteration of {result['operators']:,} operators)"
    t, r = result["time_ratio"], result["rss_ratio"]
    return [
        {"benchmark": f"bigop: whole process added, jobprof / torch.profiler+export {shape}",
         "baseline": f"{m['base']['wall_s']:.2f} s base, {m['torch']['wall_s']:.2f} s torch",
         "profiled": f"{m['jobprof']['wall_s']:.2f} s", "delta / ratio": f"{t:.2f}", "spread": "",
         "target": f"<= {TARGETS['time']}", "result": "pass" if t <= TARGETS["time"] else "FAIL"},
        {"benchmark": "bigop: peak RSS, jobprof / torch.profiler+export",
         "baseline": f"{m['base']['rss_mb']:.0f} MB base, {m['torch']['rss_mb']:.0f} MB torch",
         "profiled": f"{m['jobprof']['rss_mb']:.0f} MB", "delta / ratio": f"{r:.2f}", "spread": "",
         "target": f"<= {TARGETS['rss']}", "result": "pass" if r <= TARGETS["rss"] else "FAIL"},
    ]
