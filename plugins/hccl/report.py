"""The communication section of ``jobprof summary``: which collectives cost the most, per rank."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import COMMUNICATION, COMMUNICATION_BLOCKING, NA, CollectiveRecord, Section, records_of
from jobprof.plugin import histogram as hist
from jobprof.plugins.hccl.collectives import bandwidths
from jobprof.plugins.hccl.writer import STREAM

if TYPE_CHECKING:
    from jobprof.plugin import Profile

TOP = 10


def _gbs(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else NA


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's collectives: ``ops``, one ``[op, group, count, total ns, bytes, rank size,
    failed, median ns, p95 ns]`` per (op, group) in the order first seen (the quantiles within 1%:
    2% buckets), and how many iterations had one; None without a timed collective."""
    # (op, group) -> [count, ns, bytes, rank size, failed, {2% bucket: count}]
    totals: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0, 0, 0, {}])
    iterations: set[int] = set()
    # through the declaration: a damaged record is left out, never a KeyError that disables the
    # plugin; a timed collective as the plugin writes it has its group, bytes and rank size
    for _device, iteration, r in profile.typed(CollectiveRecord, device):
        group = r.group_desc or r.group
        if r.duration_unknown or group is None or r.bytes is None or r.rank_size is None:
            continue
        entry = totals[(r.op, group)]
        entry[0] += 1
        entry[1] += r.end_ns - r.start_ns
        entry[2] += r.bytes
        entry[3] = r.rank_size
        entry[4] += r.state == "failed"
        hist.add(entry[5], r.end_ns - r.start_ns)
        iterations.add(iteration)
    if not totals:
        return None
    # the rows are per device: quantiles, not histograms, keep the facts small
    return {"ops": [[op, group, *values[:5], *map(round, hist.median_p95(values[5]))]
                    for (op, group), values in totals.items()],
            "iterations": len(iterations)}


def _most_time_first(row: list[Any]) -> int:
    """The order of the facts' rows (``[op, group, calls, ns, ...]``): most time first."""
    _op, _group, _calls, ns, *_ = row
    return -ns


def communication_sections(profile: Profile) -> list[Section]:
    rows = []
    for device in profile.devices:
        facts = profile.facts("hccl", device, rank_facts)
        if not facts:
            continue
        # stable: ties keep the order the collectives were first seen in
        ranked = sorted(facts["ops"], key=_most_time_first)
        for op, group, count, ns, size, ranks, failed, *spread in ranked[:TOP]:
            algbw, busbw = bandwidths(op, size, ranks, ns)
            median, p95 = (f"{v / 1e6:.3f}" for v in spread) if spread else (NA, NA)  # older facts: none
            rows.append([device, op, group, ranks, count, f"{ns / 1e6:.3f}", f"{ns / count / 1e6:.3f}",
                         median, p95, f"{size / count / 1e6:.3f}", _gbs(algbw), _gbs(busbw), failed or ""])
    if not rows:
        return []
    notes = ["bandwidths over the summed time and bytes, nccl-tests conventions (docs/plugins/hccl.md "
             "has the formulas); the time includes waiting for the slowest rank",
             "median and p95 per call beside the mean (within 1%): a first call's set-up moves the "
             "mean alone"]
    return [Section("Communication (hccl): top collectives by total time",
                    ["device", "op", "group", "ranks", "count", "total ms", "mean ms", "median ms", "p95 ms",
                     "mean MB",
                     "algbw GB/s", "busbw GB/s", "failed"], rows, notes, key="communication")]


def communication_spans(streams: Mapping[str, list[Any]]) -> dict[str, list] | None:
    """Every collective's span, and those the loop is known to have waited for: synchronous
    calls in full, and for DDP's buckets the stretch from the last bucket's launch (the backward
    pass has no compute left then) to the last bucket's end."""
    if STREAM not in streams:
        return None
    # through the declaration, which refuses a damaged record (a span of one would disable the
    # plugin for the rest of the command, its timeline tracks included)
    records = [r for r in records_of(streams, CollectiveRecord) if not r.duration_unknown]
    blocking = [(r.start_ns, r.end_ns) for r in records if not r.is_async and not r.in_backward]
    buckets = [r for r in records if r.in_backward]
    if buckets:
        blocking.append((max(r.start_ns for r in buckets), max(r.end_ns for r in buckets)))
    return {COMMUNICATION: [(r.start_ns, r.end_ns) for r in records],
            COMMUNICATION_BLOCKING: blocking}
