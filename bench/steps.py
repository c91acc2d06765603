"""Step-tier overhead of training_trace alone on examples/train_mlp.py.

Each repeat is a pair of complete runs of the example, one unprofiled and one profiled with
``training_trace`` on and ``task_trace`` off; the order inside a pair alternates (AB, BA, ...)
so slow drift of the machine does not always land on the same arm.  The example reports each
step's wall time itself (``--timings``), so the figure is per step, free of the start-up and
exit costs (torch import, DataLoader workers, export at exit), which are reported separately.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, summary, timed_run, wait_exporters

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_mlp.py"
TARGET_RATIO = 1.02
WARMUP_STEPS = 10  # first steps pay for worker start-up, allocator growth, lazy hook setup
STEPS = 200  # ~10 ms steps on 2 cores: a few seconds of steady state per run
OPTIONS = {"training_trace": "on", "task_trace": "off"}
#: the step tier of issue 3: step trace, DataLoader timings and markers (the example's
#: record_function ranges are captured with no code change)
TIER_OPTIONS = {"training_trace": "on", "task_trace": "off", "dp": "on", "msproftx": "on"}


def profiling_env(output: Path, options: dict[str, str]) -> dict[str, str]:
    return clean_env({"PROFILING_MODE": "true",
                      "PROFILING_OPTIONS": json.dumps({"output": str(output), **options})})


def _one_run(work: Path, tag: str, env: dict[str, str], args: list[str]) -> dict[str, Any]:
    timings = work / f"{tag}.json"
    out = timed_run([sys.executable, str(EXAMPLE), *args, "--timings", str(timings)], env,
                    cwd=str(work))
    steps = json.loads(timings.read_text())
    if len(steps) <= WARMUP_STEPS:
        raise HarnessError(f"only {len(steps)} steps recorded; need more than {WARMUP_STEPS}")
    steady = steps[WARMUP_STEPS:]
    return {"wall_s": out.wall_s, "cpu_s": out.cpu_s, "step_s": steps,
            "median_step_s": statistics.median(steady), "mean_step_s": statistics.fmean(steady),
            "stderr": out.stderr.strip()}


def _profiled_files(output: Path) -> dict[str, Any]:
    """What the profiled run wrote: proof that it really profiled."""
    prof_dirs = sorted(output.glob("PROF_*"))
    count = lambda pattern: len(list(output.glob(f"PROF_*/device_*/{pattern}")))  # noqa: E731
    from jobprof.files import rawstore

    raw = sum(1 for device in output.glob("PROF_*/device_*") for _ in rawstore.read(device))
    return {"prof_dirs": [p.name for p in prof_dirs],
            "raw_iterations": raw,
            "step_trace_csv": count("summary/step_trace_*.csv"),
            "step_trace_json": count("timeline/step_trace_*.json")}


def run(repeats: int, steps: int = STEPS, workers: int = 2,
        options: dict[str, str] | None = None) -> dict[str, Any]:
    args = ["--steps", str(steps), "--workers", str(workers)]
    opts = options or OPTIONS
    baseline_env = clean_env()
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-steps-") as tmp:
        work = Path(tmp)
        for i in range(repeats):
            output = work / f"prof{i}"
            arms = [("baseline", baseline_env), ("profiled", profiling_env(output, opts))]
            if i % 2:
                arms.reverse()
            pair: dict[str, Any] = {"order": [name for name, _ in arms]}
            for name, env in arms:
                pair[name] = _one_run(work, f"{name}{i}", env, args)
                wait_exporters(output)  # the default export's exporter: done before the next run
            files = _profiled_files(output)
            wanted = "step_trace_csv" if opts.get("training_trace") == "on" else "raw_iterations"
            if not files["prof_dirs"] or files[wanted] == 0:
                raise HarnessError(f"profiled run {i} wrote no {wanted} files under {output}:\n"
                                   f"{pair['profiled']['stderr']}")
            pair["files"] = files
            pair["ratio"] = pair["profiled"]["median_step_s"] / pair["baseline"]["median_step_s"]
            pairs.append(pair)

    base = [p["baseline"]["median_step_s"] for p in pairs]
    prof = [p["profiled"]["median_step_s"] for p in pairs]
    ratios = [p["ratio"] for p in pairs]
    return {
        "example": str(EXAMPLE.relative_to(ROOT)), "args": args, "repeats": repeats,
        "warmup_steps_dropped": WARMUP_STEPS, "options": opts,
        "baseline_median_step_ms": summary(base, 1e3),
        "profiled_median_step_ms": summary(prof, 1e3),
        "ratio_of_medians": statistics.median(prof) / statistics.median(base),
        "pair_ratios": summary(ratios),
        "process_wall_ratio": (statistics.median(p["profiled"]["wall_s"] for p in pairs)
                               / statistics.median(p["baseline"]["wall_s"] for p in pairs)),
        "raw_iterations_per_run": [p["files"]["raw_iterations"] for p in pairs],
        "step_trace_csv_per_run": [p["files"]["step_trace_csv"] for p in pairs],
        "step_trace_json_per_run": [p["files"]["step_trace_json"] for p in pairs],
        "profiled_stderr": sorted({p["profiled"]["stderr"] for p in pairs} - {""}),
        "pairs": pairs,
    }


def _label(options: dict[str, str]) -> str:
    if options == OPTIONS:
        return "training_trace"
    if options == TIER_OPTIONS:
        return "step tier (training_trace+dp+msproftx)"
    return json.dumps(options, separators=(",", ":"))


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    ratio, pr = result["ratio_of_medians"], result["pair_ratios"]
    walls = {arm: statistics.median(p[arm]["wall_s"] for p in result["pairs"])
             for arm in ("baseline", "profiled")}
    return [
        {
            "benchmark": f"steps {_label(result['options'])} ({result['args'][1]} steps, median step)",
            "baseline": f"{result['baseline_median_step_ms']['median']:.2f} ms",
            "profiled": f"{result['profiled_median_step_ms']['median']:.2f} ms",
            "delta / ratio": f"x{ratio:.3f}",
            "spread": f"pairs: median x{pr['median']:.3f}, x{pr['min']:.3f} .. x{pr['max']:.3f}",
            "target": f"<= x{TARGET_RATIO:.2f}",
            "result": "pass" if ratio <= TARGET_RATIO else "FAIL",
        },
        {
            "benchmark": "steps whole process wall time (info)",
            "baseline": f"{walls['baseline']:.2f} s",
            "profiled": f"{walls['profiled']:.2f} s",
            "delta / ratio": f"x{result['process_wall_ratio']:.3f}",
            "spread": "-",
            "target": "-",
            "result": "info",
        },
    ]
