"""The per-iteration trace in PyTorch profiler's JSON format (what ``export_chrome_trace`` writes).

Built only from the iteration's raw streams and the device's job identity
(``ExportContext.job``), so ``jobprof export`` renders the same bytes offline.  Layout of the
events (pid / tid as torch.profiler uses them, plus jobprof's own tracks):

* host events on ``pid`` = the process id, ``tid`` = the OS thread id;
* ``ProfilerStep#<n>`` (``user_annotation``) on the training thread, ``n = iteration - 1``;
* jobprof's derived spans (step phases, collectives, mstx ranges, DataLoader waits) on tracks
  of their own, ``tid = thread + k * 2**22`` (see :mod:`jobprof.plugin.lanes`), named after the thread
  they belong to: they may overlap the thread's operators without nesting;
* CUDA device work on ``pid`` = device index, ``tid`` = stream (Kineto's own layout);
* with task_memory's operator tier, each allocation and free as Kineto's ``[memory]`` instant
  event on the thread that made it;
* on a CPU-only job, each op_summary task again as a ``kernel`` on the pseudo device
  ``pid = PSEUDO_PID_BASE + device id``, ``tid`` = the thread that ran it (see the plugin docs).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from jobprof.plugin import (
    LANE_STRIDE,
    NA,
    OP_MEMORY_STREAM,
    BatchRecord,
    CollectiveRecord,
    ExportContext,
    MemoryEvent,
    OpRecord,
    StepPointsRecord,
    TxRecord,
    WorkerFetchRecord,
    WriterSpec,
    assign_lanes,
    events_text,
    opview,
    records_of,
)

NAME_PREFIX = "kineto"
#: pid of the pseudo device of a CPU-only job: this + device id, far above any Linux pid
#: (pid_max is at most 2**22); torch.profiler's GPU pids are the device index
PSEUDO_PID_BASE = 1_000_000_000
#: track families of a thread (k * 64 + lane): 0 is the thread itself (operators; lane 1 for
#: records that overlap a sibling or the step's edge), then jobprof's derived spans
_OPS, _PHASES, _COLLECTIVES, _MSTX, _DATALOADER = 0, 1, 2, 3, 4
_FAMILY = {_PHASES: "jobprof step phases", _COLLECTIVES: "jobprof collectives", _MSTX: "jobprof mstx",
           _DATALOADER: "jobprof DataLoader"}
_LANES = 64
#: Kineto categories of device work on a GPU
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
#: msproftx domain of record_function blocks (already in the ops stream as user_annotation)
_RECORD_FUNCTION_DOMAIN = "record_function"
#: the streams a file is rendered from, besides the iteration record; all but the operators
#: are other plugins' streams, read through their declarations (jobprof.plugin.records)
_SOURCES = ("ops", OP_MEMORY_STREAM, StepPointsRecord.STREAM, CollectiveRecord.STREAM, TxRecord.STREAM,
            BatchRecord.STREAM)


def profiler_step(iteration: int) -> int:
    """torch.profiler numbers steps from 0 (``ProfilerStep#0`` is the first); jobprof from 1."""
    return iteration - 1


def _tid(thread: int, family: int, lane: int = 0) -> int:
    return thread + (family * _LANES + min(lane, _LANES - 1)) * LANE_STRIDE


def _track_name(thread: int, family: int, lane: int) -> str:
    return f"thread {thread} ({_FAMILY[family]}{f', lane {lane}' if lane else ''})"


class _Builder:
    """Accumulates the events of one file; ``ts`` in µs since the job's time base (the file's
    ``baseTimeNanoseconds``, one for every rank), ``dur`` from the integer ends
    (jobprof.plugin.clock.TimeAxis: a span that nests in ns nests in the file)."""

    def __init__(self, ctx: ExportContext) -> None:
        self.ctx = ctx
        self.offset = ctx.axis.offset_ns
        self.events: list[dict[str, Any]] = []
        self.threads: dict[tuple[int, int], str] = {}
        self.external = 0

    def us(self, ns: int) -> float:
        return (ns + self.offset) / 1000

    def span(self, cat: str, name: str, pid: int, tid: int, start: int, end: int,
             args: dict[str, Any]) -> dict[str, Any]:
        ts = self.us(start)
        event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                 "dur": (end - start) / 1000, "args": args}
        self.events.append(event)
        return event

    def next_external(self) -> int:
        self.external += 1
        return self.external


