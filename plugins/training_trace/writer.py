"""step_trace CSV and JSON (docs/msprof.md sections 3 and 4), one file of each per iteration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobprof.plugin import (
    DEVICE_PROCESS,
    NA,
    PROFILER_STREAM,
    SYNTHETIC_TID,
    CollectiveRecord,
    ExportContext,
    Iteration,
    StepPointsRecord,
    Timeline,
    assign_lanes,
    device_label,
    lane_name,
    lane_tid,
    process_pid,
    records_of,
)
from jobprof.plugin import (
    timeline_json as dumps,
)

#: the plugin's raw stream: one record per iteration with its marked points (declared as
#: jobprof.plugin.StepPointsRecord: kineto reads it too)
STREAM = StepPointsRecord.STREAM
HEADER = ["Device_id", "Iteration ID", "FP Start(us)", "BP End(us)", "Iteration End(us)",
          "Iteration Time(us)", "FP to BP Time(us)", "Iteration Refresh(us)", "Data Aug Bound(us)",
          "Model ID"]
#: the reductions of the ``hccl`` stream whose spans are Reduce Start / Duration pairs
REDUCE_OPS = {"all_reduce", "all_reduce_coalesced", "allreduce", "hcom_allreduce", "reduce_scatter",
              "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"}


def fp_bp(it: Iteration, records: Sequence[Mapping[str, Any]]) -> tuple[int | None, int | None]:
    """FP Start and BP End of an iteration: the stream's marked points, else the detector's."""
    rec = StepPointsRecord.of(records)
    return (rec.fp_start, rec.bp_end) if rec is not None else (it.fp_start_ns, it.bp_end_ns)


def step_values(ctx: ExportContext) -> dict[str, Any]:
    """Monotonic-ns facts of the iteration: start, end, fp, bp and the reduce spans."""
    it = ctx.iteration
    fp, bp = fp_bp(it, ctx.records(STREAM))
    reduces = sorted((r.start_ns, r.end_ns) for r in records_of(ctx, CollectiveRecord)
                     if r.op.lower() in REDUCE_OPS and it.start_ns <= r.start_ns <= it.end_ns)
    prev_end = it.start_ns if it.index > 1 else None
    return {"start": it.start_ns, "end": it.end_ns, "fp": fp, "bp": bp, "reduces": reduces,
            "prev_end": prev_end, "own_before_fp": own_ns(ctx, prev_end, fp)}


def own_ns(ctx: ExportContext, start: int | None, end: int | None) -> int:
    """jobprof's own time (the core's ``profiler`` spans) inside ``[start, end)``: the hand-over
    at the previous iteration's end lies before FP Start, and is not the job's data time."""
    if start is None or end is None:
        return 0
    return sum(max(0, min(b, end) - max(a, start)) for a, b in ctx.records(PROFILER_STREAM))


def data_aug_bound(v: Mapping[str, Any]) -> str:
    """Previous Iteration End to FP Start, less jobprof's own time in that gap."""
    if v["prev_end"] is None or v["fp"] is None:
        return NA
    return f"{(v['fp'] - v['prev_end'] - v['own_before_fp']) / 1000:.3f}"


def _dur(a: int | None, b: int | None) -> str:
    return f"{(b - a) / 1000:.3f}" if a is not None and b is not None else NA


def render_csv(ctx: ExportContext) -> str:
    v = step_values(ctx)
    stamp = ctx.stamp_cell
    row = [ctx.device_id, ctx.iteration.index, stamp(v["fp"]), stamp(v["bp"]), stamp(v["end"]),
           _dur(v["start"], v["end"]), _dur(v["fp"], v["bp"]), _dur(v["bp"], v["end"]),
           data_aug_bound(v), ctx.iteration.model_id]
    pairs = v["reduces"] or [None]
    header = HEADER + ["Reduce Start(us)", "Reduce Duration(us)"] * len(pairs)
    for pair in pairs:
        row += [stamp(pair[0]), _dur(*pair)] if pair else [NA, NA]
    return ctx.csv(header, [row])


def step_trace_tid(model_id: int) -> int:
    """The step trace track's tid (its Reduce track is the next): msprof's ``70000 + model id``
    overflows a uint32 for the eager model 4294967295, and a device process holds OS-thread
    streams too, so it lies above them (``jobprof.plugin.timeline``'s track rule)."""
    return SYNTHETIC_TID + 2 * (model_id % (1 << 20))


def render_json(ctx: ExportContext) -> str:
    """The step_trace timeline file: one process with the model's track (old-layout structure,
    pid and tid after the core's track rule)."""
    pid, tid = process_pid(ctx.pid), step_trace_tid(ctx.iteration.model_id)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "pid": pid, "tid": 0, "args": {"name": "Step Trace"}, "ph": "M"},
        {"name": "thread_name", "pid": pid, "tid": tid,
         "args": {"name": f"Model ID:{ctx.iteration.model_id}"}, "ph": "M"},
        {"name": "thread_sort_index", "pid": pid, "tid": tid,
         "args": {"sort_index": 70000 + ctx.iteration.model_id}, "ph": "M"},
    ]
    reduce_name = f"Reduce (Model ID:{ctx.iteration.model_id})"
    return dumps(events + trace_events(ctx, pid, tid, tid + 1, reduce_name))


