"""hccl JSON (docs/msprof.md section 4), communication_statistic CSV (section 3) and the master timeline's
Communication tracks.

One track per process group (``Group <name> Communication``), one ``X`` event per operation
with its size, data type, bandwidths and group; asynchronous operations that overlap within a
group go to extra lanes so every track nests.  msprof also draws each collective's transfer
tasks (``Plane <n>`` threads: src / dst rank, link, size per transfer); gloo and NCCL do not
expose their transfers to the host, so there are none, and the algorithm is ``N/A``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from jobprof.plugin import (
    NA,
    CollectiveRecord,
    ExportContext,
    Timeline,
    assign_lanes,
    device_label,
    lane_name,
    lane_tid,
    records_of,
)
from jobprof.plugins.hccl.collectives import bandwidths, msprof_dtype

#: the plugin's raw stream, declared as jobprof.plugin.CollectiveRecord (others read it too)
STREAM = CollectiveRecord.STREAM
STATISTIC = "communication_statistic"
PROCESS = "Communication"
STAT_HEADER = ["Device_id", "OP Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)",
               "Max Time(us)", "Ratio(%)"]
#: which end of a point-to-point or rooted operation ``peer`` names
_PEER_ARG = {"send": "dst rank", "recv": "src rank"}


def _ordered(ctx: ExportContext) -> list[CollectiveRecord]:
    return sorted(records_of(ctx, CollectiveRecord), key=lambda r: (r.start_ns, -r.end_ns))


def _global(record: CollectiveRecord, group_rank: int) -> int:
    ranks = record.ranks
    return ranks[group_rank] if ranks and 0 <= group_rank < len(ranks) else group_rank


def _na(value: Any) -> Any:
    return NA if value is None else value


def event_args(record: CollectiveRecord) -> dict[str, Any]:
    """The args of one operation's event (the keys msprof uses, then jobprof's own)."""
    algbw, busbw = bandwidths(record.op, record.bytes or 0, record.rank_size or 0, record.duration_ns)
    args: dict[str, Any] = {
        "rank size": record.rank_size,
        "data type": msprof_dtype(record.dtype) if record.dtype else NA,
        "count": record.count,
        "size(Byte)": record.bytes,
        "algorithm": NA,
        "algbw(GB/s)": round(algbw, 6) if algbw is not None else NA,
        "busbw(GB/s)": round(busbw, 6) if busbw is not None else NA,
        "group": record.group,
        "group name": record.group_desc or NA,
        "group ranks": list(record.ranks) if record.ranks else NA,
        "rank": record.rank,
        "seq": record.seq,
        "backend": record.backend or NA,
        "async": _na(record.is_async),
        "state": "completed" if record.state is None else record.state,
        "end from": _na(record.end_from),
        "thread": record.tid,
    }
    if record.peer is not None:
        args[_PEER_ARG.get(record.op, "root rank")] = _global(record, record.peer)
    return args


def add_tracks(ctx: ExportContext, timeline: Timeline) -> None:
    records = _ordered(ctx)
    if not records:
        return
    pid = timeline.process(PROCESS, device_label(ctx.device_id))
    by_group: dict[str, list[CollectiveRecord]] = defaultdict(list)
    for r in records:
        by_group[_na(r.group)].append(r)
    us = ctx.to_us
    events = []
    for index, (group, rows) in enumerate(sorted(by_group.items(), key=lambda kv: _group_key(kv[0]))):
        lanes = assign_lanes([(r.start_ns, r.end_ns) for r in rows])
        for lane in sorted(set(lanes)):
            timeline.thread(pid, lane_tid(index, lane), lane_name(f"Group {group} Communication", lane))
        for r, lane in zip(rows, lanes, strict=True):
            events.append({"name": r.op, "pid": pid, "tid": lane_tid(index, lane),
                           "ts": us(r.start_ns), "dur": ctx.dur_us(r.start_ns, r.end_ns),
                           "args": event_args(r), "ph": "X"})
    timeline.add(events)


def _group_key(name: str) -> tuple[int, str]:
    return (0, f"{int(name):012d}") if name.isdigit() else (1, name)


def render_json(ctx: ExportContext) -> str | None:
    timeline = Timeline(ctx.pid)
    add_tracks(ctx, timeline)
    return timeline.render()


def render_statistic(ctx: ExportContext) -> str | None:
    """Operations grouped by OP Type; Ratio(%) = the type's total time / all types' total."""
    spans: dict[str, list[int]] = defaultdict(list)
    for r in records_of(ctx, CollectiveRecord):
        if r.duration_ns is not None:
            spans[r.op].append(r.duration_ns)
    if not spans:
        return None
    grand = sum(sum(v) for v in spans.values())
    rows = []
    for op, durs in sorted(spans.items(), key=lambda kv: (-sum(kv[1]), kv[0])):
        total = sum(durs)
        rows.append([ctx.device_id, op, len(durs), f"{total / 1000:.3f}", f"{min(durs) / 1000:.3f}",
                     f"{total / len(durs) / 1000:.3f}", f"{max(durs) / 1000:.3f}",
                     f"{100 * total / grand:.3f}" if grand else NA])
    return ctx.csv(STAT_HEADER, rows)
