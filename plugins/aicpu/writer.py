"""The aicpu CSV: one row per top-level operator of the iteration, in start order."""

from __future__ import annotations

from jobprof.plugin import ExportContext, opview
from jobprof.plugins.aicpu.split import launching_tops, numbered, split

HEADER = ["Device_id", "Timestamp(us)", "Node", "Compute_time(us)", "Memcpy_time(us)", "Task_time(us)",
          "Dispatch_time(us)", "Total_time(us)", "Stream ID", "Task ID"]
#: appended to the Node of an operator that launched no device work on a CUDA job
HOST_MARK = " [host]"


def us(ns: int) -> str:
    """Exact µs with 3 decimals from integer ns (no float rounding: the printed Task_time and
    Dispatch_time add up to the printed Total_time)."""
    return f"{ns // 1000}.{ns % 1000:03d}" if ns >= 0 else f"-{us(-ns)}"


def render_csv(ctx: ExportContext) -> str | None:
    view = opview.view(ctx)
    if view is None:
        return None
    launched = launching_tops(view) if view.has_device else None
    rows = []
    for i, tid, task_id in numbered(view):
        record = view.records[i]
        s = split(view, i)
        node = record.name
        if launched is not None and i not in launched:
            node += HOST_MARK
        rows.append([ctx.device_id, ctx.stamp_cell(record.start), node, us(s.compute), us(s.memcpy),
                     us(s.task), us(s.dispatch), us(s.total), tid, task_id])
    return ctx.csv(HEADER, rows)
