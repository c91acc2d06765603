"""bigop: one iteration of very many tiny operators, whole process, against torch.profiler.

Workload (``JOB`` below, issue 47's case): three optimizer steps of a small Linear model, the
second with N ``t = t + 1`` (200k by default) between its backward and its step.  Arms, one
process each, order rotated every round:

* ``base``: unprofiled;
* ``jobprof``: training_trace + task_trace (operators with shapes: msprof's default tier),
  option ``export`` at its default ("background"): the job writes the raw data and hands what it
  did not render to a detached exporter; the harness then waits for that exporter
  (``jobprof export --wait``) and times it apart;
* ``inline``: the same with ``export: "inline"``: every file rendered inside the job;
* ``torch``: ``torch.profiler`` (CPU, ``record_shapes``) around the same loop, then
  ``export_chrome_trace``: what a user of it waits for to get one file.

Rows (medians over rounds): whole-process wall time added, jobprof's (and inline's) over torch's
``(t_jobprof - t_base) / (t_torch - t_base)`` <= 1.0; the cut of the big iteration's operator
window (Kineto's disable and save, inside the optimizer step that ends it, timed by the job)
over torch.profiler's stop and ``export_chrome_trace`` of the same operators <= 1.0; the exit:
from the end of the job's last step (it prints the time) to the process's end, jobprof's <= 2 s
(base's shown); the peak RSS of the process (its own VmHWM, ``common.own_peak_env``: wait4's
ru_maxrss is floored at the harness's size, which a full ``run.py`` grows past 500 MB) jobprof /
torch <= 1.0. Printed whatever the outcome.
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

from common import HarnessError, clean_env, own_peak_env, own_peak_kb

ARMS = ("base", "jobprof", "inline", "torch")
TARGETS = {"time": 1.0, "rss": 1.0, "exit_s": 2.0}
JOB = """
import sys, time, torch
n, trace = int(sys.argv[1]), sys.argv[2]
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
t = torch.zeros(4)
if trace:
    prof = torch.profiler.profile(record_shapes=True)
    prof.__enter__()
steps = []
for step in range(3):
    model(torch.randn(2, 4)).sum().backward()
    if step == 1:
        for _ in range(n):
            t = t + 1
    began = time.perf_counter()
    opt.step()  # jobprof cuts its operator window here (Kineto's disable and save)
    steps.append(time.perf_counter() - began)
    opt.zero_grad()
stop = 0.0
if trace:
    began = time.perf_counter()
    prof.__exit__(None, None, None)
    prof.export_chrome_trace(trace)
    stop = time.perf_counter() - began
