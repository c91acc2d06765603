"""The l2_cache CSV: one row per op_summary task of the iteration."""

from __future__ import annotations

from jobprof.plugin import NA, ExportContext, opview
from jobprof.plugins.l2.join import CACHE_SOURCES, counts_per_task, cupti_hit_rate, hit_rate, ratio_cell
from jobprof.plugins.l2.records import CounterSetRecord

HEADER = ["Device_id", "Stream Id", "Task Id", "Hit Rate", "Victim Rate", "Op Name"]
#: per-operator counter records (jobprof.plugins.l2.counting), read as
#: jobprof.plugins.l2.records.CounterRecord
STREAM = "l2"
#: one record per iteration: {"events": [counter names], "source": "LLC" | "CACHE_GENERIC" | "software"},
#: read as jobprof.plugins.l2.records.CounterSetRecord
EVENTS_STREAM = "l2_events"


def render_csv(ctx: ExportContext) -> str | None:
    """Hit Rate from the task's counters (CPU) or its kernel's CUPTI metric (CUDA).

    Victim Rate is N/A everywhere: perf's cache events count accesses and misses, not the
    evictions a miss causes, and no eviction metric is asked of CUPTI.  In the diagnostic
    ``software`` mode the counters are not cache events: every rate is N/A (the raw ``l2``
    stream holds the values).  No file when the iteration has no L2 source (counters missing).
    """
    view = opview.view(ctx)
    if view is None:
        return None
    counted = ctx.records(EVENTS_STREAM)
    counter_set = CounterSetRecord.of(counted)
    rows = []
    if counted:
        cache = counter_set is not None and counter_set.source in CACHE_SOURCES
        counts = counts_per_task(view.tasks, ctx.records(STREAM)) if cache else {}
        for task in view.tasks:
            values = counts.get(task.index)  # the summed deltas: (accesses, misses) of a cache set
            rate = hit_rate(*values[:2]) if values else None
            rows.append([ctx.device_id, task.stream, task.task_id, ratio_cell(rate), NA, task.name])
    elif view.has_device:
        for task in view.tasks:
            rows.append([ctx.device_id, task.stream, task.task_id, ratio_cell(cupti_hit_rate(task.extra)),
                         NA, task.name])
    else:
        return None
    return ctx.csv(HEADER, rows)
