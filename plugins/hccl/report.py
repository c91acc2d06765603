"""The communication section of ``jobprof summary``: which collectives cost the most, per rank."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import COMMUNICATION, COMMUNICATION_BLOCKING, NA, Section
from jobprof.plugins.hccl.collectives import bandwidths
from jobprof.plugins.hccl.writer import STREAM

if TYPE_CHECKING:
    from jobprof.plugin import Profile

TOP = 10


def _gbs(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else NA


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's collectives: ``ops``, one ``[op, group, count, total ns, bytes, rank size,
    failed]`` per (op, group) in the order first seen, and how many iterations had one; None
    without a timed collective."""
    # (op, group) -> [count, ns, bytes, rank size, failed]
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    iterations: set[int] = set()
    for r in profile.records(STREAM, device):
        if r.get("duration_unknown"):
            continue
        entry = totals[(r["op"], r.get("group_desc") or r["group"])]
        entry[0] += 1
        entry[1] += r["end_ns"] - r["start_ns"]
        entry[2] += r["bytes"]
        entry[3] = r["rank_size"]
        entry[4] += r.get("state") == "failed"
        iterations.add(r["_iteration"])
    if not totals:
        return None
    return {"ops": [[op, group, *values] for (op, group), values in totals.items()],
            "iterations": len(iterations)}


def communication_sections(profile: Profile) -> list[Section]:
    rows = []
    for device in profile.devices:
        facts = profile.facts("hccl", device, rank_facts)
        if not facts:
            continue
        # stable: ties keep the order the collectives were first seen in
        ranked = sorted(facts["ops"], key=lambda entry: -entry[3])
        for op, group, count, ns, size, ranks, failed in ranked[:TOP]:
            algbw, busbw = bandwidths(op, size, ranks, ns)
            rows.append([device, op, group, ranks, count, f"{ns / 1e6:.3f}", f"{ns / count / 1e6:.3f}",
                         f"{size / count / 1e6:.3f}", _gbs(algbw), _gbs(busbw), failed or ""])
    if not rows:
        return []
    notes = ["bandwidths over the summed time and bytes, nccl-tests conventions (docs/plugins/hccl.md "
             "has the formulas); the time includes waiting for the slowest rank"]
    return [Section("Communication (hccl): top collectives by total time",
                    ["device", "op", "group", "ranks", "count", "total ms", "mean ms", "mean MB",
                     "algbw GB/s", "busbw GB/s", "failed"], rows, notes, key="communication")]


def communication_spans(streams: Mapping[str, list[Any]]) -> dict[str, list] | None:
    """Every collective's span, and those the loop is known to have waited for: synchronous
    calls in full, and for DDP's buckets the stretch from the last bucket's launch (the backward
    pass has no compute left then) to the last bucket's end."""
    if STREAM not in streams:
        return None
    records = [r for r in streams[STREAM] if isinstance(r, dict) and not r.get("duration_unknown")
               and r.get("start_ns") is not None and r.get("end_ns") is not None]
    blocking = [(r["start_ns"], r["end_ns"]) for r in records
                if not r.get("async") and not r.get("in_backward")]
    buckets = [r for r in records if r.get("in_backward")]
    if buckets:
        blocking.append((max(r["start_ns"] for r in buckets), max(r["end_ns"] for r in buckets)))
    return {COMMUNICATION: [(r["start_ns"], r["end_ns"]) for r in records],
            COMMUNICATION_BLOCKING: blocking}
