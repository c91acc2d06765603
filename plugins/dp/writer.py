"""dp CSV rows and the DataLoader tracks of the master timeline, from one iteration's records.

Action vocabulary (column ``Action``), each row one instant:

==============  =======================================================  ===================
Action          moment                                                   Cached Buffer Size
==============  =======================================================  ===================
request         the loop calls ``next()`` on the loader's iterator       batches ready then
dequeue         ``next()`` returns the batch                             batches ready then
fetch start     a worker (or the main process) starts ``dataset[i]``     N/A
collate start   the samples are fetched; ``collate_fn`` starts           N/A
collate end     the batch is ready (a worker puts it on its queue)       N/A
==============  =======================================================  ===================

``Source`` is ``loader<k>`` for the loop's side, ``loader<k>/worker<w>`` for a worker and
``loader<k>/main`` when the main process produced the batch (``num_workers=0``).
"""

from __future__ import annotations

from typing import Any

from jobprof.plugin import HOST_LABEL, NA, BatchRecord, ExportContext, Timeline, WorkerFetchRecord, records_of
from jobprof.plugins.dp.records import LoaderRecord

HEADER = ["Device_id", "Timestamp(us)", "Action", "Source", "Cached Buffer Size"]
#: the plugin's raw stream, declared as jobprof.plugin.BatchRecord / WorkerFetchRecord /
#: LoaderRecord (kineto reads it too)
STREAM = BatchRecord.STREAM
PROCESS = "DataLoader"
_ORDER = {"request": 0, "fetch start": 1, "collate start": 2, "collate end": 3, "dequeue": 4}


def _producer(loader: int, worker: int | None) -> str:
    worker = -1 if worker is None else worker
    return f"loader{loader}/worker{worker}" if worker >= 0 else f"loader{loader}/main"


def rows(ctx: ExportContext) -> list[tuple[int, str, str, Any]]:
    """(ns, action, source, buffered) for every event of the iteration, in time order."""
    out: list[tuple[int, str, str, Any]] = []
    for raw in ctx.records(STREAM):
        batch = BatchRecord.from_raw(raw)
        if batch is not None:
            source = _producer(batch.loader, batch.worker)
            out.append((batch.start_ns, "request", f"loader{batch.loader}", batch.buffered_before))
            out.append((batch.end_ns, "dequeue", source, batch.buffered_after))
            if batch.produced is not None:
                t0, t1, t2, _ = batch.produced
                out += [(t0, "fetch start", source, None), (t1, "collate start", source, None),
                        (t2, "collate end", source, None)]
            continue
        fetch = WorkerFetchRecord.from_raw(raw)
        if fetch is not None:
            source = _producer(fetch.loader, fetch.worker)
            out += [(fetch.fetch_start, "fetch start", source, None),
                    (fetch.collate_start, "collate start", source, None),
                    (fetch.end, "collate end", source, None)]
    out.sort(key=lambda r: (r[0], _ORDER[r[1]]))
    return out


def render_csv(ctx: ExportContext) -> str | None:
    events = rows(ctx)
    if not events:
        return None
    return ctx.csv(HEADER, ([ctx.device_id, ctx.stamp_cell(ns), action, source, _na(buffered)]
                            for ns, action, source, buffered in events))


def add_to_master(ctx: ExportContext, timeline: Timeline) -> None:
    """One track per loader (the loop's wait, with the main process's own fetches nested in
    it) and one per worker process (fetch, then collate, one batch after another)."""
    records = ctx.records(STREAM)
    if not records:
        return
    names = {r.loader: r.dataset for r in records_of(ctx, LoaderRecord)}
    us = ctx.to_us
    pid = timeline.process(PROCESS, HOST_LABEL)
    events: list[dict[str, Any]] = []

    def span(name: str, tid: int, start: int, end: int, args: dict[str, Any]) -> None:
        events.append({"name": name, "pid": pid, "tid": tid, "ts": us(start), "dur": ctx.dur_us(start, end),
                       "args": args, "cat": "DataLoader", "ph": "X"})

    for raw in records:
        batch = BatchRecord.from_raw(raw)
        if batch is not None:
            loader = batch.loader
            tid = 1 + loader
            timeline.thread(pid, tid, f"loader{loader} wait ({names.get(loader, '?')})", sort_index=tid)
            span(f"next(loader{loader})", tid, batch.start_ns, batch.end_ns,
                 {"batch": batch.number, "produced by": _producer(loader, batch.worker),
                  "buffered at request": _na(batch.buffered_before),
                  "buffered after": _na(batch.buffered_after),
                  "wait(us)": round((batch.end_ns - batch.start_ns) / 1000, 3)})
            if batch.produced is not None:
                t0, t1, t2, size = batch.produced
                span("fetch", tid, t0, t1, {"samples": size})
                span("collate", tid, t1, t2, {"samples": size})
            continue
        fetch = WorkerFetchRecord.from_raw(raw)
        if fetch is not None and fetch.pid is not None:
            tid, loader = fetch.pid, fetch.loader
            timeline.thread(pid, tid, f"loader{loader} worker{fetch.worker} (pid {fetch.pid})",
                            sort_index=1000 + 100 * max(loader, 0) + fetch.worker)
            span("fetch", tid, fetch.fetch_start, fetch.collate_start, {"samples": fetch.samples})
            span("collate", tid, fetch.collate_start, fetch.end, {"samples": fetch.samples})
    timeline.add(events)


def _na(value: Any) -> Any:
    return NA if value is None else value
