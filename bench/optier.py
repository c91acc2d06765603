"""Operator tier: jobprof's task_trace against torch.profiler at equal detail, in the same run.

Arms (one process each, order rotated every repeat so slow drift spreads over all of them):

* ``base``: bench/_optier_job.py unprofiled (examples/train_mlp.py's model and loop, 0 workers);
* ``jobprof``: ``PROFILING_MODE=true`` with ``training_trace`` and ``task_trace`` on (l1: every
  operator with input shapes; the files of every iteration are rendered by jobprof's background
  exporter, which defers what its 1% duty budget cannot do to the process's exit);
* ``jobprof_l0``: the same with ``task_trace`` l0 (operators without shapes);
* ``torch_profiler``: the loop wrapped in ``torch.profiler.profile`` (CPU, ``record_shapes``,
  every step recorded, a Chrome trace written per step by ``on_trace_ready``).

The figure of the issue is ``(t_jobprof - t_base) / (t_torch_profiler - t_base)`` per repeat
(target <= 1.0: jobprof costs no more than torch.profiler for the same detail), with t the
median steady-state step time of that arm in that repeat.  The same ratio over each process's
CPU time (user + sys, all threads, start to exit) is reported too, because jobprof renders most
files in a background thread and at exit, while torch.profiler writes its trace inside
``prof.step()``: the step figure alone would not see jobprof's deferred work.  (CPU time, not
wall time: on this shared 2-core VM the start-up's wall time swings by seconds.)

Proof of profiling (the harness fails, exit 2, otherwise): jobprof's raw data holds an ``ops``
stream for (nearly) every iteration, with shapes at l1 and without at l0; torch.profiler wrote
a trace per step and its events carry ``Input Dims``.

``run_memory``: the tiny model profiled with task_trace on for 200 and for 2000 iterations, one
process each; the training phase's peak RSS (printed by the driver) and the whole process's
(its own VmHWM, export at exit included: ``common.own_peak_env``).
Target: the 2000-iteration peak at most 50 MB above.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, own_peak_env, own_peak_kb, summary, timed_run

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "_optier_job.py"
WARMUP_STEPS = 15  # Kineto's and the allocator's first cycles, lazy hook setup
STEPS = 150
TARGET_RELATIVE = 1.0
TARGET_RSS_MB = 50.0
L1 = {"training_trace": "on", "task_trace": "on"}
L0 = {"training_trace": "on", "task_trace": "l0"}
METRICS = {**L1, "aic_metrics": "PipeUtilization"}
#: ops iterations a profiled run must hold, as a share of its steps (the first iteration can
#: start before the capture's first window; the last one may end after the final cut)
MIN_OPS_SHARE = 0.95


def _jobprof_env(output: Path, options: dict[str, str]) -> dict[str, str]:
    return clean_env({"PROFILING_MODE": "true",
                      "PROFILING_OPTIONS": json.dumps({"output": str(output), "export": "inline",
                                                       **options})})


def arms(with_metrics: bool) -> list[str]:
    names = ["base", "jobprof", "jobprof_l0", "torch_profiler"]
    return [*names, "jobprof_metrics", "torch_profiler_flops"] if with_metrics else names


def _arm_setup(name: str, out: Path) -> tuple[dict[str, str], list[str]]:
    """(environment, extra driver arguments) of one arm writing under ``out``."""
    if name == "base":
        return clean_env(), []
    if name.startswith("torch_profiler"):
        # jobprof silences Kineto's session logging itself; the same for torch.profiler
        env = clean_env({"KINETO_LOG_LEVEL": "6"})
        return env, ["--torch-profiler", str(out)] + (["--with-flops"] if name.endswith("flops") else [])
    options = {"jobprof": L1, "jobprof_l0": L0, "jobprof_metrics": METRICS}[name]
    return _jobprof_env(out, options), []


def jobprof_proof(output: Path, shapes: bool) -> dict[str, Any]:
    """What a jobprof arm recorded: iterations, those with operators, operator records, and
    whether the records carry shapes as the level says; plus the exporter's own figures."""
    from jobprof.files import rawstore
    from jobprof.ops import opcapture

    devices = sorted(output.glob("PROF_*/device_*"))
    iterations = with_ops = records = shaped = 0
    for device in devices:
        for _, streams in rawstore.read(device):
            iterations += 1
            ops = streams.get(opcapture.STREAM) or []
            with_ops += bool(ops)
            records += len(ops)
            shaped += sum(1 for r in ops if r.shapes is not None)
    info: dict[str, Any] = {}
    for path in output.glob("PROF_*/device_*/info.json.*"):
        if path.suffix[1:].isdigit():  # not the .done marker
            info = json.loads(path.read_text()).get("jobprof", {})
    files = sum(1 for _ in output.glob("PROF_*/device_*/summary/*")) + \
        sum(1 for _ in output.glob("PROF_*/device_*/timeline/*"))
    return {"devices": len(devices), "iterations": iterations, "ops_iterations": with_ops,
            "op_records": records, "shaped_records": shaped, "files": files,
            "shapes_as_asked": (shaped == records) if shapes else (shaped == 0),
            "export_seconds": info.get("export_seconds"),
            "iterations_deferred": info.get("iterations_deferred")}


