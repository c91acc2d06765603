"""The answers ``jobprof summary`` and ``jobprof report`` give: one JSON-ready model of a profile.

:func:`summarize` reads each selected rank's raw data once (streaming), paints every iteration
into the six parts of :mod:`jobprof.analysis.breakdown`, compares the ranks iteration by iteration, asks
every plugin for its report sections (``jobprof_report_sections``) and turns all of it into
numbered findings.  The model's keys are stable (``SCHEMA`` names the version); README's
"summary --json" section documents them.  Times are milliseconds, shares fractions 0..1, and a
value nobody could measure is ``null``.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict

import attrs

from jobprof.analysis import breakdown, findings
from jobprof.analysis.profile import Profile
from jobprof.analysis.stats import describe
from jobprof.files import rawstore
from jobprof.plugin.manager import PluginManager
from jobprof.plugin.types import NA, Iteration, Section

SCHEMA = "jobprof.summary/1"
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")

Progress = Callable[[Iterable[Any], int | None, str], Iterable[Any]]


def quiet(items: Iterable[Any], total: int | None, desc: str) -> Iterable[Any]:
    """The :data:`Progress` that shows nothing."""
    return items


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def iteration_rows(profile: Profile, manager: PluginManager, device: int,
                   progress: Progress = quiet) -> Iterator[dict[str, Any]]:
    """One row per selected iteration of ``device``: its time and parts in ms, and their basis."""
    rank = profile.rank(device)
    for index, streams in progress(profile.streams(device), None, f"rank {rank}"):
        records = streams.get(rawstore.ITERATION_STREAM) or []
        if not records:
            continue
        it = Iteration.from_record(records[0])
        answers = manager.iteration_spans(it, streams)
        spans = breakdown.collect(a for _, a in answers)
        if rawstore.PROFILER_STREAM in streams:  # the core's own, no plugin's
            spans[breakdown.PROFILER] = [tuple(s) for s in streams[rawstore.PROFILER_STREAM]]
        parts, basis = breakdown.paint(it, spans)
        yield {"rank": rank, "device": device, "iteration": index, "start_ns": it.start_ns,
               "skipped": it.skipped, "iteration_ms": _ms(it.end_ns - it.start_ns),
               **{f"{p}_ms": _ms(v) for p, v in parts.items()}, "_basis": basis}


def _gaps(indices: list[int]) -> list[str]:
    """Gaps in a rank's iteration numbers, as ``"5-9"`` ranges (computed from the ends, never
    expanded: a raw line's index of 2**62 must not cost memory)."""
    return [f"{a + 1}-{b - 1}" if b > a + 2 else str(a + 1)
            for a, b in itertools.pairwise(sorted(set(indices))) if b > a + 1]


