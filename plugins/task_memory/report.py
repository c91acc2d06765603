"""task_memory's part of ``jobprof summary`` / ``report``: peaks, who holds them, and findings.

Map/reduce: :func:`iteration_digest` (``jobprof_iteration_facts``) reduces one iteration's
allocator events and samples to a few numbers, which the exporter keeps as it renders the
iteration; :func:`rank_facts` reduces a device's digests to its series (binned to at most
:data:`SERIES` rows), the iteration with the highest peak and its holders, and the creep verdict
(naming what creeps reads the last :data:`PAIRING` iterations' windows again, only then);
:func:`sections` reads them back.

Findings (each once per rank):

* ``memory_oom``: the job died of an out-of-memory error (the digest of
  :mod:`jobprof.plugins.task_memory.oom`);
* ``memory_creep``: memory at the iteration's end grows from iteration to iteration (in at
  least :data:`CREEP_RISES` of the steps after the first iteration, by at least
  :data:`CREEP_MIN_BYTES` and :data:`CREEP_MIN_SHARE` of the peak in all), naming the
  operator whose allocations are never freed, when the operator tier saw them;
* ``memory_fragmentation``: on an allocator with a reserve (CUDA), reserved exceeds allocated at
  the peak by at least :data:`FRAGMENT_MIN_BYTES` and :data:`FRAGMENT_SHARE` of the reserve;
* ``memory_one_op``: one operator's allocations hold at least :data:`ONE_OP_SHARE` of the peak.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, OPS_STREAM, Finding, OpView, Section
from jobprof.plugins.task_memory.ledger import Namer, Peak, names_of, peaks
from jobprof.plugins.task_memory.records import Holder, SeriesRow, Survivor, digest_rss, memory_samples
from jobprof.plugins.task_memory.writer import MODULES, events, samples

if TYPE_CHECKING:
    from jobprof.plugin import Iteration, Profile

MIB = 1 << 20
#: per-iteration rows kept per device (a longer run keeps, per bin, its highest iteration)
SERIES = 300
#: per-iteration rows the section shows (and the report draws), binned the same way
SHOWN = 30
TOP = 10
CREEP_RISES = 0.75
CREEP_MIN_BYTES = 1 * MIB
CREEP_MIN_SHARE = 0.01
CREEP_MIN_ITERATIONS = 4
#: the iterations whose allocations are paired to name what creeps (their windows are read again)
PAIRING = 32
FRAGMENT_MIN_BYTES = 256 * MIB
FRAGMENT_SHARE = 0.3
ONE_OP_SHARE = 0.5


def _rss(samples: Iterable[Any]) -> tuple[int | None, int | None, bool]:
    """(peak RSS, RSS at the end, exact) of one iteration's samples (see the sampler; raw or
    decoded)."""
    samples = memory_samples(samples)
    before = [s for s in samples if s.before]
    during = [s for s in samples if not s.before and s.rss >= 0]
    if not during:
        return None, None, False
    peak = max(s.rss for s in during)
    exact = False
    if before:
        mark = max(s.hwm for s in during)
        if mark > before[-1].hwm:  # the process's high-water mark rose in this iteration
            peak, exact = max(peak, mark), True
    return peak, during[-1].rss, exact


def _sampled_cuda(samples: Iterable[Any]) -> tuple[int | None, int | None, int | None, str | None]:
    """(peak allocated, peak reserved, end allocated, device) from the sampled CUDA counters
    (raw or decoded samples)."""
    samples = memory_samples(samples)
    during = [s for s in samples if not s.before and s.allocated is not None]
    if not during:
        return None, None, None, None
    before = [s.max_allocated for s in samples if s.before and s.max_allocated is not None]
    peak = max(s.allocated for s in during if s.allocated is not None)
    mark = max(s.max_allocated or 0 for s in during)
    if before and mark > before[-1]:  # the allocator's own peak rose: exact
        peak = max(peak, mark)
    return (
        peak,
        max(s.reserved or 0 for s in during),
        during[-1].allocated,
        f"cuda:{during[-1].device}",
    )


def iteration_digest(iteration: Iteration, streams: Mapping[str, list[Any]]) -> dict[str, Any] | None:
    """One iteration's memory in a few numbers (``jobprof_iteration_facts``, kept by the exporter as
    it renders an iteration with operators): ``allocator``, its ``allocated`` / ``reserved`` peak
    and ``end`` count, the ``holders`` at the peak (top 10, by operator and module) and what
    was allocated ``earlier``; the process's ``rss`` (peak, end, exact)."""
    evs = events(streams)
    taken = samples(streams, before=True)
    rss_peak, rss_end, exact = _rss(taken)
    out: dict[str, Any] = {}
    if rss_peak is not None:
        out["rss"] = [rss_peak, rss_end, exact]
    if evs:
        ops = streams.get(OPS_STREAM) or []
        names = names_of(evs, Namer(OpView(list(ops)) if ops else None, streams.get(MODULES, ())))
        found = peaks(evs, names)
        # the device's accelerator when it has one, else the host's allocator
        main = _main(found)
        out.update(
            allocator=main.device,
            allocated=main.allocated,
            reserved=main.reserved if main.reserved >= 0 else None,
            end=main.end_allocated,
            holders=[[n, b] for n, b in main.holders[:TOP]],
            earlier=main.earlier,
        )
    else:
        peak, reserved, end, where = _sampled_cuda(taken)
        if peak is not None:
            out.update(allocator=where, allocated=peak, reserved=reserved, end=end, holders=[], earlier=None)
    return out or None