def _memory(b: _Builder) -> None:
    """The allocator events (task_memory) as Kineto writes them with ``profile_memory``
    (``[memory]`` instant events): HTA's and TensorBoard's memory views read these."""
    for e in b.ctx.records(OP_MEMORY_STREAM):
        if not isinstance(e, MemoryEvent):
            continue
        # as Kineto wrote them: shared memory's reporter puts its total where the others put the reserve
        allocated, reserved = (0, e.total_allocated) if e.pool == "shared" else \
            (e.total_allocated, max(e.total_reserved, 0))
        args = {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": e.bytes,
                "Device Id": e.device, "Device Type": e.device_type, "Addr": e.addr}
        b.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                         "pid": b.ctx.pid, "tid": e.tid, "ts": b.us(e.ts), "args": args})


def training_thread(ctx: ExportContext, view: opview.OpView | None) -> int:
    """The thread that ran the step: the one whose top-level operators took the most time;
    without operators the main thread (its id is the process id on Linux)."""
    if view is not None and view.top:
        busy: dict[int, int] = defaultdict(int)
        for i in view.top:
            busy[view.records[i].tid] += view.records[i].dur
        return max(sorted(busy), key=lambda t: busy[t])
    return ctx.pid


def _na(value: Any) -> Any:
    return NA if value is None else value


def _phases(b: _Builder, tid: int) -> None:
    ctx, it = b.ctx, b.ctx.iteration
    rec = StepPointsRecord.of(ctx.records(StepPointsRecord.STREAM))
    fp, bp = (rec.fp_start, rec.bp_end) if rec is not None else (it.fp_start_ns, it.bp_end_ns)
    track = _tid(tid, _PHASES)
    spans = [("Data Aug Bound", it.start_ns, fp) if it.index > 1 and fp is not None else None,
             ("FP_BP", fp, bp) if fp is not None and bp is not None else None,
             ("Iteration Refresh", bp, it.end_ns) if bp is not None else None]
    for item in spans:
        if item is not None and item[1] <= item[2]:
            b.span("user_annotation", item[0], ctx.pid, track, item[1], item[2],
                   {"External id": b.next_external(), "jobprof source": "training_trace"})
            b.threads[(ctx.pid, track)] = f"thread {tid} ({_FAMILY[_PHASES]})"


def _collectives(b: _Builder) -> None:
    ctx = b.ctx
    by_thread: dict[int, list[CollectiveRecord]] = defaultdict(list)
    for r in records_of(ctx, CollectiveRecord):
        by_thread[r.tid or ctx.pid].append(r)
    for thread, rows in sorted(by_thread.items()):
        rows.sort(key=lambda r: (r.start_ns, -r.end_ns))
        for r, lane in zip(rows, assign_lanes([(r.start_ns, r.end_ns) for r in rows]), strict=True):
            track = _tid(thread, _COLLECTIVES, lane)
            b.threads[(ctx.pid, track)] = _track_name(thread, _COLLECTIVES, lane)
            # torch.profiler's record_param_comms argument names; "Rank" keeps its capital: HTA
            # takes a file's rank from the first lowercase "rank" key (distributedInfo's)
            b.span("user_annotation", f"jobprof:{r.op}", ctx.pid, track, r.start_ns, r.end_ns, {
                "External id": b.next_external(), "Collective name": r.op,
                "In msg nelems": _na(r.count), "Group size": _na(r.rank_size),
                "dtype": r.dtype or NA, "Process Group Name": _na(r.group),
                "Process Group Description": r.group_desc or NA,
                "Process Group Ranks": list(r.ranks) if r.ranks else NA, "Rank": _na(r.rank),
                "Seq": _na(r.seq), "bytes": _na(r.bytes), "async": _na(r.is_async),
                "end from": _na(r.end_from), "duration unknown": r.duration_unknown,
                "jobprof source": CollectiveRecord.STREAM})


