"""From counter records and kernel metadata to one hit rate per op_summary task.

CPU (perf counters): a task's counts are the sum of the dispatch-mode records (see
:mod:`jobprof.plugins.l2.counting`) on the task's thread whose midpoint lies in ``[task.start,
task.end]``.  The record is always nested in its operator's Kineto record (the mode runs inside
the dispatcher call Kineto times); the midpoint keeps the match right when the two clocks'
conversion differs by a few hundred ns at either edge.

CUDA (CUPTI): the kernel's own metric value, from the metadata Kineto attached to the kernel
(the task's ``extra``).  UNVERIFIED on a GPU so far.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping
from typing import Any

from jobprof.plugin import NA, Task
from jobprof.plugins.l2.records import CounterRecord, counter_records

#: the hardware event sets whose two values are (accesses, misses)
CACHE_SOURCES = ("LLC", "CACHE_GENERIC")
#: CUPTI metrics asked for on CUDA jobs (L2 = "lts" on NVIDIA GPUs)
CUPTI_HIT_RATE = "lts__t_sector_hit_rate.pct"
CUPTI_METRICS = (CUPTI_HIT_RATE,)


def counts_per_task(tasks: Iterable[Task], records: Iterable[Any]) -> dict[int, list[int]]:
    """``{task.index: summed counter deltas}`` for every task some record falls in (``records``:
    the raw ``l2`` stream, or its records decoded)."""
    by_thread: dict[int, list[tuple[float, CounterRecord]]] = {}
    for r in counter_records(records):
        by_thread.setdefault(r.tid, []).append(((r.start_ns + r.end_ns) / 2, r))
    mids: dict[int, list[float]] = {}
    for tid, items in by_thread.items():
        items.sort(key=lambda item: item[0])
        mids[tid] = [m for m, _ in items]
    out: dict[int, list[int]] = {}
    for task in tasks:
        points = mids.get(task.stream)
        if not points:
            continue
        lo = bisect.bisect_left(points, task.start)
        hi = bisect.bisect_right(points, task.end)
        if lo == hi:
            continue
        items = by_thread[task.stream]  # (midpoint, record), by midpoint
        total = list(items[lo][1].values)
        for _, r in items[lo + 1:hi]:
            for k, v in enumerate(r.values):
                total[k] += v
        out[task.index] = total
    return out


def hit_rate(accesses: int, misses: int) -> float | None:
    """(accesses - misses) / accesses, or None without accesses.  Multiplexed counts are the
    kernel's scaled estimates, so the ratio is clamped to [0, 1]."""
    if accesses <= 0:
        return None
    return min(1.0, max(0.0, (accesses - misses) / accesses))


def ratio_cell(value: float | None) -> str:
    return NA if value is None else f"{value:.3f}"


def cupti_hit_rate(extra: Any) -> float | None:
    """The L2 hit rate (0-1) in a kernel's Kineto metadata, or None.  Kineto writes metadata as
    JSON members without the outer braces; the metric may sit at the top or one level down."""
    if not extra:
        return None
    if isinstance(extra, str):
        text = extra.strip()
        try:
            extra = json.loads(text if text.startswith("{") else "{" + text + "}")
        except ValueError:
            return None
    value = _find(extra, CUPTI_HIT_RATE)
    try:
        return None if value is None else min(1.0, max(0.0, float(value) / 100))
    except (TypeError, ValueError):
        return None


def _find(obj: Any, key: str, depth: int = 0) -> Any:
    if not isinstance(obj, Mapping) or depth > 2:
        return None
    if key in obj:
        return obj[key]
    for value in obj.values():
        found = _find(value, key, depth + 1)
        if found is not None:
            return found
    return None