def _main(found: list[Peak]) -> Peak:
    """The allocator a device's summary follows: its accelerator's, else the CPU allocator
    (not shared memory), else the first."""
    return next((p for p in found if not p.device.startswith("CPU")), None) or next(
        (p for p in found if p.device == "CPU"), found[0]
    )


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    if not profile.is_on(device, "task_memory"):
        return None
    series: list[SeriesRow] = []
    allocator: str | None = None
    best: dict[str, Any] | None = None
    for index, d in profile.iteration_facts("task_memory", device, iteration_digest):
        rss_peak, rss_end, rss_exact = digest_rss(d)
        holders = d.get("holders") or []
        top = Holder.of(holders[:1])
        name, size = top[0] if top else (None, None)
        series.append(
            SeriesRow(index, d.get("allocated"), d.get("reserved"), rss_peak, d.get("end"), rss_end, name,
                      size, rss_exact)
        )
        if d.get("allocated") is not None:
            allocator = d.get("allocator")
            if best is None or d["allocated"] > best["allocated"]:
                best = {
                    "iteration": index,
                    "device": allocator,
                    "allocated": d["allocated"],
                    "reserved": d.get("reserved"),
                    "earlier": d.get("earlier"),
                    "holders": holders,
                }
    if not series:
        return None
    creep = _creep(series)
    growth = _growth(series)
    ended = [r.iteration for r in series if r.end is not None]
    survivors = _survivors(profile, device, ended) if creep else []
    if creep:
        _name_creep(creep, survivors)
    oom = profile.info(device).get("jobprof", {}).get("memory_oom")
    return {
        "allocator": allocator,
        "series": [list(r) for r in _binned(series)],  # the facts' JSON: 9-slot lists
        "iterations": len(series),
        "peak": best,
        "peak_rss": max((r.rss_peak for r in series if r.rss_peak is not None), default=None),
        "creep": creep,
        "growth": growth,
        "survivors": [list(s) for s in survivors],
        "oom": oom if isinstance(oom, dict) else None,
    }