def add_to_master(ctx: ExportContext, timeline: Timeline) -> None:
    """The step trace thread of the master timeline, in the device process as msprof puts it."""
    model = ctx.iteration.model_id
    pid = timeline.process(DEVICE_PROCESS, device_label(ctx.device_id))
    tid = step_trace_tid(model)
    timeline.thread(pid, tid, f"Step Trace(Model ID:{model})", sort_index=70000 + model)
    timeline.add(trace_events(ctx, pid, tid, tid + 1, f"Reduce(Model ID:{model})", timeline))


def trace_events(ctx: ExportContext, pid: int, tid: int, reduce_tid: int, reduce_name: str,
                 timeline: Timeline | None = None) -> list[dict[str, Any]]:
    """Iteration, FP_BP and refresh slices, the reduces (own track) and the data-bound flow."""
    v = step_values(ctx)
    k = ctx.iteration.index
    us = ctx.to_us
    # ts: us since the job's time base, dur from the integer ends (jobprof.plugin.clock.TimeAxis)
    dur = ctx.dur_us
    # msprof's timeline args give these spans in ns (the CSV gives µs)
    span = lambda a, b: float(b - a)  # noqa: E731
    events: list[dict[str, Any]] = []
    points = {"Iteration ID": k, "FP Start": us(v["fp"]) if v["fp"] is not None else NA,
              "BP End": us(v["bp"]) if v["bp"] is not None else NA, "Iteration End": us(v["end"])}
    events.append({"name": f"Iteration {k}", "pid": pid, "tid": tid, "ts": us(v["start"]),
                   "dur": dur(v["start"], v["end"]),
                   "args": {**points, "Iteration Time(ns)": span(v["start"], v["end"])},
                   "cat": "Iteration Time", "ph": "X"})
    if v["fp"] is not None and v["bp"] is not None:
        events.append({"name": f"FP_BP Time {k}", "pid": pid, "tid": tid, "ts": us(v["fp"]),
                       "dur": dur(v["fp"], v["bp"]),
                       "args": {"Iteration ID": k, "FP Start": us(v["fp"]), "BP End": us(v["bp"]),
                                "FP_BP Time(ns)": span(v["fp"], v["bp"])},
                       "cat": "FP_BP Time", "ph": "X"})
    if v["bp"] is not None:
        events.append({"name": f"Iteration Refresh {k}", "pid": pid, "tid": tid, "ts": us(v["bp"]),
                       "dur": dur(v["bp"], v["end"]),
                       "args": {"Iteration ID": k, "BP End": us(v["bp"]), "Iteration End": us(v["end"]),
                                "Iteration Refresh(ns)": span(v["bp"], v["end"])},
                       "cat": "Iteration Refresh", "ph": "X"})
    # DDP's bucket all-reduces overlap (each is launched before the previous one ends): one
    # track cannot show that, so an overlapping reduce goes to the next lane (jobprof.plugin.lanes)
    lanes = assign_lanes(v["reduces"])
    for lane in sorted(set(lanes)):
        tid_, name = lane_tid(reduce_tid, lane), lane_name(reduce_name, lane)
        if timeline is not None:
            timeline.thread(pid, tid_, name)
        else:
            events.append({"name": "thread_name", "pid": pid, "tid": tid_, "args": {"name": name}, "ph": "M"})
    for j, ((start, end), lane) in enumerate(zip(v["reduces"], lanes, strict=True)):
        events.append({"name": f"Reduce_{k}_{j}", "pid": pid, "tid": lane_tid(reduce_tid, lane),
                       "ts": us(start),
                       "dur": dur(start, end),
                       "args": {"Iteration ID": k, f"Reduce Start {j}": us(start),
                                f"Reduce End {j}": us(end)},
                       "cat": "Reduce", "ph": "X"})
    if v["prev_end"] is not None and v["fp"] is not None:
        # msprof writes a string id and an unfinished 's'/'t' pair, which Perfetto drops
        # (flow_invalid_id): the id is the iteration (flows are keyed by cat, name and id) and the
        # flow ends with 'f' bound to its enclosing slice (FP_BP), as viewers need
        flow = {"name": f"Data_aug Bound {k}", "cat": "Data_aug Bound", "pid": pid, "tid": tid, "id": k}
        events.append({**flow, "ph": "s", "ts": us(v["prev_end"]), "args": {"Iteration ID": k}})
        events.append({**flow, "ph": "f", "bp": "e", "ts": us(v["fp"]),
                       "args": {"Data_aug Bound(us)": float(data_aug_bound(v)),
                                "jobprof hand-over(us)": round(v["own_before_fp"] / 1000, 3)}})
    return events
