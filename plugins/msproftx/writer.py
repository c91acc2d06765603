"""msprof_tx CSV and JSON (docs/msprof.md sections 3-5), and the marker tracks of the master timeline.

Host-only markers: the category / payload columns belong to msproftx's legacy stamps and the
Device columns to markers placed on a device stream; jobprof has neither, so they are N/A.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from jobprof.plugin import (
    HOST_LABEL,
    NA,
    ExportContext,
    Timeline,
    TxRecord,
    assign_lanes,
    lane_name,
    lane_tid,
    records_of,
)

#: the plugin's raw stream, declared as jobprof.plugin.TxRecord (kineto reads it too)
STREAM = TxRecord.STREAM
NAME = "msprof_tx"
HEADER = ["Device_id", "pid", "tid", "category", "event_type", "payload_type", "payload_value",
          "Start_time(us)", "End_time(us)", "message_type", "message", "domain",
          "Device Start_time(us)", "Device End_time(us)"]
EVENT_TYPES = {"m": "marker", "p": "push/pop", "r": "start/end"}
#: lanes per thread that get their own sort slot (more still work, sorted after them)
_LANE_SLOTS = 64


def text(message: Any) -> str:
    """The message as valid UTF-8 (a lone surrogate from the program becomes '?')."""
    message = str(message)
    return message if message.isascii() else message.encode("utf-8", "replace").decode("utf-8")


def _ordered(ctx: ExportContext) -> list[TxRecord]:
    return sorted(records_of(ctx, TxRecord), key=lambda r: (r.start_ns, -r.end_ns))


def render_csv(ctx: ExportContext) -> str | None:
    records = _ordered(ctx)
    if not records:
        return None
    return ctx.csv(HEADER, ([ctx.device_id, ctx.pid, r.thread, NA, _event_type(r), NA, NA,
                             ctx.stamp_cell(r.start_ns), ctx.stamp_cell(r.end_ns), "string", text(r.message),
                             r.domain, NA, NA] for r in records))


def _event_type(record: TxRecord) -> Any:
    return EVENT_TYPES.get(record.kind or "", record.kind)


def add_tracks(ctx: ExportContext, timeline: Timeline) -> None:
    """One process named after the program; per thread one track, plus a lane per partial
    overlap.  A range is drawn on the thread that started it (``End Thread`` in its args)."""
    records = _ordered(ctx)
    if not records:
        return
    pid = timeline.process(ctx.program or "python", HOST_LABEL)
    us, dur = ctx.to_us, ctx.dur_us
    by_thread: dict[int, list[TxRecord]] = defaultdict(list)
    for r in records:
        by_thread[r.thread].append(r)
    events = []
    for thread, rows in sorted(by_thread.items()):
        lanes = assign_lanes([(r.start_ns, r.end_ns) for r in rows])
        for lane in sorted(set(lanes)):
            timeline.thread(pid, lane_tid(thread, lane), lane_name(f"Thread {thread}", lane),
                            sort_index=thread * _LANE_SLOTS + min(lane, _LANE_SLOTS - 1))
        for r, lane in zip(rows, lanes, strict=True):
            args: dict[str, Any] = {"event_type": _event_type(r), "domain": r.domain}
            if r.start_iteration is not None:
                args["Start Iteration"] = r.start_iteration
            if r.end_thread is not None:
                args["End Thread"] = r.end_thread
            # dur from the integer ends: spans that nest in ns nest in the file (jobprof.plugin.clock)
            events.append({"name": text(r.message) or "(empty message)", "pid": pid,
                           "tid": lane_tid(thread, lane), "ts": us(r.start_ns),
                           "dur": dur(r.start_ns, r.end_ns),
                           "args": args, "ph": "X"})
    timeline.add(events)


def render_json(ctx: ExportContext) -> str | None:
    """The msprof_tx timeline file: the same tracks as in the master timeline."""
    timeline = Timeline(ctx.pid)
    add_tracks(ctx, timeline)
    return timeline.render()