def _survivors(profile: Profile, device: int, indices: list[int]) -> list[Survivor]:
    """The allocations of the last :data:`PAIRING` iterations with allocator events (``indices``)
    still live at the end of the last one (which is left out: the next may free them), by
    operator: ``[name, bytes, iterations]``, most bytes first (top 5).  Reads those iterations'
    operator windows (only when memory creeps)."""
    window = set(indices[-PAIRING:])
    if len(window) < 2:
        return []
    last = max(window)
    live: dict[tuple[int, int, str, int], tuple[str, int, int]] = {}
    skip = _Except(window)
    for index, streams in profile.streams(device, skip_ops=skip):
        evs = events(streams) if index in window else []
        if not evs:
            continue
        ops = streams.get(OPS_STREAM) or []
        names = names_of(evs, Namer(OpView(list(ops)) if ops else None, streams.get(MODULES, ())))
        for e, name in zip(evs, names, strict=True):
            key = (e.device_type, e.device, e.pool, e.addr)
            if e.bytes > 0:
                live[key] = (name, e.bytes, index)
            else:
                live.pop(key, None)
    by_name: dict[str, list[Any]] = {}
    for name, size, index in live.values():
        if index < last:
            kept = by_name.setdefault(name, [name, 0, set()])
            kept[1] += size
            kept[2].add(index)
    ranked = sorted((Survivor(n, b, len(its)) for n, b, its in by_name.values()), key=lambda r: -r.bytes)
    return [r for r in ranked if r.iterations * 2 >= len(window) - 1][:5]


class _Except:
    """Every iteration but those of ``window`` (``skip_ops``: their operator windows are not read)."""

    def __init__(self, window: set[int]) -> None:
        self.window = window

    def __contains__(self, index: object) -> bool:
        return index not in self.window


def _notable(holders: list[Holder], peak: int | None) -> list[Holder]:
    """The holders worth a row: the largest, and the others that hold 0.1% of the peak or more."""
    return [h for i, h in enumerate(holders) if i == 0 or not peak or h.bytes >= peak / 1000]


