"""The "Top operators" section of ``jobprof summary``: where each device's task time went.

Read from the op_statistic files (one per iteration, already grouped), so the summary costs a
few small CSV reads however many operators ran.  Iterations whose files were not rendered
(a killed job before ``jobprof export``) are not counted; the note says how many were.

Map/reduce: :func:`rank_facts` reduces one device to its groups (``jobprof_rank_facts``);
:func:`top_sections` reads them back with ``profile.facts`` and reads no file itself.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    COMPUTE,
    DEVICE_KINDS,
    OPS_STREAM,
    Finding,
    Section,
    opview,
)

if TYPE_CHECKING:
    from jobprof.plugin import Profile

TOP = 15
#: a finding names the operator types holding this share of compute time ...
CONCENTRATION = 0.8
#: ... when there are at most this many of them
CONCENTRATION_TYPES = 5


def _groups(profile: Profile, paths: list[Path]) -> tuple[dict[tuple[str, str], list[float]], int]:
    """{(OP Type, Core Type): [count, total µs]} over the op_statistic files, and the file count."""
    groups: dict[tuple[str, str], list[float]] = {}
    files = 0
    for path in paths:
        try:
            with profile.open_text(path) as handle:
                rows = list(csv.DictReader(handle))
        except (OSError, ValueError, csv.Error) as exc:  # unreadable, not UTF-8: the others count
            profile.problem(f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}: left out")
            continue
        files += 1
        for row in rows:
            try:
                count, total = int(row["Count"]), float(row["Total Time(us)"])
            except (KeyError, TypeError, ValueError):
                continue
            g = groups.setdefault((row["OP Type"], row["Core Type"]), [0, 0.0])
            g[0] += count
            g[1] += total
    return groups, files


def _concentration(profile: Profile, device: int, ranked: list, grand: float) -> Finding | None:
    """"80% of task time in 3 operator types": where optimisation effort pays, if few types."""
    compute = [(op, total) for (op, core), (_, total) in ranked if core != "COMMUNICATION"]
    busy = sum(total for _, total in compute)
    if not busy:
        return None
    running, names = 0.0, []
    for op, total in compute:
        running += total
        names.append(op)
        if running >= CONCENTRATION * busy:
            break
    if len(names) > CONCENTRATION_TYPES:
        return None
    who = f"rank {profile.rank(device)}: " if len(profile.devices) > 1 else ""
    return Finding("operator_concentration",
                   f"{who}{100 * running / busy:.0f}% of compute task time is in {len(names)} operator "
                   f"type(s) ({', '.join(names)}) of {len(compute)}: speeding those up is what moves "
                   "the iteration time",
                   {"rank": profile.rank(device), "share": running / busy, "types": names,
                    "type_count": len(compute), "total_ms": busy / 1000}, weight=1)


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's op_statistic totals: ``groups``, one ``[OP Type, Core Type, count, total µs]``
    per group in the order first seen (the order the totals were summed in), the number of
    op_statistic files read and of iterations; None without a group."""
    groups, files = _groups(profile, profile.summary_files(device, "op_statistic"))
    if not groups:
        return None
    # JSON has no NaN or infinity (a damaged CSV's "nan"): those travel as their str()
    every = _every(profile, device)
    iterations = profile.iterations(device)
    return {"groups": [[op, core, count, total if math.isfinite(total) else str(total)]
                       for (op, core), (count, total) in groups.items()],
            "files": files, "iterations": len(iterations), "every": every,
            "sampled": sum(1 for it in iterations if (it.index - 1) % every == 0)}


def _every(profile: Profile, device: int) -> int:
    """The job's ``task_trace_every`` (1: every iteration's operators were captured)."""
    options = (profile.info(device).get("jobprof") or {}).get("options") or {}
    every = options.get("task_trace_every", 1)
    return every if isinstance(every, int) and not isinstance(every, bool) and every >= 1 else 1


def top_sections(profile: Profile) -> list[Section]:
    rows, notes, findings = [], [], []
    for device in profile.devices:
        facts = profile.facts("task_trace", device, rank_facts)
        if not facts:
            continue
        # keys back to tuples, in the order first seen: sums and tie-breaks as when read directly
        groups: dict[tuple[str, str], list[float]] = {
            (op, core): [count, float(total)] for op, core, count, total in facts["groups"]}
        files = facts["files"]
        grand = sum(g[1] for g in groups.values())
        ranked = sorted(groups.items(), key=lambda item: (-item[1][1], item[0]))
        for (op, core), (count, total) in ranked[:TOP]:
            share = f"{100 * total / grand:.1f}" if grand else "N/A"
            rows.append([device, op, core, int(count), f"{total / 1000:.3f}", f"{total / count:.3f}", share])
        iterations, every = facts["iterations"], facts.get("every", 1)
        sampled = facts.get("sampled", iterations)
        if every > 1:
            notes.append(f"device {device}: operators captured on 1 iteration in {every} "
                         f"(task_trace_every): {sampled} of {iterations} iterations")
        if files < sampled:
            notes.append(f"device {device}: {sampled - files} of {sampled} iterations "
                         f"{'sampled for operators ' if every > 1 else ''}have no op_statistic file yet "
                         "(run `jobprof export`)")
        finding = _concentration(profile, device, ranked, grand)
        if finding is not None:
            findings.append(finding)
        if len(ranked) > TOP and grand:
            notes.append(f"device {device}: {len(ranked) - TOP} more operator types, "
                         f"{100 * sum(g[1] for _, g in ranked[TOP:]) / grand:.1f}% of task time")
    if not rows:
        return []
    return [Section(f"Top operators (top {TOP} per device)",
                    ["device", "OP Type", "Core Type", "count", "total ms", "mean µs", "% of task time"],
                    rows, notes, key="top_operators", findings=findings)]


def compute_spans(streams: Mapping[str, list[Any]]) -> dict[str, list] | None:
    """The spans of every task that is not communication: Overlap Analysis's ``Computing``.

    The same tasks as :class:`~jobprof.ops.opview.OpView` (device work on a GPU, else the top-level
    dispatcher operators) without building the operator tree: the summary asks this of every
    iteration of every rank.
    """
    records = streams.get(OPS_STREAM)
    if not records:
        return None
    comm = opview.COMM_PREFIXES
    device = [r for r in records if r.kind in DEVICE_KINDS]
    if device:
        return {COMPUTE: [(r.start, r.start + r.dur) for r in device if not r.name.startswith(comm)]}
    # dispatcher operators (opview.is_dispatch_op, inlined: this runs over every record)
    ops = sorted((r.start, r.dur, r.tid, r.name) for r in records if r.kind == "cpu_op"
                 and "::" in r.name and not r.name.startswith(("autograd::", "torch::autograd::")))
    spans = []
    top_end: dict[int, int] = {}  # thread -> end of its current top-level operator
    for start, dur, tid, name in ops:
        if start < top_end.get(tid, -1):
            continue  # nested in a top-level operator (a collective's inner work is not compute)
        top_end[tid] = start + dur
        if not name.startswith(comm):
            spans.append((start, start + dur))
    return {COMPUTE: spans}