def torch_proof(trace_dir: Path) -> dict[str, Any]:
    traces = sorted(trace_dir.glob("trace_*.json"))
    shapes = False
    if traces:  # a middle one: a full step
        events = json.loads(traces[len(traces) // 2].read_text()).get("traceEvents", [])
        shapes = any("Input Dims" in (e.get("args") or {}) for e in events)
    return {"traces": len(traces), "bytes": sum(p.stat().st_size for p in traces), "shapes": shapes}


def _one(work: Path, name: str, tag: str, steps: int, extra: list[str]) -> dict[str, Any]:
    out = work / tag
    env, args = _arm_setup(name, out)
    timings = work / f"{tag}.timings.json"
    ran = timed_run([sys.executable, str(JOB), "--steps", str(steps), "--timings", str(timings),
                     *args, *extra], env, cwd=str(work))
    times = json.loads(timings.read_text())
    if len(times) != steps:
        raise HarnessError(f"{name}: {len(times)} step times recorded, {steps} expected")
    result: dict[str, Any] = {"wall_s": ran.wall_s, "cpu_s": ran.cpu_s,
                              "median_step_s": statistics.median(times[WARMUP_STEPS:])}
    if name.startswith("jobprof"):
        proof = jobprof_proof(out, shapes=name != "jobprof_l0")
        if proof["ops_iterations"] < MIN_OPS_SHARE * steps or not proof["shapes_as_asked"]:
            raise HarnessError(f"{name} did not profile as asked ({steps} steps): {proof}\n"
                               f"{ran.stderr[-2000:]}")
        result["proof"] = proof
        result["stderr"] = "\n".join(ln for ln in ran.stderr.splitlines() if "jobprof" in ln)
    elif name.startswith("torch_profiler"):
        proof = torch_proof(out)
        if proof["traces"] < steps or not proof["shapes"]:
            raise HarnessError(f"{name} did not profile as asked ({steps} steps): {proof}\n"
                               f"{ran.stderr[-2000:]}")
        result["proof"] = proof
    shutil.rmtree(out, ignore_errors=True)  # a few tens of MB per run
    return result


def run(repeats: int, steps: int = STEPS, with_metrics: bool = False) -> dict[str, Any]:
    names = arms(with_metrics)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-optier-") as tmp:
        work = Path(tmp)
        for i in range(repeats):
            order = names[i % len(names):] + names[:i % len(names)]
            rounds.append({"order": order, **{n: _one(work, n, f"{n}{i}", steps, []) for n in order}})

    def steps_of(arm: str) -> list[float]:
        return [r[arm]["median_step_s"] for r in rounds]

    def walls_of(arm: str) -> list[float]:
        return [r[arm]["wall_s"] for r in rounds]

    def cpus_of(arm: str) -> list[float]:
        return [r[arm]["cpu_s"] for r in rounds]

    def relative(values: Any, arm: str, torch_arm: str) -> list[float]:
        return [(values(arm)[k] - values("base")[k]) / (values(torch_arm)[k] - values("base")[k])
                for k in range(repeats)]

    result: dict[str, Any] = {"arms": names, "repeats": repeats, "steps": steps,
                              "warmup_steps_dropped": WARMUP_STEPS, "rounds": rounds,
                              "median_step_ms": {a: summary(steps_of(a), 1e3) for a in names},
                              "wall_s": {a: summary(walls_of(a)) for a in names},
                              "cpu_s": {a: summary(cpus_of(a)) for a in names},
                              "over_base": {a: summary([x / b for x, b in
                                                        zip(steps_of(a), steps_of("base"), strict=True)])
                                            for a in names if a != "base"},
                              "relative": {}, "relative_cpu": {}}
    pairs = [("jobprof", "torch_profiler"), ("jobprof_l0", "torch_profiler")]
    if with_metrics:
        pairs.append(("jobprof_metrics", "torch_profiler_flops"))
    for arm, torch_arm in pairs:
        result["relative"][arm] = summary(relative(steps_of, arm, torch_arm))
        result["relative_cpu"][arm] = summary(relative(cpus_of, arm, torch_arm))
    result["proof"] = {a: [r[a].get("proof") for r in rounds] for a in names if a != "base"}
    result["stderr"] = sorted({r[a].get("stderr", "") for r in rounds for a in names} - {""})
    return result


def _ci(s: dict[str, Any], fmt: str = "{:.3f}") -> str:
    return f"CI {fmt.format(s['ci_low'])} .. {fmt.format(s['ci_high'])} ({s['ci_coverage']:.0%})"


def _verdict(point: float, low: float, high: float, target: float) -> str:
    word = "pass" if point <= target else "FAIL"
    return word if (high <= target or low > target) else f"{word}?"


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    ms, base = result["median_step_ms"], result["median_step_ms"]["base"]["median"]
    n = f"{result['repeats']} rounds x {result['steps']} steps"
    out = []
    for arm, rel in result["relative"].items():
        torch_arm = "torch_profiler_flops" if arm == "jobprof_metrics" else "torch_profiler"
        out.append({
            "benchmark": f"optier {arm} vs {torch_arm}: (t_{arm} - t_base) / (t_torch - t_base) ({n})",
            "baseline": f"{ms[torch_arm]['median']:.2f} ms torch",
            "profiled": f"{ms[arm]['median']:.2f} ms",
            "delta / ratio": f"{rel['median']:.3f}",
            "spread": _ci(rel), "target": f"<= {TARGET_RELATIVE:.1f}",
            "result": _verdict(rel["median"], rel["ci_low"], rel["ci_high"], TARGET_RELATIVE)})
    for arm, over in result["over_base"].items():
        out.append({"benchmark": f"optier {arm} / base, median step (info)",
                    "baseline": f"{base:.2f} ms", "profiled": f"{ms[arm]['median']:.2f} ms",
                    "delta / ratio": f"x{over['median']:.3f}", "spread": _ci(over, "x{:.3f}"),
                    "target": "-", "result": "info"})
    cpus = result["cpu_s"]
    for arm, rel in result["relative_cpu"].items():
        torch_arm = "torch_profiler_flops" if arm == "jobprof_metrics" else "torch_profiler"
        out.append({"benchmark": f"optier {arm} vs {torch_arm}, same ratio over whole-process CPU "
                                 "time (all threads, exit export included; info)",
                    "baseline": f"{cpus['base']['median']:.1f} s base, "
                                f"{cpus[torch_arm]['median']:.1f} s torch",
                    "profiled": f"{cpus[arm]['median']:.1f} s", "delta / ratio": f"{rel['median']:.3f}",
                    "spread": _ci(rel), "target": "-", "result": "info"})
    return out


def notes(result: dict[str, Any]) -> list[str]:
    lines = []
    for arm, proofs in result["proof"].items():
        first = proofs[0] or {}
        if arm.startswith("jobprof"):
            lines.append(f"optier: {arm} profiled every run: ops iterations per run "
                         f"{[p['ops_iterations'] for p in proofs]}, op records/iteration ~"
                         f"{first['op_records'] // max(first['ops_iterations'], 1)}, shapes "
                         f"{'yes' if arm != 'jobprof_l0' else 'no'} as asked, files per run "
                         f"{[p['files'] for p in proofs]}, export s in process "
                         f"{[p['export_seconds'] for p in proofs]}")
        else:
            each = first["bytes"] / max(first["traces"], 1) / 1e3
            lines.append(f"optier: {arm} wrote a trace per step: traces per run "
                         f"{[p['traces'] for p in proofs]}, ~{each:.0f} kB each, Input Dims present")
    lines += [f"optier: jobprof stderr: {s}" for s in result["stderr"]]
    return lines


# -- memory over a long run -------------------------------------------------------------------

def _peak_rss(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """The driver-reported training peak (KiB) and live Python blocks / GC objects at the loop's
    end, the whole process's peak (KiB, its own VmHWM: ``common.own_peak_env``) and its wall time."""
    with open(cwd / "mem.out", "w") as out, open(cwd / "mem.err", "w") as err:
        began = time.perf_counter()
        proc = subprocess.Popen(cmd, env=own_peak_env(env, cwd / "peak"), cwd=cwd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise HarnessError(f"memory run exited {proc.returncode}: {(cwd / 'mem.err').read_text()[-2000:]}")
    line = next((ln for ln in (cwd / "mem.out").read_text().splitlines() if ln.startswith("OPTIER_RSS_KB ")),
                None)
    if line is None:
        raise HarnessError("memory run did not report its RSS")
    fields = line.split()
    return {"train_peak_kb": int(fields[1]), "python_blocks": int(fields[3]), "gc_objects": int(fields[5]),
            "process_peak_kb": own_peak_kb((cwd / "mem.err").read_text()) or usage.ru_maxrss, "wall_s": wall}


def run_memory(short: int = 200, long: int = 2000, repeats: int = 1) -> dict[str, Any]:
    runs: dict[int, list[dict[str, Any]]] = {short: [], long: []}
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-memory-") as tmp:
        work = Path(tmp)
        for i in range(repeats):
            for steps in (short, long) if i % 2 == 0 else (long, short):
                out = work / f"prof{steps}_{i}"
                measured = _peak_rss([sys.executable, str(JOB), "--tiny", "--steps", str(steps)],
                                     _jobprof_env(out, L1), work)
                proof = jobprof_proof(out, shapes=True)
                if proof["ops_iterations"] < MIN_OPS_SHARE * steps:
                    raise HarnessError(f"memory run of {steps} steps did not profile: {proof}")
                runs[steps].append({**measured, "ops_iterations": proof["ops_iterations"],
                                    "files": proof["files"]})
                shutil.rmtree(out, ignore_errors=True)
    keys = ("train_peak_kb", "process_peak_kb", "wall_s", "python_blocks", "gc_objects")
    med = {s: {k: statistics.median(r[k] for r in v) for k in keys} for s, v in runs.items()}
    return {"short": short, "long": long, "repeats": repeats, "runs": {str(k): v for k, v in runs.items()},
            "median": {str(k): v for k, v in med.items()},
            "train_growth_mb": (med[long]["train_peak_kb"] - med[short]["train_peak_kb"]) / 1024,
            "process_growth_mb": (med[long]["process_peak_kb"] - med[short]["process_peak_kb"]) / 1024}


def memory_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    s, lg = str(result["short"]), str(result["long"])
    med = result["median"]
    out = []
    for key, label in (("train", "training phase"), ("process", "whole process, exit export included")):
        growth = result[f"{key}_growth_mb"]
        out.append({"benchmark": f"optier-memory: peak RSS, {s} vs {lg} iterations, task_trace on ({label})",
                    "baseline": f"{med[s][f'{key}_peak_kb'] / 1024:.1f} MB",
                    "profiled": f"{med[lg][f'{key}_peak_kb'] / 1024:.1f} MB",
                    "delta / ratio": f"{growth:+.1f} MB",
                    "spread": f"{result['repeats']} run(s) each; walls {med[s]['wall_s']:.0f} / "
                              f"{med[lg]['wall_s']:.0f} s; Python blocks {med[s]['python_blocks']:.0f} / "
                              f"{med[lg]['python_blocks']:.0f}",
                    "target": f"<= +{TARGET_RSS_MB:.0f} MB",
                    "result": "pass" if growth <= TARGET_RSS_MB else "FAIL"})
    return out
