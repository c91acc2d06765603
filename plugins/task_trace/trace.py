"""task_time timeline file and the operator layers of the master timeline (docs/msprof.md section 4).

Master timeline layers:

* ``CANN`` (label ``CPU``; msprof's name for host calls, readers look for it): every host
  record of the iteration (dispatcher operators, ``record_function`` blocks, CUDA runtime
  calls), nested per OS thread on ``Thread <tid>``.  A record that overlaps a sibling without
  nesting (a block ended on another thread) goes to ``Thread <tid> (overlapping)`` tracks.
* ``Ascend Hardware`` (label ``NPU <dev>``, shared with the step trace thread): one
  ``Stream <id>`` track per stream (CUDA stream; the executing OS thread on a CPU-only job),
  one event per task.
* device ranges (``gpu_user_annotation``: a ``record_function`` block as the GPU ran it, from
  its first kernel's start to its last kernel's end) on ``Stream <id> ranges`` tracks of the
  same process: ranges, not tasks (op_summary does not list them).
* ``HostToDevice`` flows from each task's host call (CPU job: the task's own operator; CUDA:
  the runtime call that launched the kernel) to the task; the ``f`` end has exactly the
  (pid, tid, ts) of the task's event, which is how readers join them.  With ``runtime_api``
  on, the runtime and driver calls are that plugin's ``API`` layer, not drawn here again: the
  flows start on its events (:func:`_api_events`, the same tracks and cap as runtime_api's).
* ``Overlap Analysis`` (label ``NPU <dev>``): ``Computing`` (non-communication tasks),
  ``Communication`` (communication tasks and the ``hccl`` stream's collectives),
  ``Communication(Not Overlapped)`` and ``Free`` over the iteration, stretched over the device
  work it launched (on a GPU that runs on after the host's step ended).

``ts`` values are µs since the job's time base and each ``dur`` comes from the integer ns ends
(``jobprof.plugin.clock.TimeAxis``), so spans that nest in ns nest for the reader too.
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import merge
from itertools import islice

from jobprof.plugin import (
    DEVICE_PROCESS,
    HOST_LABEL,
    CollectiveRecord,
    ExportContext,
    OpRecord,
    Timeline,
    assign_lanes,
    device_label,
    events_text,
    lane_tid,
    opview,
    records_of,
)
from jobprof.plugin import (
    timeline_json as dumps,
)
from jobprof.plugins.task_trace.table import TaskTable, table

HOST_PROCESS = "CANN"
OVERLAP_PROCESS = "Overlap Analysis"
OVERLAP_THREADS = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
FLOW_CAT = "HostToDevice"
#: overlapping lane k of OS thread t is track ``t + k * LANE_STRIDE`` (Linux thread ids stay
#: below 2**22, the largest pid_max, so lanes never collide with another thread)
LANE_STRIDE = 1 << 22
#: the track of stream s's device ranges (gpu_user_annotation) in the device process
RANGE_TRACK = 1 << 22
#: option: operator-tier events one iteration may put in each timeline file
LIMIT_KEY = "timeline_max_events"
#: its default: ~100 MB of master timeline, about what Perfetto's JSON import still opens well
DEFAULT_LIMIT = 500_000
#: master-timeline events per task beside its host call: the task and its flow's two ends
_PER_TASK = 3
#: runtime_api's layer of the master timeline (jobprof.plugins.runtime_api.writer): with that
#: option on, the API calls are drawn there, not in the CANN layer
API_PROCESS = "API"
API_KINDS = ("cuda_runtime", "cuda_driver")


def event_limit(ctx: ExportContext) -> int:
    value = ctx.config.get(LIMIT_KEY) if ctx.config is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_LIMIT


def _capped(ctx: ExportContext, limit: int, what: str) -> None:
    """Say it once per profile (the core lists the iterations); the file marks the cut itself."""
    ctx.notes.append(f"{what} capped at {LIMIT_KEY}={limit} operator-tier events (the first "
                     f"in time order; op_summary and task_time CSVs keep every task)")


def _cutoff(host_starts: list[int], task_starts: list[int], limit: int) -> int | None:
    """The start (ns) of the first host call or task that no longer fits in ``limit`` events
    (a host call counts 1, a task 3), walking both in time order; None when all fit."""
    if len(host_starts) + _PER_TASK * len(task_starts) <= limit:
        return None
    used = 0
    for start, weight in merge(((t, 1) for t in sorted(host_starts)), ((t, _PER_TASK) for t in task_starts)):
        used += weight
        if used > limit:
            return start
    return None


def _marker(pid: int, ts: float, kept: int, total: int, limit: int) -> str:
    """An instant event where the file stops, saying what was left out."""
    return dumps({"name": "jobprof: timeline capped", "ph": "i", "s": "p", "pid": pid, "tid": 0, "ts": ts,
                  "args": {"kept events": kept, "events": total, LIMIT_KEY: limit,
                           "note": "later operators of this iteration are in op_summary / task_time CSVs"}})


def _device_threads(timeline: Timeline, pid: int, tab: TaskTable) -> None:
    for stream in sorted(set(tab.streams)):
        timeline.thread(pid, stream, f"Stream {stream}")


def render_task_time_json(ctx: ExportContext) -> str | None:
    """The task_time timeline file: the device tasks only, one track per stream (the events
    encoded together by orjson: :func:`jobprof.plugin.events_text`)."""
    tab = table(ctx)
    if tab is None:
        return None
    timeline = Timeline(ctx.pid)
    pid = timeline.process(DEVICE_PROCESS, device_label(ctx.device_id))
    _device_threads(timeline, pid, tab)
    limit, total = event_limit(ctx), len(tab.names)
    keep = min(total, limit)
    texts = [events_text([
        {"name": n, "pid": pid, "tid": sid, "ts": ts, "dur": d,
         "args": {"Model Id": model, "Task Type": core, "Stream Id": sid, "Task Id": tid, **fused}, "ph": "X"}
        for n, sid, ts, d, core, tid, model, fused in islice(zip(
            tab.names, tab.streams, tab.ts, tab.tdur, tab.core_types, tab.task_ids, tab.model_ids,
            tab.fused_dicts, strict=True), keep)])]
    if keep < total:
        _capped(ctx, limit, "task_time timeline")
        texts.append(_marker(pid, tab.ts[keep], keep, total, limit))
    texts = [t for t in texts if t]  # events_text of no task is ""
    meta = dumps(timeline.metadata)
    return meta[:-1] + ", " + ", ".join(texts) + "]" if texts else meta


def _host_lanes(view: opview.OpView) -> dict[int, int]:
    """Track lane (>= 1) of every record OpView put on its overlap lane: those records must
    also nest among themselves, so they are spread greedily like msproftx's ranges."""
    records, out = view.records, {}
    by_thread: dict[int, list[int]] = {}
    for i, lane in enumerate(view.lane):
        if lane:
            by_thread.setdefault(records[i].tid, []).append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (records[i].start, -records[i].dur))
        open_ends: list[list[int]] = []
        for i in indices:
            start, end = records[i].start, records[i].start + records[i].dur
            for k, stack in enumerate(open_ends):
                while stack and stack[-1] <= start:
                    stack.pop()
                if not stack or end <= stack[-1]:
                    stack.append(end)
                    out[i] = k + 1
                    break
            else:
                open_ends.append([end])
                out[i] = len(open_ends)
    return out