def _mstx(b: _Builder, skip_record_function: bool) -> None:
    ctx = b.ctx
    by_thread: dict[int, list[TxRecord]] = defaultdict(list)
    for r in records_of(ctx, TxRecord):
        if skip_record_function and r.domain == _RECORD_FUNCTION_DOMAIN:
            continue
        by_thread[r.thread].append(r)
    for thread, rows in sorted(by_thread.items()):
        rows.sort(key=lambda r: (r.start_ns, -r.end_ns))
        for r, lane in zip(rows, assign_lanes([(r.start_ns, r.end_ns) for r in rows]), strict=True):
            track = _tid(thread, _MSTX, lane)
            b.threads[(ctx.pid, track)] = _track_name(thread, _MSTX, lane)
            args = {"External id": b.next_external(), "domain": _na(r.domain),
                    "jobprof source": TxRecord.STREAM}
            if r.is_marker:  # a marker: an instant, as Kineto writes its instant events
                b.events.append({"ph": "i", "s": "t", "cat": "user_annotation", "name": r.message,
                                 "pid": ctx.pid, "tid": track, "ts": b.us(r.start_ns), "args": args})
            else:
                b.span("user_annotation", r.message, ctx.pid, track, r.start_ns, r.end_ns, args)


def _dataloader(b: _Builder) -> None:
    """The loop's wait in ``next()`` per loader (the main-process fetch nests in it), and each
    worker process's fetch and collate on that worker's own pid."""
    ctx, source = b.ctx, BatchRecord.STREAM
    for raw in ctx.records(source):  # one pass: the two kinds keep their order in the stream
        batch = BatchRecord.from_raw(raw)
        if batch is not None:
            track = _tid(ctx.pid, _DATALOADER, batch.loader)
            b.threads[(ctx.pid, track)] = f"loader{batch.loader} ({_FAMILY[_DATALOADER]})"
            b.span("user_annotation", f"next(loader{batch.loader})", ctx.pid, track, batch.start_ns,
                   batch.end_ns, {"External id": b.next_external(), "batch": _na(batch.number),
                                  "jobprof source": source})
            if batch.produced is not None:
                t0, t1, t2, size = batch.produced
                for name, a, z in (("fetch", t0, t1), ("collate", t1, t2)):
                    b.span("user_annotation", name, ctx.pid, track, a, z,
                           {"External id": b.next_external(), "samples": size, "jobprof source": source})
            continue
        fetch = WorkerFetchRecord.from_raw(raw)
        if fetch is not None and fetch.pid:
            pid = fetch.pid
            b.threads[(pid, pid)] = f"loader{fetch.loader} worker{fetch.worker}"
            for name, a, z in (("fetch", fetch.fetch_start, fetch.collate_start),
                               ("collate", fetch.collate_start, fetch.end)):
                b.span("user_annotation", name, pid, pid, a, z,
                       {"External id": b.next_external(), "samples": _na(fetch.samples),
                        "jobprof source": source})


def _input_args(record: OpRecord) -> dict[str, Any]:
    if record.shapes is None:
        return {}
    return {"Input Dims": record.shapes, "Input type": record.dtypes, "Input Strides": record.strides}


def _host_lanes(view: opview.OpView, train_tid: int, start_ns: int, end_ns: int) -> dict[int, int]:
    """The lane of each host record that cannot sit on its thread's track: one that overlaps a
    sibling without nesting (the operator tree's second lane), and on the training thread one that
    sticks out of ProfilerStep (a block cut at the iteration end, the optimizer step whose post
    hook ended the iteration).  Those of one thread may overlap each other too, so they are spread
    over lanes 1, 2, ... with ``assign_lanes``."""
    records = view.records
    off: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        if r.kind in _GPU_CATS or r.kind.startswith("cuda_profiler"):
            continue
        start, end = r.start, r.start + r.dur
        if view.lane[i] or (r.tid == train_tid and (start < start_ns or end > end_ns)):
            off.setdefault(r.tid, []).append(i)
    lanes: dict[int, int] = {}
    for indices in off.values():
        spans = [(records[i].start, records[i].start + records[i].dur) for i in indices]
        for i, lane in zip(indices, assign_lanes(spans), strict=True):
            lanes[i] = lane + 1
    return lanes


