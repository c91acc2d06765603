"""op_summary, op_statistic and task_time CSV files (docs/msprof.md section 3), one of each per
iteration.

The text is exactly what ``ExportContext.csv`` writes (header, rows, ``\\n`` line ends, the
csv module's minimal quoting), joined from the shared pre-formatted cells: the csv module's
writer costs about 7 µs per 21-column row, which alone would take most of the operator
tier's export budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobprof.plugin import NA, ExportContext
from jobprof.plugins.task_trace.table import TaskTable, csv_cell, table, us3

SUMMARY_HEADER = ["Device_id", "Model ID", "Task ID", "Stream ID", "Op Name", "OP Type", "OP State",
                  "Task Type", "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)",
                  "Block Dim", "Mix Block Dim", "HF32 Eligible", "Input Shapes", "Input Data Types",
                  "Input Formats", "Output Shapes", "Output Data Types", "Output Formats", "Context ID"]
STATISTIC_HEADER = ["Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
                    "Avg Time(us)", "Max Time(us)", "Ratio(%)"]
TASK_TIME_HEADER = ["Device_id", "kernel_name", "kernel_type", "stream_id", "task_id", "task_time(us)",
                    "task_start(us)", "task_stop(us)"]


def _text(header: Iterable[Any], lines: list[str]) -> str:
    head = ",".join(csv_cell(str(h)) for h in header)
    return head + "\n" + "".join(line + "\n" for line in lines) if lines else head + "\n"


def metric_cells(ctx: ExportContext, tab: TaskTable) -> list[str] | None:
    """The aic_metrics group's cells per task (joined, with a leading comma), or None without a
    group.  A task whose values raise, or are the wrong count, gets N/A in every column: a
    third-party group must not cost the user the op_summary file."""
    metrics = ctx.metrics
    if metrics is None or not metrics.columns:
        return None
    n = len(metrics.columns)
    missing = "," + ",".join([NA] * n)
    values, machine = metrics.values, ctx.machine
    out = []
    for task in tab.tasks:
        try:
            got = list(values(task, machine))
        except Exception:
            out.append(missing)
            continue
        out.append("," + ",".join(csv_cell(v if isinstance(v, str) else str(v)) for v in got)
                   if len(got) == n else missing)
    return out


def render_op_summary(ctx: ExportContext) -> str | None:
    """One row per task in start order (columns: see the package docstring)."""
    tab = table(ctx)
    if tab is None:
        return None
    device = ctx.device_id
    in_shapes, in_dtypes, in_formats = tab.inputs
    out_shapes, out_dtypes, out_formats = tab.outputs
    lines = [f"{device},{model},{tid},{sid},{name},{otype},N/A,{core},{start},{dur},{wait},{block},N/A,N/A,"
             f"{ish},{idt},{ifm},{osh},{odt},{ofm},N/A"
             for model, tid, sid, name, otype, core, start, dur, wait, block, ish, idt, ifm, osh, odt, ofm
             in zip(tab.models, tab.task_ids, tab.streams, tab.name_cells, tab.op_type_cells, tab.core_types,
                    tab.start_cells, tab.dur_cells, tab.wait_cells, tab.block_dims, in_shapes,
                    in_dtypes, in_formats, out_shapes, out_dtypes, out_formats, strict=True)]
    header = SUMMARY_HEADER
    metrics = metric_cells(ctx, tab)
    if metrics is not None:
        assert ctx.metrics is not None  # metric_cells gives None without it
        header = SUMMARY_HEADER + list(ctx.metrics.columns)
        lines = [line + cells for line, cells in zip(lines, metrics, strict=True)]
    return _text(header, lines)


def statistic(tab: TaskTable) -> list[tuple[str, str, int, int, int, int]]:
    """(OP Type, Core Type, count, total, min, max) per group, ns, sorted by total descending."""
    groups: dict[tuple[str, str], list[int]] = {}
    for key, d in zip(zip(tab.op_types, tab.core_types, strict=True), tab.durs, strict=True):
        g = groups.get(key)
        if g is None:
            groups[key] = [1, d, d, d]
        else:
            g[0] += 1
            g[1] += d
            if d < g[2]:
                g[2] = d
            elif d > g[3]:
                g[3] = d
    rows = [(op, core, g[0], g[1], g[2], g[3]) for (op, core), g in groups.items()]
    rows.sort(key=lambda r: (-r[3], r[0], r[1]))
    return rows


def render_op_statistic(ctx: ExportContext) -> str | None:
    """Tasks grouped by (OP Type, Core Type); Ratio(%) = group total / all tasks' total."""
    tab = table(ctx)
    if tab is None:
        return None
    rows = statistic(tab)
    grand = sum(r[3] for r in rows)
    dev = ctx.device_id
    lines = [f"{dev},{csv_cell(op)},{core},{count},{us3(total)},{us3(low)},{total / count / 1000:.3f},"
             f"{us3(high)},{f'{100 * total / grand:.3f}' if grand else NA}"
             for op, core, count, total, low, high in rows]
    return _text(STATISTIC_HEADER, lines)


def render_task_time_csv(ctx: ExportContext) -> str | None:
    """One row per task: name, engine, stream, id, duration and absolute start/stop."""
    tab = table(ctx)
    if tab is None:
        return None
    dev = ctx.device_id
    lines = [f"{dev},{name},{core},{sid},{tid},{dur},{start},{stop}"
             for name, core, sid, tid, dur, start, stop
             in zip(tab.name_cells, tab.core_types, tab.streams, tab.task_ids, tab.dur_cells,
                    tab.start_cells, tab.stop_cells, strict=True)]
    return _text(TASK_TIME_HEADER, lines)
