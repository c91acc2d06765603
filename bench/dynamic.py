"""Dynamic mode (PROFILING_MODE=dynamic): its idle cost, and how long ``jobprof start`` takes.

Idle cost: examples/train_mlp.py (its own per-step wall times, ``--timings``), arms in a rotated
order in every round: unprofiled; ``PROFILING_MODE=true`` with the step tier
(``training_trace``); dynamic mode with ``training_trace`` off (the controller alone: the
control folder listed every 0.1 s, the status written every second); dynamic with the step
tier; dynamic with the step tier and triggers that never fire (``slow_iteration`` and
``memory_growth`` checked every iteration).  The controller's own time per iteration, timed
inside the step by the controller itself, comes from each rank's status file.

Start latency: one dynamic run of the example, ``jobprof start --iterations 10 --wait`` once the
job runs; from the request's writing to the capture's first boundary (``capture.latency_s``),
and in iterations (the first captured iteration less the one the job was at when asked).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, rotated, summary, table_row, timed_run, wait_exporters

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_mlp.py"
WARMUP_STEPS = 10
TARGET_RATIO = 1.01
STEP_TIER = {"training_trace": "on", "task_trace": "off"}
#: triggers that are checked at every iteration and never fire
QUIET_TRIGGERS = {"slow_iteration": 1000, "memory_growth": 1000000}
ARMS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "unprofiled": (None, {}),
    "true, step tier": ("true", STEP_TIER),
    "dynamic, no step tier": ("dynamic", {"training_trace": "off"}),
    "dynamic, step tier": ("dynamic", STEP_TIER),
    "dynamic, step tier, triggers": ("dynamic", {**STEP_TIER, "trigger": QUIET_TRIGGERS}),
}


def _env(mode: str | None, options: dict[str, Any], output: Path) -> dict[str, str]:
    if mode is None:
        return clean_env()
    return clean_env({"PROFILING_MODE": mode,
                      "PROFILING_OPTIONS": json.dumps({"output": str(output), **options})})


def _own_us(output: Path) -> float | None:
    found = [json.loads(p.read_text()).get("own_us_per_iteration")
             for p in output.glob("PROF_*/control/rank_*.json")]
    found = [x for x in found if x is not None]
    return statistics.median(found) if found else None


def run(rounds: int, steps: int = 200) -> dict[str, Any]:
    args = ["--steps", str(steps), "--workers", "2"]
    per_arm: dict[str, list[float]] = {name: [] for name in ARMS}
    own: dict[str, list[float]] = {name: [] for name in ARMS}
    stderr: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-dynamic-") as tmp:
        work = Path(tmp)
        for r in range(rounds):
            for name in rotated(list(ARMS), r):
                mode, options = ARMS[name]
                tag = f"{r}-{list(ARMS).index(name)}"
                output = work / f"prof{tag}"
                timings = work / f"{tag}.json"
                out = timed_run([sys.executable, str(EXAMPLE), *args, "--timings", str(timings)],
                                _env(mode, options, output), cwd=str(work))
                wait_exporters(output)  # the default export's exporter: done before the next run
                if out.stderr.strip():
                    stderr.add(out.stderr.strip()[-500:])
                step_s = json.loads(timings.read_text())[WARMUP_STEPS:]
                if not step_s:
                    raise HarnessError(f"{name}: no steady steps recorded")
                per_arm[name].append(statistics.median(step_s))
                if mode == "dynamic":
                    value = _own_us(output)
                    if value is None:
                        raise HarnessError(f"{name}: no status file under {output} (dynamic mode "
                                           "did not run)")
                    own[name].append(value)
        latency = _latency(work, steps=3000)  # ~10 s at this example's 4 ms steps
    base = statistics.median(per_arm["unprofiled"])
    true_tier = statistics.median(per_arm["true, step tier"])
    return {"rounds": rounds, "steps": steps, "arms": list(ARMS),
            "median_step_ms": {k: summary(v, 1e3) for k, v in per_arm.items()},
            "ratio_to_unprofiled": {k: statistics.median(v) / base for k, v in per_arm.items()},
            "ratio_to_true_step_tier": {k: statistics.median(v) / true_tier for k, v in per_arm.items()},
            "own_us_per_iteration": {k: statistics.median(v) for k, v in own.items() if v},
            "latency": latency, "stderr": sorted(stderr)}


def _latency(work: Path, steps: int) -> dict[str, Any]:
    output = work / "latency"
    exe = Path(sys.executable).with_name("jobprof")
    env = _env("dynamic", {**STEP_TIER, "task_trace": "on"}, output)
    job = subprocess.Popen([sys.executable, str(EXAMPLE), "--steps", str(steps), "--workers", "2"],
                           env=env, cwd=str(work), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.monotonic() + 120
        at = None
        while time.monotonic() < deadline and job.poll() is None:
            done = subprocess.run([str(exe), "status", "--json", "--job", str(output)],
                                  capture_output=True, text=True, env=clean_env())
            if done.returncode == 0:
                ranks = json.loads(done.stdout)["ranks"]
                if ranks and ranks[0]["iteration"] >= 30 and ranks[0]["rate"]:
                    at = ranks[0]["iteration"]
                    break
            time.sleep(0.2)
        if at is None:
            raise HarnessError("latency: the job never reported iteration 30")
        asked = time.monotonic()
        done = subprocess.run([str(exe), "start", "--job", str(output), "--iterations", "10", "--wait"],
                              capture_output=True, text=True, env=clean_env(), timeout=300)
        if done.returncode != 0:
            raise HarnessError(f"latency: jobprof start failed: {done.stderr}")
        waited = time.monotonic() - asked
    finally:
        job.communicate(timeout=300)
    found = [json.loads(p.read_text())["jobprof"] for p in output.glob("PROF_*/device_*/info.json.*")
             if not p.name.endswith(".done")]
    infos = [info["capture"] for info in found if "capture" in info]
    if not infos:
        raise HarnessError("latency: no capture was written")
    info = infos[0]
    return {"latency_s": info["latency_s"], "iterations_ahead": info["first"] - at,
            "first": info["first"], "asked_at_iteration": at, "start_wait_s": round(waited, 3)}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    ms = result["median_step_ms"]
    base = ms["unprofiled"]["median"]
    for name in result["arms"][1:]:
        ratio = result["ratio_to_unprofiled"][name]
        own = result["own_us_per_iteration"].get(name)
        gated = name == "dynamic, no step tier"
        target = f"<= x{TARGET_RATIO:.2f}" if gated else "-"
        out.append(table_row(f"dynamic idle: {name} ({result['steps']} steps, median step)",
                             f"{base:.2f} ms", f"{ms[name]['median']:.2f} ms",
                             f"x{ratio:.3f}" + (f" (controller {own:.1f} us/it)" if own is not None else ""),
                             target, ratio <= TARGET_RATIO if gated else None,
                             spread=f"{result['rounds']} rounds"))
    for name in ("dynamic, step tier", "dynamic, step tier, triggers"):
        ratio = result["ratio_to_true_step_tier"][name]
        out.append(table_row(f"dynamic idle: {name} vs true, step tier",
                             f"{ms['true, step tier']['median']:.2f} ms",
                             f"{ms[name]['median']:.2f} ms", f"x{ratio:.3f}", f"<= x{TARGET_RATIO:.2f}",
                             ratio <= TARGET_RATIO, spread=f"{result['rounds']} rounds"))
    lat = result["latency"]
    out.append(table_row("dynamic: jobprof start to the first captured boundary", "-",
                         f"{lat['latency_s']:.2f} s", f"{lat['iterations_ahead']} iterations ahead", "-",
                         None,
                         spread="1 run"))
    return out
