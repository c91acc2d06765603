"""steptier: the always-on tiers on the transformer job (issue 48), every arm in one run.

The job is ``bench/_transformer_job.py`` (a 2-layer TransformerEncoder LM, d_model 128, batch
8 x 64, AdamW, one thread: ~37 ms steps here), run whole in each arm, the arms in a rotated order
in every round.  Each profiled run uses the default ``export`` (background): nothing is
rendered while the job trains and a detached exporter renders after it; the harness waits for
that exporter (``jobprof export --wait``, untimed) before the next run, so it never shares the
CPU with one.  A run's figure is its median step after the first ``WARMUP_STEPS``; an arm's
ratio is the median over rounds of (arm / unprofiled of the same round), with the sign-test
interval of that median (``?`` in the table when it holds the target).

Two figures are measured inside the runs, free of the run-to-run spread: jobprof's own time at
each iteration end on the training thread (the profile's own spans, step-tier arm) and the
dynamic controller's own time per iteration (its status file, triggers arm).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, median_ci, rotated, table_row, timed_run, verdict, wait_exporters

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "bench" / "_transformer_job.py"
WARMUP_STEPS = 15
STEP_TIER = {"training_trace": "on", "task_trace": "off", "dp": "on", "msproftx": "on"}
#: every trigger armed, none firing: slow_iteration and memory_growth are checked at every
#: iteration end, rank_outlier once a second (one rank: nothing to compare)
TRIGGERS = {"slow_iteration": 1000, "memory_growth": 1000000, "rank_outlier": 1000}
#: arm -> (PROFILING_MODE, options, target ratio or None)
ARMS: dict[str, tuple[str | None, dict[str, Any], float | None]] = {
    "unprofiled": (None, {}, None),
    "training_trace": ("true", {"training_trace": "on", "task_trace": "off"}, 1.005),
    "step tier (training_trace + dp + msproftx)": ("true", STEP_TIER, 1.01),
    "dynamic idle (no step tier)": ("dynamic", {"training_trace": "off"}, 1.005),
    "dynamic, step tier, every trigger armed": ("dynamic", {**STEP_TIER, "trigger": TRIGGERS}, 1.01),
    "operator tier l1, 1 iteration in 20": ("true", {"training_trace": "on", "task_trace": "l1",
                                                     "task_trace_every": 20}, 1.05),
    # issue 49: every host value at 50 Hz (host_sys_usage_freq's default) on the step tier, the
    # sampler alone and with osrt (perf record of every system call, converted in the job)
    "step tier + host sampler (host_sys but osrt, host_sys_usage)": (
        "true", {**STEP_TIER, "host_sys": "cpu,mem,disk,network", "host_sys_usage": "cpu,mem"}, 1.01),
    "step tier + every host value (osrt too)": (
        "true", {**STEP_TIER, "host_sys": "cpu,mem,disk,network,osrt", "host_sys_usage": "cpu,mem"}, 1.01),
}


def _env(mode: str | None, options: dict[str, Any], output: Path) -> dict[str, str]:
    if mode is None:
        return clean_env()
    return clean_env({"PROFILING_MODE": mode,
                      "PROFILING_OPTIONS": json.dumps({"output": str(output), **options})})


#: every option that collects on this machine (issue 48's start-up target: <= 100 ms before iteration 1)
EVERY_OPTION = {"training_trace": "on", "task_trace": "l1", "hccl": "on", "aicpu": "on", "dp": "on",
                "aic_metrics": "PipeUtilization", "l2": "on", "msproftx": "on", "fusion_op": "on",
                "kineto_trace": "on", "task_memory": "on", "host_sys": "cpu,mem,disk,network,osrt",
                "host_sys_usage": "cpu,mem", "runtime_api": "on"}
START_TARGET_MS = 100.0


def startup(work: Path, runs: int = 3, starts: int = 10) -> dict[str, Any]:
    """jobprof's start-up with every option on: its own time before iteration 1 (info.json
    ``own_startup_ms``: the calibration, found in a fresh cache after the first run, ...) over
    ``runs`` runs of the job, and what the interpreter's start gains (``python -c pass``,
    profiled and not, interleaved ``starts`` times; .pyc files written, as an installed jobprof
    has them)."""
    cache, pyc = work / "cache", work / "pyc"
    own: list[dict[str, float]] = []
    for r in range(runs):
        output = work / f"startup{r}"
        env = _env("true", EVERY_OPTION, output)
        env.update(JOBPROF_CACHE_DIR=str(cache), PYTHONPYCACHEPREFIX=str(pyc))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        timed_run([sys.executable, str(JOB), "--steps", "5"], env, cwd=str(work))
        wait_exporters(output)
        for info in output.glob("PROF_*/device_*/info.json.*"):
            if not info.name.endswith(".done"):
                own.append(json.loads(info.read_text())["jobprof"].get("own_startup_ms") or {})
    bare, full = clean_env({"PYTHONPYCACHEPREFIX": str(pyc)}), _env("true", EVERY_OPTION, work / "pass")
    bare.pop("PYTHONDONTWRITEBYTECODE", None)
    full.update(JOBPROF_CACHE_DIR=str(cache), PYTHONPYCACHEPREFIX=str(pyc))
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    added: list[float] = []
    for _ in range(starts):
        off = timed_run([sys.executable, "-c", "pass"], bare).wall_s
        on = timed_run([sys.executable, "-c", "pass"], full).wall_s
        added.append(on - off)
    return {"own_startup_ms": own, "interpreter_added_s": added}


def _own_ns(output: Path) -> list[int]:
    from jobprof.files import rawstore

    own: list[int] = []
    for device in output.glob("PROF_*/device_*"):
        for _, streams in rawstore.read(device):
            own.append(sum(int(s[1]) - int(s[0]) for s in streams.get("profiler") or []))
    return own[WARMUP_STEPS:]


def _controller_us(output: Path) -> float | None:
    found = [json.loads(p.read_text()).get("own_us_per_iteration")
             for p in output.glob("PROF_*/control/rank_*.json")]
    found = [x for x in found if x is not None]
    return statistics.median(found) if found else None


STEP_ARM = "step tier (training_trace + dp + msproftx)"
HOST_ARM = "step tier + host sampler (host_sys but osrt, host_sys_usage)"
#: the host sampler thread's own CPU, % of one core (issue 49's target)
SAMPLER_TARGET_PCT = 1.0


def _sampler_pct(output: Path) -> list[float]:
    found = []
    for path in output.glob("PROF_*/device_*/info.json.*"):
        if not path.name.endswith(".done"):
            host = json.loads(path.read_text()).get("jobprof", {}).get("host_sys") or {}
            if "sampler_cpu_pct_of_one_core" in host:
                found.append(float(host["sampler_cpu_pct_of_one_core"]))
    return found


def run(rounds: int, steps: int = 150) -> dict[str, Any]:
    per_arm: dict[str, list[float]] = {name: [] for name in ARMS}
    own: list[int] = []
    sampler: list[float] = []
    controller: list[float] = []
    stderr: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-steptier-") as tmp:
        work = Path(tmp)
        for r in range(rounds):
            for name in rotated(list(ARMS), r):
                mode, options, _ = ARMS[name]
                tag = f"{r}-{list(ARMS).index(name)}"
                output = work / f"prof{tag}"
                timings = work / f"{tag}.json"
                out = timed_run([sys.executable, str(JOB), "--steps", str(steps), "--timings", str(timings)],
                                _env(mode, options, output), cwd=str(work))
                if out.stderr.strip():
                    stderr.add(out.stderr.strip()[-300:])
                step_s = json.loads(timings.read_text())["step_s"][WARMUP_STEPS:]
                if not step_s:
                    raise HarnessError(f"{name}: no steady steps recorded")
                per_arm[name].append(statistics.median(step_s))
                wait_exporters(output)  # its exporter is done before the next run
                if name == STEP_ARM:
                    own += _own_ns(output)
                if name == HOST_ARM:
                    sampler += _sampler_pct(output)
                if name.startswith("dynamic, step tier"):
                    value = _controller_us(output)
                    if value is None:
                        raise HarnessError(f"{name}: no status file under {output}")
                    controller.append(value)
        started = startup(work)
    base = per_arm["unprofiled"]
    ratios = {name: [v / b for v, b in zip(values, base, strict=True)] for name, values in per_arm.items()}
    return {"rounds": rounds, "steps": steps, "arms": list(ARMS),
            "median_step_ms": {k: statistics.median(v) * 1e3 for k, v in per_arm.items()},
            "ratios": ratios, "hand_over_us": statistics.median(own) / 1e3 if own else None,
            "controller_us": statistics.median(controller) if controller else None,
            "sampler_pct": statistics.median(sampler) if sampler else None,
            "startup": started, "stderr": sorted(stderr)}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    base = result["median_step_ms"]["unprofiled"]
    for name in result["arms"][1:]:
        _, _, target = ARMS[name]
        assert target is not None
        values = result["ratios"][name]
        point = statistics.median(values)
        low, high, coverage = median_ci(values)
        out.append({**table_row(f"steptier (transformer): {name}", f"{base:.2f} ms",
                                f"{result['median_step_ms'][name]:.2f} ms", f"x{point:.4f}",
                                f"<= x{target}", point <= target,
                                spread=f"rounds CI x{low:.3f} .. x{high:.3f} ({coverage:.0%}), "
                                       f"{result['rounds']} rounds"),
                    "result": verdict(point, low, high, target)})
    if result["hand_over_us"] is not None:
        share = result["hand_over_us"] / (result["median_step_ms"][result["arms"][2]] * 1e3)
        out.append(table_row("steptier: jobprof's own time per iteration end (step tier, training thread)",
                             f"{base:.2f} ms", f"{result['hand_over_us']:.1f} us", f"{100 * share:.2f}%",
                             "-", None, spread="median of iterations"))
    if result.get("sampler_pct") is not None:
        out.append(table_row("steptier: the host sampler thread's own CPU at 50 Hz (every value but osrt)",
                             "-", f"{result['sampler_pct']:.2f}% of one core", "-",
                             f"<= {SAMPLER_TARGET_PCT:.0f}%", result["sampler_pct"] <= SAMPLER_TARGET_PCT,
                             spread="median of runs, info.json host_sys"))
    if result["controller_us"] is not None:
        share = result["controller_us"] / (result["median_step_ms"][result["arms"][4]] * 1e3)
        out.append(table_row("steptier: dynamic controller per iteration, every trigger armed",
                             f"{base:.2f} ms", f"{result['controller_us']:.1f} us", f"{100 * share:.2f}%",
                             "-", None, spread="median of ranks' status"))
    own = [sum(x.values()) for x in result["startup"]["own_startup_ms"]]
    if own:
        later = statistics.median(own[1:]) if len(own) > 1 else own[0]
        out.append(table_row("startup: jobprof's own time before iteration 1, every option on (after the "
                             "first run on this machine)", "-", f"{later:.1f} ms",
                             f"first run {own[0]:.0f} ms (calibration measured)",
                             f"<= {START_TARGET_MS:.0f} ms", later <= START_TARGET_MS,
                             spread=f"{len(own)} runs, info.json own_startup_ms"))
    added = result["startup"]["interpreter_added_s"]
    if added:
        point = statistics.median(added) * 1e3
        low, high, _ = median_ci(added)
        out.append({**table_row("startup: interpreter start with every option on, added (python -c pass)",
                                "-", f"{point:.0f} ms", f"CI {low * 1e3:.0f} .. {high * 1e3:.0f} ms",
                                f"<= {START_TARGET_MS:.0f} ms", point <= START_TARGET_MS,
                                spread=f"{len(added)} pairs, .pyc written"),
                    "result": verdict(point, low * 1e3, high * 1e3, START_TARGET_MS)})
    return out