def _api_events(ctx: ExportContext, records: list[OpRecord]) -> dict[int, tuple[int, float]] | None:
    """With ``runtime_api`` on: the (tid, ts) of the API-layer event runtime_api draws for each
    runtime / driver call (by record index), as it draws them: in start order, the first
    ``timeline_max_events``, overlapping calls of a thread on lanes; None when it is off."""
    if ctx.config is None or not ctx.config.is_on("runtime_api"):
        return None
    api = sorted((i for i, r in enumerate(records) if r.kind in API_KINDS), key=lambda i: records[i].start)
    api = api[:event_limit(ctx)]
    by_thread: dict[int, list[int]] = {}
    for i in api:
        by_thread.setdefault(records[i].tid, []).append(i)
    out = {}
    for tid, indices in by_thread.items():
        lanes = assign_lanes([(records[i].start, records[i].start + records[i].dur) for i in indices])
        for i, lane in zip(indices, lanes, strict=True):
            out[i] = (lane_tid(tid, lane), ctx.to_us(records[i].start))
    return out


def add_to_master(ctx: ExportContext, timeline: Timeline) -> None:
    """The CANN host layer, the device tasks, HostToDevice flows and Overlap Analysis."""
    view = opview.view(ctx)
    if view is None:
        return
    tab = table(ctx)
    records = view.records
    offset = ctx.axis.offset_ns
    host_pid = timeline.process(HOST_PROCESS, HOST_LABEL)
    api = _api_events(ctx, records)
    # host calls only: not the device work, nor Kineto's projections of ranges onto GPU
    # streams (gpu_user_annotation, cuda_profiler_range), whose "thread" is a stream; nor the
    # API calls when runtime_api draws them
    host = [i for i, r in enumerate(records) if r.kind not in opview.DEVICE_KINDS
            and not r.kind.startswith(opview.DEVICE_RANGE_PREFIXES)
            and (api is None or r.kind not in API_KINDS)]
    # an op-heavy iteration (LBFGS: ~170,000 tasks) keeps the time prefix that fits the limit
    limit = event_limit(ctx)
    task_starts = [t.start for t in tab.tasks] if tab is not None else []
    cut = _cutoff([records[i].start for i in host], task_starts, limit)
    n_tasks = len(task_starts) if cut is None else bisect_left(task_starts, cut)
    total = len(host) + _PER_TASK * len(task_starts)
    if cut is not None:
        host = [i for i in host if records[i].start < cut]
    lanes = _host_lanes(view) if any(view.lane) else {}
    track = {}  # record -> its host track
    for tid in sorted({records[i].tid for i in host}):
        timeline.thread(host_pid, tid, f"Thread {tid}")
    hosted = set(host) if len(host) != len(records) else None
    for i, k in sorted(lanes.items(), key=lambda item: item[1]):
        if hosted is not None and i not in hosted:
            continue
        tid = records[i].tid
        track[i] = tid + k * LANE_STRIDE
        timeline.thread(host_pid, track[i], f"Thread {tid} (overlapping)" if k == 1
                        else f"Thread {tid} (overlapping {k})", sort_index=tid)
    hosts = [records[i] for i in host]
    starts = [r.start + offset for r in hosts]
    ts = [s / 1000 for s in starts]
    ts_of = dict(zip(host, ts, strict=True))
    tracks = [track.get(i, r.tid) for i, r in zip(host, hosts, strict=True)] if track else \
        [r.tid for r in hosts]
    # args: the operator type, and PyTorch's own trace args for the inputs (every argument as
    # recorded, non-tensors as []); other records (blocks, runtime calls) say what they are.
    # Dicts encoded together by orjson (events_text); an args dict without inputs is shared
    plain = {(name, kind): {"Op Type": opview.op_type(name)} if kind == "cpu_op" else {"Event Type": kind}
             for name, kind in {(r.name, r.kind) for r in hosts}}
    events: list[dict] = [
        {"name": r.name, "pid": host_pid,
         "args": {"Op Type": plain[r.name, r.kind]["Op Type"], "Input Dims": r.shapes, "Input type": r.dtypes}
         if r.shapes is not None and r.kind == "cpu_op" else plain[r.name, r.kind],
         "tid": tid, "ts": t, "dur": r.dur / 1000, "ph": "X"}
        for r, t, tid in zip(hosts, ts, tracks, strict=True)]
    if tab is not None:
        _add_tasks(ctx, timeline, view, tab, n_tasks, host_pid, track, ts_of, events, api)
    texts = [events_text(events)]
    if view.has_device:
        _add_device_ranges(ctx, timeline, records, cut, texts)
    if cut is not None:
        kept = len(hosts) + _PER_TASK * n_tasks
        _capped(ctx, limit, "master timeline")
        texts.append(_marker(host_pid, (cut + offset) / 1000, kept, total, limit))
    timeline.add_text(texts)
    _add_overlap(ctx, timeline, view)


