"""task_memory's files: ``operator_memory`` and ``memory_record`` (msprof's columns) and the master
timeline's memory counters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, OP_MEMORY_STREAM, ExportContext, MemoryEvent, opview
from jobprof.plugins.task_memory.ledger import Namer, allocations, device_label
from jobprof.plugins.task_memory.records import MemorySample, memory_samples

if TYPE_CHECKING:
    from jobprof.plugin import Timeline

#: the step tier's stream: the process's memory, sampled (jobprof.plugins.task_memory.sampler)
SAMPLES = "memory_samples"
#: the iteration's module calls (the core's recorder), to name each allocation's module
MODULES = "memory_modules"

OPERATOR_HEADER = [
    "Device_id",
    "Name",
    "Size(KB)",
    "Allocation Time(us)",
    "Duration(us)",
    "Allocation Total Allocated(KB)",
    "Allocation Total Reserved(KB)",
    "Release Total Allocated(KB)",
    "Release Total Reserved(KB)",
    "Device",
]
RECORD_HEADER = [
    "Device_id",
    "Component",
    "Timestamp(us)",
    "Total Allocated(KB)",
    "Total Reserved(KB)",
    "Device",
]
#: memory_record's components: the allocator's own events (operator tier), its counters sampled
#: (step tier, CUDA), the process's resident set (step tier)
PYTORCH, PYTORCH_SAMPLED, RSS = "PyTorch", "PyTorch (sampled)", "Process RSS"


def kb(value: int | None) -> str:
    """Bytes as the KB cells of the contract (3 decimals); N/A for None."""
    return NA if value is None else f"{value / 1024:.3f}"


def total(value: int) -> str:
    """An allocator's counter (bytes) as KB; N/A where it has none (-1: the CPU's reserve)."""
    return kb(None if value < 0 else value)


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def events(streams: Mapping[str, list[Any]]) -> list[MemoryEvent]:
    """The iteration's allocator events (the core stream ``op_memory``)."""
    return [e for e in streams.get(OP_MEMORY_STREAM, ()) if isinstance(e, MemoryEvent)]


def samples(streams: Mapping[str, list[Any]], before: bool = False) -> list[MemorySample]:
    """The iteration's samples of the step tier; with ``before``, also the last one before it
    (``before`` True, the marks its peak is judged against)."""
    return [s for s in memory_samples(streams.get(SAMPLES, ())) if before or not s.before]


def render_operator_memory(ctx: ExportContext) -> str | None:
    evs = events(ctx.streams)
    if not evs:
        return None
    rows = []
    for a in allocations(evs, Namer(opview.view(ctx), ctx.records(MODULES))):
        alloc, release = a.alloc, a.release
        rows.append(
            [
                ctx.device_id,
                a.name,
                kb(a.size),
                ctx.stamp_cell(alloc.ts) if alloc else "",
                _us(release.ts - alloc.ts) if alloc and release else "",
                total(alloc.total_allocated) if alloc else "",
                total(alloc.total_reserved) if alloc else "",
                total(release.total_allocated) if release else "",
                total(release.total_reserved) if release else "",
                a.device,
            ]
        )
    return ctx.csv(OPERATOR_HEADER, rows)


def render_memory_record(ctx: ExportContext) -> str | None:
    evs = events(ctx.streams)
    taken = samples(ctx.streams)
    if not evs and not taken:
        return None
    rows: list[tuple[int, list[Any]]] = []
    for e in evs:
        rows.append(
            (
                e.ts,
                [
                    ctx.device_id,
                    PYTORCH,
                    ctx.stamp_cell(e.ts),
                    total(e.total_allocated),
                    total(e.total_reserved),
                    device_label(e),
                ],
            )
        )
    exact_cuda = any(e.device_type == 1 for e in evs)
    for s in taken:
        if s.rss >= 0:
            rows.append((s.ns, [ctx.device_id, RSS, ctx.stamp_cell(s.ns), kb(s.rss), NA, "CPU"]))
        if s.allocated is not None and not exact_cuda:
            rows.append(
                (
                    s.ns,
                    [
                        ctx.device_id,
                        PYTORCH_SAMPLED,
                        ctx.stamp_cell(s.ns),
                        kb(s.allocated),
                        kb(s.reserved),
                        f"cuda:{s.device}",
                    ],
                )
            )
    rows.sort(key=lambda r: r[0])  # (ns, row) pairs, by time
    return ctx.csv(RECORD_HEADER, [r for _, r in rows])


def _mb(value: int) -> float:
    return round(value / 2**20, 3)


def add_to_master(ctx: ExportContext, timeline: Timeline) -> None:
    """Counter tracks (Perfetto and chrome://tracing draw ``"ph": "C"`` as a graph): each
    allocator's allocated / reserved MB after every event, and the process's RSS."""
    evs = events(ctx.streams)
    taken = samples(ctx.streams)
    if not evs and not taken:
        return
    pid = timeline.process("Memory", "Memory")
    out: list[dict[str, Any]] = []
    for e in evs:
        args: dict[str, Any] = {"allocated": _mb(e.total_allocated)}
        if e.total_reserved >= 0:
            args["reserved"] = _mb(e.total_reserved)
        out.append(
            {
                "name": f"PyTorch {device_label(e)} (MB)",
                "ph": "C",
                "pid": pid,
                "tid": 0,
                "ts": ctx.to_us(e.ts),
                "args": args,
            }
        )
    exact_cuda = any(e.device_type == 1 for e in evs)
    for s in taken:
        if s.rss >= 0:
            out.append(
                {
                    "name": "Process RSS (MB)",
                    "ph": "C",
                    "pid": pid,
                    "tid": 0,
                    "ts": ctx.to_us(s.ns),
                    "args": {"rss": _mb(s.rss)},
                }
            )
        if s.allocated is not None and not exact_cuda:
            out.append(
                {
                    "name": f"PyTorch cuda:{s.device} sampled (MB)",
                    "ph": "C",
                    "pid": pid,
                    "tid": 0,
                    "ts": ctx.to_us(s.ns),
                    "args": {"allocated": _mb(s.allocated), "reserved": _mb(s.reserved or 0)},
                }
            )
    timeline.add(out)
