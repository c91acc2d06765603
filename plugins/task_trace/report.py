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
    STEP_MODE_MODEL_ID,
    Finding,
    Section,
    opview,
)
from jobprof.plugin import histogram as hist

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
    op_statistic files read and of iterations; ``calls``, the drill-down of the top types
    (:func:`_calls`); None without a group."""
    groups, files = _groups(profile, profile.summary_files(device, "op_statistic"))
    if not groups:
        return None
    # JSON has no NaN or infinity (a damaged CSV's "nan"): those travel as their str()
    every = profile.task_trace_every(device)
    iterations = profile.iterations(device)
    top = [key for key, _ in sorted(groups.items(), key=lambda item: (-item[1][1], item[0]))[:TOP]]
    return {"groups": [[op, core, count, total if math.isfinite(total) else str(total)]
                       for (op, core), (count, total) in groups.items()],
            "files": files, "iterations": len(iterations), "every": every,
            "sampled": sum(1 for it in iterations if (it.index - 1) % every == 0),
            "calls": _calls(profile, device, top)}


#: op_summary files read for the drill-down (evenly spread over the selected ones): its cost stays
#: that of a few dozen CSVs however long the run
DRILL_FILES = 100
#: operator types the drill-down lists per device (by input shapes)
DRILL_TYPES = 5
#: input-shape variants kept per operator type (most time first; the rest pooled as "other")
DRILL_SHAPES = 4


def _calls(profile: Profile, device: int, top: list[tuple[str, str]]) -> dict[str, Any]:
    """The top operator types' calls, from up to :data:`DRILL_FILES` op_summary files: per
    ``"OP Type|Core Type"``, ``{"median_us", "p95_us", "shapes": [[Input Shapes, count, total µs,
    median µs, p95 µs, slowest µs, its iteration], ...]}`` (at most :data:`DRILL_SHAPES`, then the
    others pooled), and ``files`` read of ``of``.  Quantiles within 1% (2% buckets while read)."""
    paths = profile.summary_files(device, "op_summary")
    n, k = len(paths), DRILL_FILES
    chosen = paths if n <= k else [paths[round(i * (n - 1) / (k - 1))] for i in range(k)]
    wanted = {f"{op}|{core}" for op, core in top}
    drilled = {f"{op}|{core}" for op, core in top[:DRILL_TYPES]}  # the rest: median and p95 only
    per_type: dict[str, dict[str, Any]] = {}
    read = 0
    #: a duration's text -> (µs, its ns bucket), or None when it is no finite number: durations
    #: repeat, and one op_summary can hold 200,000 rows (rows as lists, not dicts, for the same reason)
    parsed: dict[str, tuple[float, int] | None] = {}
    for path in chosen:
        try:
            with profile.open_text(path) as handle:
                header, *rows = list(csv.reader(handle)) or [[]]
        except (OSError, ValueError, csv.Error):  # _groups names unreadable files of the run
            continue
        read += 1
        columns = {name: i for i, name in enumerate(header)}
        # op_statistic's Core Type is op_summary's Task Type
        op_at, core_at, dur_at = (columns.get(name) for name in ("OP Type", "Task Type", "Task Duration(us)"))
        if op_at is None or core_at is None or dur_at is None:
            continue
        shapes_at = columns.get("Input Shapes", len(header))
        least = max(op_at, core_at, dur_at) + 1
        iteration = _iteration_of(path)
        for row in rows:
            if len(row) < least:
                continue
            key = f"{row[op_at]}|{row[core_at]}"
            if key not in wanted:
                continue
            text = row[dur_at]
            value = parsed.get(text)
            if value is None and text not in parsed:
                try:
                    us = float(text)
                except ValueError:
                    us = math.nan
                value = parsed[text] = (us, hist.bucket(us * 1000)) if math.isfinite(us) else None
            if value is None:
                continue
            us, bucket = value  # ns buckets: sub-µs calls keep their own
            entry = per_type.setdefault(key, {"hist": {}, "shapes": {}})
            counts = entry["hist"]
            counts[bucket] = counts.get(bucket, 0) + 1
            shape = entry["shapes"].setdefault((row[shapes_at] if shapes_at < len(row) else "") or "N/A",
                                               [0, 0.0, {}, -1.0, None])
            shape[0] += 1
            shape[1] += us
            counts = shape[2]
            counts[bucket] = counts.get(bucket, 0) + 1
            if us > shape[3]:
                shape[3], shape[4] = us, iteration
    out: dict[str, Any] = {}
    for key, entry in per_type.items():
        ranked = sorted(entry["shapes"].items(), key=lambda item: (-item[1][1], item[0]))
        if len(ranked) > DRILL_SHAPES:
            rest = [v for _, v in ranked[DRILL_SHAPES:]]
            other: dict[int, int] = {}
            for v in rest:
                hist.merge(other, v[2])
            slowest = max(rest, key=lambda v: v[3])
            ranked = [*ranked[:DRILL_SHAPES], (f"(other shapes: {len(rest)})", [
                sum(v[0] for v in rest), sum(v[1] for v in rest), other, slowest[3], slowest[4]])]
        # quantiles, not histograms: the rows are per device, and the facts stay small
        out[key] = {**_spread(entry["hist"]),
                    "shapes": [[name, n, total, *_spread(h).values(), slow, at]
                               for name, (n, total, h, slow, at) in ranked] if key in drilled else []}
    return {"types": out, "files": read, "of": len(paths)}


def _iteration_of(path: Path) -> int | None:
    """The iteration of ``<name>_<dev>_<model>_<iter>.csv``."""
    tail = path.stem.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def top_sections(profile: Profile) -> list[Section]:
    rows, notes, findings = [], [], []
    drill: list[list[Any]] = []
    sources: list[tuple[int, int, int]] = []
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
        calls = facts.get("calls") or {"types": {}, "files": 0, "of": 0}
        for (op, core), (count, total) in ranked[:TOP]:
            share = f"{100 * total / grand:.1f}" if grand else "N/A"
            spread = calls["types"].get(f"{op}|{core}")
            rows.append([device, op, core, int(count), f"{total / 1000:.3f}", f"{total / count:.3f}",
                         *_median_p95(spread), share])
        drill += _drill_rows(device, ranked[:DRILL_TYPES], calls)
        if calls["of"]:
            sources.append((device, calls["files"], calls["of"]))
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
    notes.append("OP Type: the operator without its namespace (aten::mm is mm); Core Type: the engine that "
                 "ran its tasks (CUDA kernels, MEMCPY, MEMSET, COMMUNICATION; on a CPU-only job CPU, the "
                 "top-level operator is the task); msprof's names, docs/msprof.md")
    notes.append("median and p95 per call from the drill-down's op_summary files (2% buckets); N/A "
                 "where none was read")
    out = [Section(f"Top operators (top {TOP} per device)",
                   ["device", "OP Type", "Core Type", "count", "total ms", "mean µs", "median µs", "p95 µs",
                    "% of task time"], rows, notes, key="top_operators", findings=findings)]
    if drill:
        kineto = any(profile.is_on(d, "kineto_trace") for d in profile.devices)
        read = "; ".join(f"device {d}: {n} of {m}" for d, n, m in sources)
        out.append(Section(f"Top operators by input shapes (top {DRILL_TYPES} types per device)",
                           ["device", "OP Type", "Core Type", "Input Shapes", "calls", "total ms", "mean µs",
                            "median µs", "p95 µs", "slowest µs", "slowest in iteration", "timeline"],
                           drill,
                           [f"calls of the op_summary files read ({read}; spread evenly over the selected "
                            "iterations), most time first per type; each shape's slowest call names its "
                            "iteration and that iteration's timeline (open it in Perfetto"
                            + (", or `jobprof kineto --iterations N` for TensorBoard / HTA)" if kineto else
                               "; for TensorBoard / HTA profile with kineto_trace on)")],
                           key="operator_shapes"))
    return out


def _spread(histogram: dict[int, int]) -> dict[str, float]:
    """Median and p95 in µs of durations counted in ns."""
    median, p95 = hist.median_p95(histogram)
    return {"median_us": round(median / 1000, 3), "p95_us": round(p95 / 1000, 3)}


def _median_p95(entry: Mapping[str, Any] | None) -> list[str]:
    if not entry:
        return ["N/A", "N/A"]
    return [f"{entry['median_us']:.3f}", f"{entry['p95_us']:.3f}"]


def _drill_rows(device: int, ranked: list, calls: Mapping[str, Any]) -> list[list[Any]]:
    rows = []
    for (op, core), _ in ranked:
        entry = calls["types"].get(f"{op}|{core}")
        for shape, n, total, median, p95, slowest, iteration in (entry or {}).get("shapes", ()):
            timeline = f"device_{device}/timeline/msprof_{device}_{STEP_MODE_MODEL_ID}_{iteration}.json" \
                if iteration is not None else "N/A"
            rows.append([device, op, core, shape, n, f"{total / 1000:.3f}", f"{total / n:.3f}",
                         f"{median:.3f}", f"{p95:.3f}", f"{slowest:.3f}",
                         iteration if iteration is not None else "N/A", timeline])
    return rows


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