def _rank_entry(profile: Profile, device: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    info = profile.info(device)
    job = info.get("jobprof", {}) if isinstance(info.get("jobprof"), dict) else {}
    index = [r["iteration"] for r in rows]
    series = {"iteration": [r["iteration_ms"] for r in rows],
              **{p: [r[f"{p}_ms"] for r in rows] for p in breakdown.PARTS}}
    total = sum(series["iteration"])
    share = {p: (sum(v for v in series[p] if v is not None) / total
                 if total and any(v is not None for v in series[p]) else None) for p in breakdown.PARTS}
    basis: dict[str, str] = {}
    for r in rows:
        basis.update(r["_basis"])
    return {
        "rank": profile.rank(device), "device": device, "hostname": info.get("hostname"),
        "pid": info.get("pid"), "finished": profile.finished(device),
        "iteration_method": job.get("iteration_method"), "world_size": job.get("world_size"),
        "iterations": {"count": len(rows), "first": index[0] if index else None,
                       "last": index[-1] if index else None, "gaps": _gaps(index)},
        "breakdown_ms": {k: describe(v, index) for k, v in series.items()},
        "share": share, "basis": basis,
    }


class _RankTimes(TypedDict):
    """One iteration present on two or more ranks: each rank's busy and iteration time (ms)."""
    iteration: int
    busy_ms: dict[int, float]
    iteration_ms: dict[int, float]


def cross_rank(rows_by_rank: dict[int, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Per iteration present on two or more ranks: the slowest rank and the spread.

    A rank's "busy" time is its iteration time less the communication not overlapped: in a
    synchronous job every rank's iteration lasts about as long as the slowest one's, the others
    waiting for it in collectives; what differs is the time spent outside that wait.
    """
    if len(rows_by_rank) < 2:
        return None
    by_iteration: dict[int, dict[int, dict[str, Any]]] = {}
    for rank, rows in rows_by_rank.items():
        for r in rows:
            by_iteration.setdefault(r["iteration"], {})[rank] = r
    per_iteration: list[_RankTimes] = []
    measure = "busy"
    for index in sorted(by_iteration):
        here = by_iteration[index]
        if len(here) < 2:
            continue
        busy: dict[int, float] = {}
        for rank, r in here.items():
            comm = r["communication_not_overlapped_ms"]
            if comm is None:
                measure = "iteration"
            busy[rank] = r["iteration_ms"] - (comm or 0.0)
        times = {rank: r["iteration_ms"] for rank, r in here.items()}
        per_iteration.append({"iteration": index, "busy_ms": busy, "iteration_ms": times})
    if not per_iteration:
        return None
    out: list[dict[str, Any]] = []
    slowest: dict[int, int] = dict.fromkeys(sorted(rows_by_rank), 0)
    excess: dict[int, list[float]] = {rank: [] for rank in rows_by_rank}
    for entry in per_iteration:
        values = entry["busy_ms"] if measure == "busy" else entry["iteration_ms"]
        median = statistics.median(values.values())
        worst = max(values, key=lambda rank: (values[rank], -rank))
        slowest[worst] += 1
        for rank, v in values.items():
            excess[rank].append(v / median - 1 if median > 0 else 0.0)
        iteration_time = max(entry["iteration_ms"].values())
        spread = max(values.values()) - min(values.values())
        out.append({"iteration": entry["iteration"], "slowest_rank": worst,
                    "max_ms": max(values.values()), "min_ms": min(values.values()), "median_ms": median,
                    "spread_ms": spread, "spread_share": spread / iteration_time if iteration_time else None,
                    "per_rank_ms": {str(r): v for r, v in sorted(values.items())}})
    compared = [e["iteration"] for e in out]
    return {
        "measure": measure, "iterations_compared": len(out),
        "slowest_count": {str(rank): n for rank, n in slowest.items()},
        "median_excess": {str(rank): statistics.median(v) if v else None for rank, v in excess.items()},
        "spread_share": describe([e["spread_share"] for e in out], compared),
        "spread_ms": describe([e["spread_ms"] for e in out], compared),
        "per_iteration": out,
    }


def _cell(value: Any) -> Any:
    """A table cell as JSON: numbers as numbers, N/A as null, the rest as text."""
    if isinstance(value, str):
        text = value.strip()
        if text == NA:
            return None
        if _NUMBER.match(text):
            return float(text) if "." in text else int(text)
        return value
    return value


def section_json(section: Section) -> dict[str, Any]:
    return {"title": section.title, "columns": list(section.columns), "headers": list(section.headers),
            "rows": [[_cell(c) for c in row] for row in section.rows], "notes": list(section.notes),
            "findings": [attrs.asdict(f) for f in section.findings]}


def summarize(profile: Profile, manager: PluginManager, progress: Progress = quiet) -> dict[str, Any]:
    """The whole model; plugins' sections included.  Memory: one small row per iteration and rank."""
    rows_by_rank: dict[int, list[dict[str, Any]]] = {}
    ranks = []
    for device in profile.devices:
        rows = list(iteration_rows(profile, manager, device, progress))
        ranks.append(_rank_entry(profile, device, rows))
        rows_by_rank[profile.rank(device)] = rows
    sections: list[Section] = [s for _, found in manager.report_sections(profile)
                               for s in found or ()]
    model: dict[str, Any] = {
        "schema": SCHEMA, "prof_dir": str(profile.path), "selection": profile.selection.describe(),
        "ranks": ranks,
        "iterations": [{k: v for k, v in r.items() if not k.startswith("_")}
                       for rows in rows_by_rank.values() for r in rows],
        "cross_rank": cross_rank({r: rows for r, rows in rows_by_rank.items() if rows}),
        "sections": {s.key: section_json(s) for s in sections},
    }
    model["missing"] = findings.missing(profile, model, findings.part_sources(manager))
    model["findings"] = [attrs.asdict(f) for f in findings.rank(findings.core(model), sections)]
    return model
