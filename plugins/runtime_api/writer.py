"""runtime_api's files: ``api_statistic`` (msprof's columns) and the master timeline's API layer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from jobprof.plugin import (
    HOST_LABEL,
    NA,
    ExportContext,
    assign_lanes,
    events_text,
    lane_name,
    lane_tid,
    opview,
)
from jobprof.plugins.runtime_api.calls import ApiCall, calls

if TYPE_CHECKING:
    from jobprof.plugin import Timeline

HEADER = ["Device_id", "Level", "API Name", "Time(us)", "Count", "Avg(us)", "Min(us)", "Max(us)", "Variance"]
#: the master timeline's process of API calls (task_trace leaves them out of its CANN layer
#: when runtime_api is on, and starts its HostToDevice flows here)
API_PROCESS = "API"
MEMO_KEY = "runtime_api.calls"
#: option: the events one iteration may put in a timeline layer (task_trace's key and default)
LIMIT_KEY = "timeline_max_events"
DEFAULT_LIMIT = 500_000


@attrs.define
class ApiStat:
    """One API's calls of an iteration (or a run): count, total, extremes, sum of squares, ns."""

    level: str
    name: str
    count: int = 0
    total: int = 0
    least: int = 0
    most: int = 0
    squares: int = 0

    def add(self, dur: int) -> None:
        self.least = dur if self.count == 0 else min(self.least, dur)
        self.most = max(self.most, dur)
        self.count += 1
        self.total += dur
        self.squares += dur * dur

    @property
    def variance_us2(self) -> float:
        """The population variance of the durations, µs² (exact in integers up to the division)."""
        n = self.count
        return (n * self.squares - self.total * self.total) / (n * n) / 1e6 if n else 0.0


def us(ns: int) -> str:
    """Exact µs with 3 decimals from integer ns."""
    return f"{ns // 1000}.{ns % 1000:03d}" if ns >= 0 else f"-{us(-ns)}"


def of(ctx: ExportContext) -> list[ApiCall]:
    """The iteration's API calls (computed once per iteration, shared by the writers)."""
    memo = ctx.memo
    if MEMO_KEY not in memo:
        view = opview.view(ctx)
        memo[MEMO_KEY] = calls(view) if view is not None else []
    found: list[ApiCall] = memo[MEMO_KEY]
    return found


def statistics(found: Iterable[ApiCall]) -> list[ApiStat]:
    """Per (level, API name), most total time first (ties by level, then name)."""
    by_name: dict[tuple[str, str], ApiStat] = {}
    for c in found:
        key = (c.level, c.name)
        stat = by_name.get(key)
        if stat is None:
            stat = by_name[key] = ApiStat(c.level, c.name)
        stat.add(c.dur)
    return sorted(by_name.values(), key=lambda s: (-s.total, s.level, s.name))


def render_csv(ctx: ExportContext) -> str | None:
    """``api_statistic``: one row per API; None (no file) for an iteration without API calls."""
    found = of(ctx)
    if not found:
        return None
    rows = [[ctx.device_id, s.level, s.name, us(s.total), s.count, f"{s.total / s.count / 1000:.3f}",
             us(s.least), us(s.most), f"{s.variance_us2:.3f}"] for s in statistics(found)]
    return ctx.csv(HEADER, rows)


def event_limit(ctx: ExportContext) -> int:
    value = ctx.config.get(LIMIT_KEY) if ctx.config is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_LIMIT


def tracks(found: list[ApiCall]) -> list[tuple[int, int]]:
    """(thread, lane) of each call: calls of one thread that overlap without nesting go to lanes."""
    by_thread: dict[int, list[int]] = {}
    for i, c in enumerate(found):
        by_thread.setdefault(c.tid, []).append(i)
    out = [(0, 0)] * len(found)
    for tid, indices in by_thread.items():
        lanes = assign_lanes([(found[i].start, found[i].end) for i in indices])
        for i, lane in zip(indices, lanes, strict=True):
            out[i] = (tid, lane)
    return out


def add_to_master(ctx: ExportContext, timeline: Timeline) -> None:
    """The API layer: an ``API`` process, a track per host thread, one event per call (the first
    ``timeline_max_events`` in time order) with its level, operator, Python frame, correlation id
    and, for a synchronising call, why."""
    found = of(ctx)
    if not found:
        return
    limit = event_limit(ctx)
    if len(found) > limit:
        ctx.notes.append(f"API layer of the master timeline capped at {LIMIT_KEY}={limit} calls (the first "
                         "in time order; api_statistic counts every call)")
        found = found[:limit]
    pid = timeline.process(API_PROCESS, HOST_LABEL)
    events: list[dict[str, Any]] = []
    for c, (tid, lane) in zip(found, tracks(found), strict=True):
        track = lane_tid(tid, lane)
        timeline.thread(pid, track, lane_name(f"Thread {tid}", lane), sort_index=tid)
        args: dict[str, Any] = {"Level": c.level, "Operator": c.operator or NA, "Python frame": c.frame or NA,
                                "Correlation Id": c.corr or NA}
        if c.sync is not None:
            args["Synchronising"] = c.sync
        events.append({"name": c.name, "pid": pid, "tid": track, "ts": ctx.to_us(c.start),
                       "dur": ctx.dur_us(c.start, c.end), "ph": "X", "args": args})
    timeline.add_text([events_text(events)])