def _add_tasks(ctx: ExportContext, timeline: Timeline, view: opview.OpView, tab: TaskTable, count: int,
               host_pid: int, track: dict[int, int], ts_of: dict[int, float],
               events: list[dict], api: dict[int, tuple[int, float]] | None = None) -> None:
    """The first ``count`` tasks (all, unless the iteration is capped) and their flows (from the
    API layer's event of the launch when runtime_api draws it: ``api``)."""
    pid = timeline.process(DEVICE_PROCESS, device_label(ctx.device_id))
    _device_threads(timeline, pid, tab)
    events += [{"name": n, "pid": pid, "tid": sid, "ts": ts, "dur": d,
                "args": {"Model Id": model, "Task Type": core, "Stream Id": sid, "Task Id": tid, **fused},
                "ph": "X"}
               for n, sid, ts, d, core, tid, model, fused in islice(zip(
                   tab.names, tab.streams, tab.ts, tab.tdur, tab.core_types, tab.task_ids, tab.model_ids,
                   tab.fused_dicts, strict=True), count)]
    records = view.records
    tasks = tab.tasks[:count]
    sources = [view.launch_of(t) for t in tasks] if view.has_device else [t.index for t in tasks]
    api_pid = timeline.process(API_PROCESS, HOST_LABEL) if api else 0
    for flow, (source, sid, ts) in enumerate(zip(sources, tab.streams[:count], tab.ts[:count], strict=True)):
        if api and source in api:
            api_tid, api_ts = api[source]
            events.append({"name": FLOW_CAT, "cat": FLOW_CAT, "id": flow, "ph": "s", "pid": api_pid,
                           "tid": api_tid, "ts": api_ts})
        elif source in ts_of:
            events.append({"name": FLOW_CAT, "cat": FLOW_CAT, "id": flow, "ph": "s", "pid": host_pid,
                           "tid": track.get(source, records[source].tid), "ts": ts_of[source]})
        else:
            continue  # a kernel whose launch was not recorded (-1), or not drawn (capped)
        events.append({"name": FLOW_CAT, "cat": FLOW_CAT, "id": flow, "ph": "f", "bp": "e", "pid": pid,
                       "tid": sid, "ts": ts})


