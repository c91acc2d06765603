"""Export throughput of the operator tier: op_summary task rows rendered per second, one core.

A real profile is made first: bench/_optier_job.py (examples/train_mlp.py's model, 0 workers)
profiled with ``training_trace`` and ``task_trace`` on for N iterations (and, when an installed
plugin answers the ``PipeUtilization`` metric group, once more with ``aic_metrics`` set).  Then
a child process pinned to one CPU (``os.sched_setaffinity``) re-renders it the way ``jobprof
export PROF_DIR`` does (``jobprof.files.export``: the recorded options choose the writers, every
writer renders every iteration, the master timeline included), and times each writer's
``render`` call, apart from reading the raw data and writing the files.

The figure: op_summary task rows / seconds spent rendering ALL files of those iterations
(every writer, not only op_summary).  Target: >= 100,000 rows/s.  Measured per pass (the
median over passes is the figure) in CPU seconds of the pinned process, which is what one core
delivers and what other processes sharing that core cannot inflate; the wall-clock rate is
reported next to it (equal on an idle machine).  Plus the files and bytes written, each
writer's share, and one end-to-end ``export_device`` pass (read + render + write) for
information.

    python bench/export_rate.py --measure DEVICE_DIR [--cpu N] [--passes P]   (the child)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, summary, timed_run

JOB = Path(__file__).resolve().parent / "_optier_job.py"
TARGET_ROWS_PER_S = 100_000
OPTIONS = {"training_trace": "on", "task_trace": "on"}
METRIC_GROUP = "PipeUtilization"
ROWS_WRITER = "op_summary.csv"
SHARED = "opview.view (shared)"


def metric_group_available(name: str = METRIC_GROUP) -> str | None:
    """The plugin answering the metric group, or None (as ``jobprof export`` would find it)."""
    from jobprof.engine.manager import PluginManager
    from jobprof.plugin.reporter import Reporter

    manager = PluginManager(Reporter())
    manager.load_entry_points()
    answer = manager.aic_metrics(name)
    return answer[0] if answer else None


# -- the pinned child ---------------------------------------------------------------------------

def _render_pass(device_dir: Path, meta: Any, writers: list[tuple[str, Any]]) -> dict[str, Any]:
    from jobprof.files import rawstore
    from jobprof.files.fsio import atomic_write
    from jobprof.plugin import opview
    from jobprof.plugin.values import ExportContext, Iteration

    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    files: dict[str, int] = defaultdict(int)
    size: dict[str, int] = defaultdict(int)
    rows = iterations = 0
    write_s = 0.0
    clock, cpu_clock = time.perf_counter, time.process_time
    for _, streams in rawstore.read(device_dir):  # parsing the raw line is not timed
        iterations += 1
        iteration = Iteration.from_record(streams[rawstore.ITERATION_STREAM][0])
        ctx = ExportContext(meta.device_id, iteration, meta.pid, streams, meta.anchor, meta.config,
                            meta.program, meta.metrics, meta.machine, job=meta.job,
                            time_base_ns=meta.time_base_ns)
        # the operator tree every operator-tier writer shares (memoised in ctx.memo): built here
        # so that its cost is not charged to whichever writer happens to come first
        c0, t0 = cpu_clock(), clock()
        opview.view(ctx)
        wall[SHARED] += clock() - t0
        cpu[SHARED] += cpu_clock() - c0
        for key, spec in writers:
            c0, t0 = cpu_clock(), clock()
            text = spec.render(ctx)
            t1, c1 = clock(), cpu_clock()
            wall[key] += t1 - t0
            cpu[key] += c1 - c0
            if text is None:
                continue
            if key == ROWS_WRITER:
                rows += text.count("\n") - 1  # the header line
            name = spec.filename(meta.device_id, iteration.model_id, iteration.index)
            size[key] += atomic_write(device_dir / spec.folder / name, text)
            files[key] += 1
            write_s += clock() - t1
    render_s, render_cpu_s = sum(wall.values()), sum(cpu.values())
    return {"iterations": iterations, "rows": rows, "render_s": render_s, "render_cpu_s": render_cpu_s,
            "write_s": write_s, "files": sum(files.values()), "bytes": sum(size.values()),
            "rows_per_s": rows / render_s if render_s else 0.0,
            "rows_per_cpu_s": rows / render_cpu_s if render_cpu_s else 0.0,
            "per_writer": {name: {"s": wall[name], "cpu_s": cpu[name], "files": files[name],
                                  "bytes": size[name]} for name in wall}}


def measure(device_dir: Path, cpu: int | None, passes: int) -> dict[str, Any]:
    from jobprof.engine.manager import PluginManager
    from jobprof.files import batchgc, export
    from jobprof.plugin.reporter import Reporter

    cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
    os.sched_setaffinity(0, {cpu})  # one core: the figure is per core
    batchgc.tune()  # as every jobprof command that reads profiles back
    manager = PluginManager(Reporter())
    manager.load_entry_points()
    meta = export.with_metrics(export.read_meta(device_dir), manager)
    # keyed by file (a writer name can have a .csv and a .json file)
    writers = [(f"{s.name}.{s.extension}", s) for _, s in export.writers_for(manager, meta.config)]
    runs = [_render_pass(device_dir, meta, writers) for _ in range(passes)]
    began = time.perf_counter()
    end_to_end = export.export_device(device_dir, manager)
    e2e_s = time.perf_counter() - began
    return {"cpu": cpu, "affinity": sorted(os.sched_getaffinity(0)), "writers": [key for key, _ in writers],
            "metrics": meta.metrics.name if meta.metrics else None,
            "metric_columns": list(meta.metrics.columns) if meta.metrics else [],
            "passes": runs, "export_device_s": e2e_s, "export_device_files": end_to_end.files,
            "problems": list(end_to_end.problems)}


# -- the harness side ----------------------------------------------------------------------------

def _profile(work: Path, tag: str, iterations: int, options: dict[str, str]) -> Path:
    out = work / tag
    env = clean_env({"PROFILING_MODE": "true",
                     "PROFILING_OPTIONS": json.dumps({"output": str(out), "export": "inline", **options})})
    timed_run([sys.executable, str(JOB), "--steps", str(iterations)], env, cwd=str(work))
    devices = sorted(out.glob("PROF_*/device_*"))
    if len(devices) != 1:
        raise HarnessError(f"the {tag} profile has {len(devices)} device folders under {out}")
    return devices[0]


def _measure_child(device_dir: Path, passes: int, cpu: int | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", str(device_dir),
           "--passes", str(passes)]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    out = timed_run(cmd, clean_env())
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(iterations: int, passes: int, cpu: int | None = None, with_metrics: bool = True) -> dict[str, Any]:
    """``with_metrics``: also the metric-group case, when a plugin answers it."""
    cases = {"task_trace": OPTIONS}
    owner = metric_group_available() if with_metrics else None
    if owner is not None:
        cases[f"task_trace+{METRIC_GROUP}"] = {**OPTIONS, "aic_metrics": METRIC_GROUP}
    result: dict[str, Any] = {"iterations": iterations, "passes": passes, "metric_group_plugin": owner,
                              "metrics_asked": with_metrics, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-export-") as tmp:
        work = Path(tmp)
        for i, (name, options) in enumerate(cases.items()):
            device = _profile(work, f"prof{i}", iterations, options)
            measured = _measure_child(device, passes, cpu)
            if measured["problems"]:
                raise HarnessError(f"export of the {name} profile reported problems: {measured['problems']}")
            measured["options"] = options
            measured["rows_per_s"] = summary([p["rows_per_s"] for p in measured["passes"]])
            measured["rows_per_cpu_s"] = summary([p["rows_per_cpu_s"] for p in measured["passes"]])
            result["cases"][name] = measured
    return result


def _fmt_rate(rate: float) -> str:
    return f"{rate:,.0f} rows/s"


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, case in result["cases"].items():
        first = case["passes"][0]
        rate, cpu_rate = case["rows_per_s"], case["rows_per_cpu_s"]
        if first["rows"] == 0:
            out.append({"benchmark": f"export rate, {name}: no op_summary rows rendered (writer missing?)",
                        "baseline": "-", "profiled": "-", "delta / ratio": "-", "spread": "-",
                        "target": f">= {TARGET_ROWS_PER_S:,}", "result": "n/a"})
            continue
        point = cpu_rate["median"]
        word = "pass" if point >= TARGET_ROWS_PER_S else "FAIL"
        if cpu_rate["ci_low"] < TARGET_ROWS_PER_S <= cpu_rate["ci_high"]:
            word += "?"
        out.append({
            "benchmark": f"export rate, {name}: op_summary rows / CPU s rendering all files, 1 core",
            "baseline": f"{first['rows']} rows, {first['iterations']} it",
            "profiled": f"{first['files']} files, {first['bytes'] / 1e6:.1f} MB",
            "delta / ratio": _fmt_rate(point),
            "spread": f"{result['passes']} passes {_fmt_rate(cpu_rate['min'])} .. "
                      f"{_fmt_rate(cpu_rate['max'])}; per wall s {_fmt_rate(rate['median'])}",
            "target": f">= {TARGET_ROWS_PER_S:,}", "result": word})
    return out


def notes(result: dict[str, Any]) -> list[str]:
    lines = []
    if not result["metrics_asked"]:
        lines.append(f"export rate: the aic_metrics {METRIC_GROUP} case is left out in quick mode")
    elif result["metric_group_plugin"] is None:
        lines.append(f"export rate: no installed plugin answers aic_metrics {METRIC_GROUP}: "
                     "that case was not run")
    else:
        lines.append(f"export rate: aic_metrics {METRIC_GROUP} answered by plugin "
                     f"'{result['metric_group_plugin']}'")
    for name, case in result["cases"].items():
        first = case["passes"][0]
        total = sum(w["cpu_s"] for w in first["per_writer"].values()) or 1.0
        shares = ", ".join(f"{w} {v['cpu_s'] / total:.0%}" for w, v in
                           sorted(first["per_writer"].items(), key=lambda kv: -kv[1]["cpu_s"]))
        lines.append(f"export rate, {name}: pinned to CPU {case['cpu']}; render CPU share per writer "
                     f"(first pass): {shares}; writing the files took {first['write_s']:.2f} s more; "
                     f"end-to-end export_device (read + render + write) {case['export_device_s']:.2f} s "
                     f"for {case['export_device_files']} files")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description="pinned re-render of one device folder (child)")
    parser.add_argument("--measure", type=Path, required=True, metavar="DEVICE_DIR")
    parser.add_argument("--cpu", type=int)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(measure(args.measure, args.cpu, args.passes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
