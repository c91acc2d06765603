"""The answers ``jobprof summary`` and ``jobprof report`` give: one JSON-ready model of a profile.

:func:`summarize` reads each selected rank's raw data once (streaming), paints every iteration
into the six parts of :mod:`jobprof.analysis.breakdown`, compares the ranks iteration by iteration, asks
every plugin for its report sections (``jobprof_report_sections``) and turns all of it into
numbered findings.  The model's keys are stable (``SCHEMA`` names the version); docs/cli.md
("jobprof summary", ``--json``) documents them.  Times are milliseconds, shares fractions 0..1, and a
value nobody could measure is ``null``.
"""

from __future__ import annotations

import re
import statistics
from typing import Any, TypedDict

import attrs

from jobprof.analysis import captures, facts, findings
from jobprof.analysis.facts import Progress, quiet
from jobprof.analysis.profile import Profile
from jobprof.analysis.stats import describe
from jobprof.engine.manager import PluginManager
from jobprof.plugin.results import Section
from jobprof.plugin.values import NA

SCHEMA = "jobprof.summary/1"
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")

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
            "findings": [attrs.asdict(f) for f in section.findings], "chart": list(section.chart)}


def summarize(profile: Profile, manager: PluginManager, progress: Progress = quiet, engine: str = "local",
              jobs: int | None = 1, scheduler: str | None = None) -> dict[str, Any]:
    """The whole model; plugins' sections included.

    Each selected rank is reduced to its facts (:mod:`jobprof.analysis.facts`: its facts file,
    or computed on ``engine`` with ``jobs`` workers, None: every core), then combined here:
    memory is one small row per iteration and rank plus the plugins' aggregates.  The model does
    not depend on the engine.
    """
    gathered = facts.gather(profile, manager, engine, jobs, scheduler,
                            progress if progress is not quiet else None)
    rows_by_rank: dict[int, list[dict[str, Any]]] = {}
    ranks = []
    for device in profile.devices:
        kept = gathered[device]
        ranks.append(kept["entry"])
        rows_by_rank[kept["rank"]] = kept["rows"]
    sections: list[Section] = captures.sections(profile) + [
        s for _, found in manager.report_sections(profile) for s in found or ()]
    model: dict[str, Any] = {
        "schema": SCHEMA, "prof_dir": str(profile.path), "selection": profile.selection.describe(),
        "ranks": ranks,
        "iterations": [r for rows in rows_by_rank.values() for r in rows],
        "cross_rank": cross_rank({r: rows for r, rows in rows_by_rank.items() if rows}),
        "sections": {s.key: section_json(s) for s in sections},
    }
    model["missing"] = findings.missing(profile, model, findings.part_sources(manager))
    model["findings"] = [attrs.asdict(f) for f in findings.rank(findings.core(model), sections)]
    return model


#: what ranks[].startup measures, as the summary and the report say it
BEFORE_FIRST = ("before iteration 1, in no iteration (from profiling start as the process starts: imports, "
                "setup, the first batch, up to the first forward)")

#: the footnote of a rank that is a process, not a rank of a distributed job
NOT_A_RANK = ("* not a rank of a distributed job (no RANK / WORLD_SIZE, no process group): a process "
              "that ran with PROFILING_MODE set (a helper or child inherits it from the job's "
              "environment); its device id stands in for the rank")


def process_marks(ranks: list[dict[str, Any]]) -> tuple[set[int], list[str]]:
    """Which rank entries are processes that are not ranks (their devices), and the notes that
    say so: shown only when the profile holds more than one process, one of them such."""
    marked = {r["device"] for r in ranks if r.get("distributed") is False} if len(ranks) > 1 else set()
    notes = [NOT_A_RANK] if marked else []
    by_pid: dict[Any, list[int]] = {}
    for r in ranks:
        if r.get("pid") is not None:
            by_pid.setdefault(r["pid"], []).append(r["device"])
    for pid, devices in by_pid.items():
        if len(devices) > 1:
            notes.append(f"devices {', '.join(map(str, devices))} have one process id (pid {pid}): "
                         "a program that exec'd itself, each image profiled (or a pid reused)")
    return marked, notes
