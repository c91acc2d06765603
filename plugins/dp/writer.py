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

from jobprof.files.timeline import HOST_LABEL, Timeline
from jobprof.plugin.types import NA, ExportContext

HEADER = ["Device_id", "Timestamp(us)", "Action", "Source", "Cached Buffer Size"]
STREAM = "dp"
PROCESS = "DataLoader"
_ORDER = {"request": 0, "fetch start": 1, "collate start": 2, "collate end": 3, "dequeue": 4}


def _producer(rec: dict[str, Any]) -> str:
    loader, worker = rec["l"], rec.get("w", -1)
    return f"loader{loader}/worker{worker}" if worker >= 0 else f"loader{loader}/main"


def rows(ctx: ExportContext) -> list[tuple[int, str, str, Any]]:
    """(ns, action, source, buffered) for every event of the iteration, in time order."""
    out: list[tuple[int, str, str, Any]] = []
    for rec in ctx.records(STREAM):
        kind = rec.get("k")
        if kind == "next":
            source = f"loader{rec['l']}"
            out.append((rec["t0"], "request", source, rec["q0"]))
            out.append((rec["t1"], "dequeue", _producer(rec), rec["q1"]))
            if "f" in rec:
                t0, t1, t2, _ = rec["f"]
                source = _producer(rec)
                out += [(t0, "fetch start", source, None), (t1, "collate start", source, None),
                        (t2, "collate end", source, None)]
        elif kind == "fetch":
            source = _producer(rec)
            out += [(rec["t0"], "fetch start", source, None), (rec["t1"], "collate start", source, None),
                    (rec["t2"], "collate end", source, None)]
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
    names = {r["l"]: r for r in records if r.get("k") == "loader"}
    us = ctx.to_us
    pid = timeline.process(PROCESS, HOST_LABEL)
    events: list[dict[str, Any]] = []

    def span(name: str, tid: int, start: int, end: int, args: dict[str, Any]) -> None:
        events.append({"name": name, "pid": pid, "tid": tid, "ts": us(start), "dur": ctx.dur_us(start, end),
                       "args": args, "cat": "DataLoader", "ph": "X"})

    for rec in records:
        kind, loader = rec.get("k"), rec.get("l", -1)
        dataset = names.get(loader, {}).get("dataset", "?")
        if kind == "next":
            tid = 1 + loader
            timeline.thread(pid, tid, f"loader{loader} wait ({dataset})", sort_index=tid)
            span(f"next(loader{loader})", tid, rec["t0"], rec["t1"],
                 {"batch": rec["b"], "produced by": _producer(rec),
                  "buffered at request": _na(rec["q0"]), "buffered after": _na(rec["q1"]),
                  "wait(us)": round((rec["t1"] - rec["t0"]) / 1000, 3)})
            if "f" in rec:
                t0, t1, t2, size = rec["f"]
                span("fetch", tid, t0, t1, {"samples": size})
                span("collate", tid, t1, t2, {"samples": size})
        elif kind == "fetch":
            tid = rec["pid"]
            timeline.thread(pid, tid, f"loader{loader} worker{rec['w']} (pid {rec['pid']})",
                            sort_index=1000 + 100 * max(loader, 0) + rec["w"])
            span("fetch", tid, rec["t0"], rec["t1"], {"samples": rec["n"]})
            span("collate", tid, rec["t1"], rec["t2"], {"samples": rec["n"]})
    timeline.add(events)


def _na(value: Any) -> Any:
    return NA if value is None else value