print(float(t[0]))
print("cut", max(steps) if not trace else stop)
print("last", time.time(), flush=True)
"""


def _once(arm: str, n: int, work: Path) -> dict[str, float]:
    script = work / "bigop_job.py"
    script.write_text(JOB)
    out = work / f"out_{arm}"
    env = clean_env({"KINETO_LOG_LEVEL": "6"})
    trace = str(work / "torch_trace.json") if arm == "torch" else ""
    if arm in ("jobprof", "inline"):
        options = {"output": str(out), "training_trace": "on", "task_trace": "on"}
        if arm == "inline":
            options["export"] = "inline"
        env.update(PROFILING_MODE="true", PROFILING_OPTIONS=json.dumps(options))
    began = time.perf_counter()
    child = subprocess.Popen([sys.executable, str(script), str(n), trace],
                             env=own_peak_env(env, work / "peak"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    ended = time.time()
    wall = time.perf_counter() - began
    stdout = child.stdout.read().decode(errors="replace") if child.stdout else ""
    stderr = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise HarnessError(f"bigop {arm} exited {os.waitstatus_to_exitcode(status)}:\n{stderr[-2000:]}")
    last = [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("last ")]
    if not last:
        raise HarnessError(f"bigop {arm}: no 'last' line in its output:\n{stdout[-2000:]}")
    cut = [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("cut ")]
    result = {"wall_s": wall, "rss_mb": (own_peak_kb(stderr) or usage.ru_maxrss) / 1024,
              "exit_s": ended - last[0], "cut_s": cut[0]}
    if arm == "jobprof":  # what the exporter does after the job, timed apart
        began = time.perf_counter()
        jobprof = Path(sys.executable).with_name("jobprof")
        waited = subprocess.run([str(jobprof), "export", "--wait", str(out)], env=clean_env(),
                                capture_output=True, text=True)
        if waited.returncode != 0:
            raise HarnessError(f"bigop: jobprof export --wait exited {waited.returncode}:\n"
                               f"{waited.stderr[-2000:]}")
        result["exporter_s"] = time.perf_counter() - began
    if arm in ("jobprof", "inline") and not list(out.glob("PROF_*/device_0/summary/op_summary_*.csv")):
        raise HarnessError(f"bigop {arm}: no op_summary was rendered:\n{stderr[-2000:]}")
    return result


def run(rounds: int, n: int = 200_000) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for arm in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:
            with tempfile.TemporaryDirectory() as work:
                runs[arm].append(_once(arm, n, Path(work)))
    med = {arm: {k: statistics.median(x[k] for x in runs[arm]) for k in runs[arm][0]} for arm in ARMS}
    added = {arm: med[arm]["wall_s"] - med["base"]["wall_s"] for arm in ARMS}

    def ratio(arm: str) -> float:
        return added[arm] / added["torch"] if added["torch"] > 0 else float("inf")

    return {"rounds": rounds, "operators": n, "runs": runs, "median": med,
            "time_ratio": ratio("jobprof"), "inline_time_ratio": ratio("inline"),
            "rss_ratio": med["jobprof"]["rss_mb"] / med["torch"]["rss_mb"],
            "cut_ratio": med["jobprof"]["cut_s"] / med["torch"]["cut_s"],
            "inline_rss_ratio": med["inline"]["rss_mb"] / med["torch"]["rss_mb"]}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    m = result["median"]
    shape = f"({result['rounds']} rounds, one iteration of {result['operators']:,} operators)"

    def row(name: str, baseline: str, profiled: str, value: float, target: str) -> dict[str, Any]:
        return {"benchmark": name, "baseline": baseline, "profiled": profiled,
                "delta / ratio": f"{value:.2f}", "spread": "", "target": f"<= {TARGETS[target]}",
                "result": "pass" if value <= TARGETS[target] else "FAIL"}

    base_torch = f"{m['base']['wall_s']:.2f} s base, {m['torch']['wall_s']:.2f} s torch"
    return [
        row(f"bigop: whole process added, jobprof / torch.profiler+export {shape}", base_torch,
            f"{m['jobprof']['wall_s']:.2f} s (then its exporter {m['jobprof']['exporter_s']:.1f} s)",
            result["time_ratio"], "time"),
        row("bigop: the big window's cut (jobprof: its optimizer step) / torch.profiler's stop+export",
            f"{m['torch']['cut_s']:.2f} s torch, {m['base']['cut_s']:.3f} s base step",
            f"{m['jobprof']['cut_s']:.2f} s", result["cut_ratio"], "time"),
        row("bigop: the exit, from the last step to the process's end (s)",
            f"{m['base']['exit_s']:.2f} s base, {m['torch']['exit_s']:.2f} s torch",
            f"{m['jobprof']['exit_s']:.2f} s", m["jobprof"]["exit_s"], "exit_s"),
        row("bigop: peak RSS, jobprof / torch.profiler+export",
            f"{m['base']['rss_mb']:.0f} MB base, {m['torch']['rss_mb']:.0f} MB torch",
            f"{m['jobprof']['rss_mb']:.0f} MB", result["rss_ratio"], "rss"),
        row("bigop: export inline (every file in the job), whole process added / torch's", base_torch,
            f"{m['inline']['wall_s']:.2f} s", result["inline_time_ratio"], "time"),
        row("bigop: export inline, peak RSS / torch's", f"{m['torch']['rss_mb']:.0f} MB torch",
            f"{m['inline']['rss_mb']:.0f} MB", result["inline_rss_ratio"], "rss"),
    ]