def _operators(b: _Builder, view: opview.OpView, train_tid: int) -> str:
    """Every record of the ops stream as torch.profiler writes it; returns how device tasks
    are shown (``cuda``, ``cpu_pseudo_device`` or ``none``)."""
    ctx, records, it = b.ctx, view.records, b.ctx.iteration
    task_of = {t.index: t for t in view.tasks}
    externals = [b.next_external() for _ in records]
    correlation = 0
    pseudo = not view.has_device and bool(view.tasks)
    lanes = _host_lanes(view, train_tid, it.start_ns, it.end_ns)
    for i, r in enumerate(records):
        kind = r.kind
        start, end = r.start, r.start + r.dur
        if kind in _GPU_CATS:
            launch = view.launches.get(r.link, -1)  # the runtime call that launched it
            op = view.innermost_dispatch(launch) if launch >= 0 else -1
            args = {"External id": externals[op] if op >= 0 else 0, "device": r.device, "stream": r.tid,
                    "correlation": r.link}
            extra = r.extra
            if extra:
                try:
                    parsed = json.loads(extra) if isinstance(extra, str) else extra
                    if isinstance(parsed, dict):
                        args = {**parsed, **args}
                except ValueError:
                    pass
            b.threads[(r.device, r.tid)] = f"stream {r.tid}"
            b.span(kind, r.name, r.device, r.tid, start, end, args)
            continue
        if kind.startswith("cuda_profiler"):
            continue  # Kineto's projection of ranges onto GPU streams; nothing to add
        args = {"External id": externals[i], "Record function id": 0, **_input_args(r)}
        if kind in ("cuda_runtime", "cuda_driver"):
            args["correlation"] = r.corr
        thread = r.tid
        lane = lanes.get(i, 0)
        track = _tid(thread, _OPS, lane)
        b.threads[(ctx.pid, track)] = f"thread {thread}" if not lane else \
            f"thread {thread} (overlapping{f' {lane}' if lane > 1 else ''})"
        task = task_of.get(i) if pseudo else None
        if task is not None:
            correlation += 1
            args["correlation"] = correlation
        b.span(kind, r.name, ctx.pid, track, start, end, args)
        if task is not None:
            # the task as the CPU-only job's device work: a kernel on the pseudo device, linked
            # to its operator by correlation like a CUDA kernel to its launch
            pid = PSEUDO_PID_BASE + ctx.device_id
            b.threads[(pid, task.stream)] = f"stream {task.stream} (CPU thread {task.stream})"
            b.span("kernel", r.name, pid, task.stream, start, end, {
                "External id": externals[i], "device": ctx.device_id, "stream": task.stream,
                "correlation": correlation, "Task Type": task.core_type, "Task Id": task.task_id,
                "jobprof pseudo device": True})
    if view.has_device:
        return "cuda"
    return "cpu_pseudo_device" if pseudo else "none"


def _metadata(b: _Builder, device_mode: str) -> list[dict[str, Any]]:
    ctx = b.ctx
    pids = sorted({e["pid"] for e in b.events} | {ctx.pid})
    out: list[dict[str, Any]] = []
    for pid in pids:
        if pid == ctx.pid:
            name, label = ctx.program or "python", "CPU"
        elif device_mode == "cpu_pseudo_device" and pid == PSEUDO_PID_BASE + ctx.device_id:
            name, label = f"jobprof pseudo device {ctx.device_id}", "CPU tasks (op_summary) as kernels"
        elif device_mode == "cuda" and pid < PSEUDO_PID_BASE and pid != ctx.pid and any(
                e["pid"] == pid and e["cat"] in _GPU_CATS for e in b.events):
            name, label = ctx.program or "python", f"GPU {pid}"
        else:
            name, label = f"{ctx.program or 'python'} (DataLoader worker)", "CPU"
        meta = {"ph": "M", "ts": 0, "pid": pid, "tid": 0}
        out += [{**meta, "name": "process_name", "args": {"name": name}},
                {**meta, "name": "process_labels", "args": {"labels": label}},
                {**meta, "name": "process_sort_index", "args": {"sort_index": pid}}]
    for (pid, tid), name in sorted(b.threads.items()):
        meta = {"ph": "M", "ts": 0, "pid": pid, "tid": tid}
        out += [{**meta, "name": "thread_name", "args": {"name": name}},
                {**meta, "name": "thread_sort_index", "args": {"sort_index": tid}}]
    return out