def _binned(series: list[SeriesRow], limit: int = SERIES) -> list[SeriesRow]:
    """At most ``limit`` rows: of each run of consecutive iterations, the one with the highest peak."""
    if len(series) <= limit:
        return series
    size = -(-len(series) // limit)
    return [
        max(series[i : i + size], key=lambda r: (r.allocated or 0, r.rss_peak or 0))
        for i in range(0, len(series), size)
    ]


def _binned_note(iterations: int, kept: int, shown: int) -> str:
    """What a thinned series shows: the facts kept ``kept`` of ``iterations`` rows, the
    section shows ``shown`` of those (each step keeps the highest peak of each run)."""
    run = -(-iterations // shown)
    exact = iterations == kept or kept <= shown  # one thinning: every run has the same length
    return (f"{iterations} iterations in {shown} rows: each row is the iteration with the highest peak "
            f"of a run of {'' if exact else 'about '}{run} consecutive ones (its number in the "
            f"iteration column); every iteration's figures are in memory_record_*.csv")


def _end_points(series: list[SeriesRow], basis: str) -> list[tuple[int, int]]:
    """(iteration, memory at its end) after the first iteration: the allocator's count
    (``allocated``) or the process's RSS (``rss``), where known."""
    ends = [(r.iteration, r.end if basis == "allocated" else r.rss_end) for r in series[1:]]
    return [(i, v) for i, v in ends if v is not None]


def _creep(series: list[SeriesRow]) -> dict[str, Any] | None:
    """Growth of memory at the iteration's end (allocated where known, else RSS), after the
    first iteration (which allocates what stays: optimizer state, caches)."""
    points: list[tuple[int, int]] = []
    basis = ""
    for name in ("allocated", "rss"):
        points = _end_points(series, name)
        if len(points) >= CREEP_MIN_ITERATIONS:
            basis = name
            break
    if not basis:
        return None
    values = [v for _, v in points]
    steps = [b - a for a, b in itertools.pairwise(values)]
    (first, start), (last, end) = points[0], points[-1]
    growth = end - start
    peak = max(r.allocated or r.rss_peak or 0 for r in series)
    rises = sum(1 for s in steps if s > 0)
    if growth < max(CREEP_MIN_BYTES, CREEP_MIN_SHARE * peak) or rises < CREEP_RISES * len(steps):
        return None
    return {
        "basis": basis,
        "first": first,
        "last": last,
        "from_bytes": start,
        "to_bytes": end,
        "per_iteration": growth / (last - first),
    }


def _growth(series: list[SeriesRow]) -> int | None:
    """Bytes per iteration by which the allocator's count (else the RSS) at the iteration's end
    moved from the second iteration to the last (the first allocates what stays), rounded."""
    for basis in ("allocated", "rss"):
        points = _end_points(series, basis)
        if len(points) >= 2:
            (first, start), (last, end) = points[0], points[-1]
            if last > first:
                return round((end - start) / (last - first))
    return None


def _name_creep(creep: dict[str, Any], survivors: list[Survivor]) -> None:
    """The operator whose allocations are never freed: the one holding the most of them."""
    if survivors:
        top = survivors[0]
        creep.update(operator=top.name, operator_bytes=top.bytes, operator_iterations=top.iterations)


def _mib(value: int | None) -> str:
    return NA if value is None else f"{value / MIB:.3f}"


def sections(profile: Profile) -> list[Section]:
    summary: list[list[Any]] = []
    held: list[list[Any]] = []
    findings: list[Finding] = []
    notes: list[str] = []
    chosen: tuple[int, dict[str, Any]] | None = None
    many = len(profile.devices) > 1
    for device in profile.devices:
        facts = profile.facts("task_memory", device, rank_facts)
        if not facts:
            continue
        rank = profile.rank(device)
        who = f"rank {rank}: " if many else ""
        peak = facts.get("peak") or {}
        creep = facts.get("creep")
        holders = Holder.of(peak.get("holders"))
        summary.append(
            [
                device,
                facts.get("allocator") or NA,
                _mib(peak.get("allocated")),
                peak.get("iteration", NA),
                _mib(peak.get("reserved")),
                _mib(facts.get("peak_rss")),
                _mib(round(creep["per_iteration"])) if creep else _mib(facts.get("growth")),
                f"{holders[0].name} ({_mib(holders[0].bytes)})" if holders else NA,
            ]
        )
        for h in _notable(holders, peak.get("allocated")):
            held.append(
                [
                    device,
                    peak["iteration"],
                    h.name,
                    _mib(h.bytes),
                    f"{100 * h.bytes / peak['allocated']:.1f}" if peak.get("allocated") else NA,
                ]
            )
        if peak.get("earlier"):
            held.append(
                [
                    device,
                    peak["iteration"],
                    "(allocated before the iteration)",
                    _mib(peak["earlier"]),
                    f"{100 * peak['earlier'] / peak['allocated']:.1f}",
                ]
            )
        if chosen is None or (peak.get("allocated") or 0) > (chosen[1].get("peak") or {}).get("allocated", 0):
            chosen = (rank, facts)
        findings += _findings(who, rank, facts)
    if not summary:
        return []
    notes.append(
        "peak allocated / reserved: the PyTorch allocator's own counters (operator tier: at every "
        "allocation; step tier on CUDA: sampled, exact when the allocator's high-water mark rose); "
        "on CPU it counts only blocks allocated while the capture ran, and has no reserve (N/A); "
        "peak RSS: the process, sampled every 20 ms, exact when its high-water mark rose; growth per "
        "iteration: of the allocator's count (else the RSS) at the iteration's end, from the second "
        "iteration to the last"
    )
    out = [
        Section(
            "Memory: peak per rank (MiB)",
            [
                "device",
                "allocator",
                "peak allocated",
                "at iteration",
                "peak reserved",
                "peak RSS",
                "growth per iteration",
                "largest holder at the peak",
            ],
            summary,
            notes,
            key="memory",
            findings=findings,
        )
    ]
    if held:
        out.append(
            Section(
                "Memory at the peak: live allocations by operator (MiB)",
                ["device", "iteration", "operator", "MiB", "% of peak"],
                held,
                key="memory_peak",
            )
        )
    if chosen is not None:
        rank, facts = chosen
        shown = _binned(SeriesRow.of(facts["series"]), SHOWN)
        rows = [
            [
                r.iteration,
                _mib(r.allocated),
                _mib(r.reserved),
                _mib(r.rss_peak),
                _mib(r.end),
                f"{r.holder} ({_mib(r.holder_bytes)})" if r.holder else NA,
            ]
            for r in shown
        ]
        binned = facts["iterations"] > len(shown)
        out.append(
            Section(
                f"Memory per iteration (MiB){f', rank {rank}' if many else ''}",
                [
                    "iteration",
                    "peak allocated",
                    "peak reserved",
                    "peak RSS",
                    "end allocated",
                    "largest holder",
                ],
                rows,
                [_binned_note(facts["iterations"], len(facts["series"]), len(shown))] if binned else [],
                key="memory_iterations",
                chart=("peak_allocated", "peak_reserved", "peak_rss"),
            )
        )
    return out


def _findings(who: str, rank: int, facts: dict[str, Any]) -> list[Finding]:
    out = []
    peak = facts.get("peak") or {}
    oom = facts.get("oom")
    if oom:
        cuda = oom.get("cuda") or {}
        largest = cuda.get("largest") or []
        live = "; ".join(f"{_mib(b['bytes'])} MiB at {b['where'] or 'an unknown frame'}" for b in largest[:3])
        holders = Holder.of(peak.get("holders"))
        held = ", ".join(f"{h.name} {_mib(h.bytes)} MiB" for h in holders[:3])
        text = (
            f"{who}the job died of {oom.get('error')} in iteration {oom.get('iteration')}: "
            f"{oom.get('message', '')}"
            + (f"; it asked for {_mib(oom['asked_bytes'])} MiB" if oom.get("asked_bytes") else "")
            + (f"; the largest live blocks: {live}" if live else "")
            + (
                f"; at the memory peak (iteration {peak.get('iteration')}) the operators holding the most "
                f"were {held}"
                if held
                else ""
            )
            + (
                f"; process RSS {_mib(oom.get('rss_bytes'))} MiB (peak {_mib(oom.get('rss_peak_bytes'))})"
                if oom.get("rss_bytes", -1) >= 0
                else ""
            )
        )
        out.append(
            Finding(
                "memory_oom",
                text,
                {"rank": rank, **{k: v for k, v in oom.items() if k != "cuda"}, "largest": largest},
                weight=3,
            )
        )
    creep = facts.get("creep")
    if creep:
        what = "allocated memory" if creep["basis"] == "allocated" else "the process's RSS"
        text = (
            f"{who}{what} grows iteration over iteration: +{_mib(round(creep['per_iteration']))} MiB per "
            f"iteration at the iteration's end, from {_mib(creep['from_bytes'])} MiB (iteration "
            f"{creep['first']}) to {_mib(creep['to_bytes'])} MiB (iteration {creep['last']})"
        )
        if creep.get("operator"):
            text += (
                f"; allocations by {creep['operator']} are never freed ({creep['operator_iterations']} "
                f"iterations, {_mib(creep['operator_bytes'])} MiB still live): something keeps them "
                "(a list, a tensor kept with its graph, a cache)"
            )
        out.append(Finding("memory_creep", text, {"rank": rank, **creep}, weight=3))
    allocated, reserved = peak.get("allocated"), peak.get("reserved")
    if allocated and reserved and reserved - allocated >= max(FRAGMENT_MIN_BYTES, FRAGMENT_SHARE * reserved):
        unused = 100 * (reserved - allocated) / reserved
        out.append(
            Finding(
                "memory_fragmentation",
                f"{who}the allocator reserved {_mib(reserved)} MiB for a peak of {_mib(allocated)} MiB "
                f"allocated (iteration {peak['iteration']}): {unused:.0f}% of "
                "the reserve was not in use (fragmentation, or cached blocks of other sizes); "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True often reclaims it",
                {"rank": rank, "iteration": peak["iteration"], "allocated": allocated, "reserved": reserved},
                weight=2,
            )
        )
    holders = Holder.of(peak.get("holders"))
    if allocated and holders and holders[0].bytes >= ONE_OP_SHARE * allocated:
        name, size = holders[0].name, holders[0].bytes
        out.append(
            Finding(
                "memory_one_op",
                f"{who}{name} holds {100 * size / allocated:.0f}% of the memory peak ({_mib(size)} of "
                f"{_mib(allocated)} MiB, iteration {peak['iteration']})",
                {
                    "rank": rank,
                    "operator": name,
                    "bytes": size,
                    "peak": allocated,
                    "iteration": peak["iteration"],
                },
            )
        )
    return out