def _add_device_ranges(ctx: ExportContext, timeline: Timeline, records: list[OpRecord], cut: int | None,
                       events: list[str]) -> None:
    """Kineto's device ranges (``gpu_user_annotation``, CUPTI ranges, ``cuda_sync`` waits), on a
    track beside their stream's tasks; a context-wide sync (stream -1) on the device's own."""
    ranges = [r for r in records if r.kind.startswith(opview.DEVICE_RANGE_PREFIXES)
              and (cut is None or r.start < cut)]
    if not ranges:
        return
    pid = timeline.process(DEVICE_PROCESS, device_label(ctx.device_id))
    offset = ctx.axis.offset_ns
    for stream in sorted({r.tid for r in ranges}):
        name = f"Stream {stream} ranges" if stream >= 0 else "Device-wide ranges"
        timeline.thread(pid, RANGE_TRACK + stream, name, sort_index=stream)
    events += [f'{{"name": {dumps(r.name)}, "pid": {pid}, "tid": {RANGE_TRACK + r.tid}, '
               f'"ts": {(r.start + offset) / 1000!r}, "dur": {r.dur / 1000!r}, '
               f'"args": {{"Event Type": {dumps(r.kind)}}}, "ph": "X"}}' for r in ranges]


def overlap_span(ctx: ExportContext, view: opview.OpView) -> tuple[int, int]:
    """The span Overlap Analysis covers: the iteration, stretched over its own device work (a
    GPU runs the kernels a step launched after the host has moved on: they are that step's)."""
    it = ctx.iteration
    start, end = it.start_ns, it.end_ns
    if view.tasks:
        start = min(start, min(t.start for t in view.tasks))
        end = max(end, max(t.start + t.dur for t in view.tasks))
    return start, end


def _add_overlap(ctx: ExportContext, timeline: Timeline, view: opview.OpView) -> None:
    it = ctx.iteration
    if it.end_ns <= it.start_ns:
        return
    comm = opview.COMMUNICATION
    computing = [(t.start, t.start + t.dur) for t in view.tasks if t.core_type != comm]
    communication = [(t.start, t.start + t.dur) for t in view.tasks if t.core_type == comm]
    communication += [(r.start_ns, r.end_ns) for r in records_of(ctx, CollectiveRecord)]
    spans = opview.overlap(computing, communication, *overlap_span(ctx, view))
    pid = timeline.process(OVERLAP_PROCESS, device_label(ctx.device_id))
    offset = ctx.axis.offset_ns
    events: list[str] = []
    for tid, name in enumerate(OVERLAP_THREADS):
        timeline.thread(pid, tid, name)
        head = f'{{"name": "{name}", "pid": {pid}, "tid": {tid}, "ph": "X", "ts": '
        for start, end in spans[name]:
            events.append(f'{head}{(start + offset) / 1000!r}, "dur": {(end - start) / 1000!r}}}')
    timeline.add_text(events)