def distributed_info(job: Any) -> dict[str, Any]:
    """torch.profiler's ``distributedInfo``.  Outside a distributed job torch omits it and HTA
    then warns that the file has no rank and takes 0: the file says rank 0 of 1 itself (what HTA's
    warning asks for), without a backend."""
    rank, world = job.get("rank_id", NA), job.get("world_size", NA)
    if not isinstance(rank, int) or not isinstance(world, int):
        return {"rank": 0, "world_size": 1}
    return {"backend": job.get("backend", NA), "rank": rank, "world_size": world}


def render(ctx: ExportContext) -> str:
    """The iteration's trace file (see the module docstring)."""
    b = _Builder(ctx)
    view = opview.view(ctx)
    tid = training_thread(ctx, view)
    it = ctx.iteration
    step = b.span("user_annotation", f"ProfilerStep#{profiler_step(it.index)}", ctx.pid, tid, it.start_ns,
                  it.end_ns, {"External id": b.next_external(), "Record function id": 0})
    b.threads[(ctx.pid, tid)] = f"thread {tid}"
    _phases(b, tid)
    device_mode = _operators(b, view, tid) if view is not None else "none"
    _collectives(b)
    _mstx(b, skip_record_function=view is not None)
    _dataloader(b)
    _memory(b)
    sources = ["iteration", *(s for s in _SOURCES if ctx.records(s))]
    name = SPEC.filename(ctx.device_id, it.model_id, it.index)
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    doc["distributedInfo"] = distributed_info(ctx.job)  # before traceEvents: HTA reads the first "rank"
    doc.update({
        "displayTimeUnit": "ms", "baseTimeNanoseconds": ctx.axis.base_ns,
        "jobprof": {"iteration": it.index, "profiler_step": profiler_step(it.index),
                    "device_id": ctx.device_id, "rank_id": ctx.job.get("rank_id", NA),
                    "sources": sources, "device_tasks": device_mode,
                    "pseudo_device_pid": PSEUDO_PID_BASE + ctx.device_id
                    if device_mode == "cpu_pseudo_device" else None,
                    "note": _NOTES[device_mode]},
        "traceName": name,
    })
    # the header by json, the events (nearly all of the file) by orjson (events_text: 4x faster)
    events = events_text(_metadata(b, device_mode) + [step] + [e for e in b.events if e is not step])
    head = json.dumps(doc, ensure_ascii=False)
    return f'{head[:-1]}, "traceEvents": [{events}]}}'


_NOTES = {
    "cpu_pseudo_device": "CPU-only job: each op_summary task (a top-level operator run on the CPU) is "
                         "written twice, as its cpu_op and as a 'kernel' on the pseudo device "
                         "(pid = pseudo_device_pid, stream = the OS thread that ran it), so kernel-based "
                         "tools (HTA's temporal breakdown) see the job's device work; no GPU was used",
    "cuda": "kernels, copies and fills are the device work Kineto recorded on the GPU",
    "none": "no operator records for this iteration (task_trace off?): ProfilerStep, step phases, "
            "collectives and markers only; no device work",
}

#: the plugin's one writer: ``timeline/kineto_<device>_<model>_<iteration>.json``
SPEC = WriterSpec(NAME_PREFIX, "json", render, "the iteration in PyTorch profiler's JSON format "
                  "(ProfilerStep#<iter-1>, distributedInfo): for HTA and Perfetto")
