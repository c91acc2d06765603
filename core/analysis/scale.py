"""Views of a summary model that stay readable at cluster scale (32, 256, 1024 ranks).

Above :data:`RANK_TABLE_LIMIT` ranks, ``jobprof summary`` and ``jobprof report`` show
distributions across ranks instead of one table row per rank, name the outlier ranks, list
the top stragglers, and keep only a slowest and a median rank's rows of per-device sections.
Everything here is a pure function of the model (``summary --json``), shared by the terminal
and the HTML page; the model itself is never changed.

Percentiles are nearest-rank (``p50`` of 4 values is the 2nd smallest): every number shown is
one rank's own value, so a reader can find that rank (:func:`picks` says which).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypedDict

from jobprof.analysis.breakdown import PARTS
from jobprof.analysis.selection import ranges

#: above this many ranks, per-rank tables become distributions across ranks
RANK_TABLE_LIMIT = 16
#: a rank whose mean iteration time exceeds the ranks' p50 by this factor is named as an outlier ...
OUTLIER_FACTOR = 1.1
#: ... and so are this many slowest ranks, whatever their time
SLOWEST_SHOWN = 3
#: the stragglers listed (which rank was the slowest how often) above the limit
TOP_STRAGGLERS = 20
#: a rank list in text shows at most this many runs ("0-3, 5, 7-9, ...")
MAX_RUNS = 8
#: the rank x iteration heatmap: at most this many columns (iterations) and rows (ranks)
HEAT_COLUMNS, HEAT_ROWS = 200, 256
#: the heatmap and the straggler chart appear from this many ranks on (1 and 2 rank pages are
#: as before: their per-rank charts already show every rank)
HEATMAP_MIN_RANKS = 3

STATS = ("min", "p50", "p95", "max")
#: the quantile of each statistic (nearest-rank)
QUANTILE = {"min": 0.0, "p50": 0.5, "p95": 0.95, "max": 1.0}


def many(model: Mapping[str, Any]) -> bool:
    """Whether the model has too many ranks for per-rank tables."""
    return len(model["ranks"]) > RANK_TABLE_LIMIT


def rank_list(ranks: Iterable[int], max_runs: int = MAX_RUNS) -> str:
    """Ranks as compact text: ``[0, 1]`` -> ``"0, 1"``, ``[0, 1, 2, 3, 5]`` -> ``"0-3, 5"``; past
    ``max_runs`` runs, the first ones, an ellipsis and the last (``"1, 3, 5, … 31"``)."""
    runs: list[str] = []
    for run in ranges(ranks):
        first, _, last = run.partition("-")
        # a run of two reads better as "0, 1" (and 1- and 2-rank texts stay as they were)
        runs += [first, last] if last and int(last) == int(first) + 1 else [run]
    if len(runs) > max_runs:
        return ", ".join(runs[:max_runs - 2]) + ", … " + runs[-1]
    return ", ".join(runs)


def nearest(n: int, quantile: float) -> int:
    """The index, in ``n`` sorted values, of the nearest-rank ``quantile`` (0 = min, 1 = max)."""
    if n <= 0:
        raise ValueError("no values")
    return min(n - 1, max(0, math.ceil(quantile * n) - 1))


def picks(values: Mapping[int, float | None]) -> dict[str, tuple[float, int]] | None:
    """``{stat: (value, key)}`` over the known values of ``{key: value}`` (ties: the lower key);
    None when no value is known."""
    known = sorted((v, k) for k, v in values.items() if v is not None)
    if not known:
        return None
    return {s: known[nearest(len(known), QUANTILE[s])] for s in STATS}


def distribution(values: Iterable[float | None]) -> dict[str, float] | None:
    """min / p50 / p95 / max (nearest-rank) of the known values; None when there is none."""
    chosen = picks(dict(enumerate(values)))
    return None if chosen is None else {s: v for s, (v, _) in chosen.items()}


def outliers(values: Mapping[int, float | None], factor: float = OUTLIER_FACTOR,
             slowest: int = SLOWEST_SHOWN) -> list[int]:
    """The keys worth naming, slowest first: the ``slowest`` highest values and every value
    beyond p50 x ``factor``."""
    known = sorted(((v, k) for k, v in values.items() if v is not None), key=lambda vk: (-vk[0], vk[1]))
    if not known:
        return []
    p50 = sorted(v for v, _ in known)[nearest(len(known), 0.5)]
    return [k for i, (v, k) in enumerate(known) if i < slowest or v > p50 * factor]


class Stat(TypedDict):
    """One statistic across ranks: the value and the index (in ``model["ranks"]``) of the rank
    that has it."""
    value: float
    index: int


class Outlier(TypedDict):
    index: int
    rank: int
    mean_ms: float
    vs_p50: float | None


class RankDistribution(TypedDict):
    """:func:`rank_distribution`: what replaces the per-rank tables."""
    ranks: int
    measured: int
    #: ``{"iteration" or part: {stat: Stat}}``; None for a part no rank measured
    stats: dict[str, dict[str, Stat] | None]
    outliers: list[Outlier]
    unfinished: list[int]
    no_iterations: list[int]
    #: indices in ``model["ranks"]``: the rank at p50 of the mean iteration time, and the slowest
    median_index: int | None
    slowest_index: int | None


def rank_distribution(model: Mapping[str, Any]) -> RankDistribution:
    """Each rank's mean iteration time and mean of each part, distributed across the ranks that
    have iterations; the outlier ranks; the unfinished ranks and those with no iteration."""
    ranks = model["ranks"]
    measured = {i: r for i, r in enumerate(ranks) if r["iterations"]["count"]}
    stats: dict[str, dict[str, Stat] | None] = {}
    for part in ("iteration", *PARTS):
        chosen = picks({i: r["breakdown_ms"][part]["mean"] for i, r in measured.items()})
        stats[part] = None if chosen is None else {
            stat: {"value": v, "index": i} for stat, (v, i) in chosen.items()}
    means = {i: r["breakdown_ms"]["iteration"]["mean"] for i, r in measured.items()}
    it = stats["iteration"]
    p50 = it["p50"]["value"] if it else None
    found: list[Outlier] = [{"index": i, "rank": ranks[i]["rank"], "mean_ms": means[i],
                             "vs_p50": means[i] / p50 - 1 if p50 else None} for i in outliers(means)]
    return {"ranks": len(ranks), "measured": len(measured), "stats": stats, "outliers": found,
            "unfinished": [r["rank"] for r in ranks if not r["finished"]],
            "no_iterations": [r["rank"] for r in ranks if not r["iterations"]["count"]],
            "median_index": it["p50"]["index"] if it else None,
            "slowest_index": slowest_index(model)}


def slowest_index(model: Mapping[str, Any]) -> int | None:
    """The slowest rank's index in ``model["ranks"]``: the one slowest in the most compared
    iterations (the report's bold line), else the highest mean iteration time."""
    at = {r["rank"]: i for i, r in enumerate(model["ranks"])}
    cross = model.get("cross_rank")
    if cross and cross["slowest_count"]:
        counts = {int(r): n for r, n in cross["slowest_count"].items()}
        rank = max(counts, key=lambda r: (counts[r], -r))
        if rank in at:
            return at[rank]
    means = {i: r["breakdown_ms"]["iteration"]["mean"] for i, r in enumerate(model["ranks"])
             if r["iterations"]["count"]}
    return max(means, key=lambda i: (means[i], -i)) if means else None


def stragglers(cross: Mapping[str, Any], top: int = TOP_STRAGGLERS) -> list[str]:
    """The ranks (as the model's string keys) slowest most often, at most ``top``, slowest first;
    ranks never the slowest are left out."""
    counts = cross["slowest_count"]
    ordered = sorted((k for k, n in counts.items() if n), key=lambda k: (-counts[k], int(k)))
    return ordered[:top]


class RankGroup(TypedDict):
    """Ranks that read the same in the "Ranks" table (iterations, range, method, finished)."""
    ranks: list[int]
    hosts: int
    count: int
    range: str
    method: str
    finished: bool


def rank_groups(model: Mapping[str, Any]) -> list[RankGroup]:
    """The "Ranks" table folded: one row per distinct (iteration count, range, found by,
    finished), in the order of its first rank."""
    groups: dict[tuple[int, str, str, bool], list[dict[str, Any]]] = {}
    for r in model["ranks"]:
        its = r["iterations"]
        span = f"{its['first']}-{its['last']}" if its["count"] else "-"
        groups.setdefault((its["count"], span, r["iteration_method"] or "N/A", bool(r["finished"])),
                          []).append(r)
    return [{"ranks": [r["rank"] for r in rs], "hosts": len({r["hostname"] for r in rs}), "count": count,
             "range": span, "method": method, "finished": finished}
            for (count, span, method, finished), rs in groups.items()]


def kept_devices(model: Mapping[str, Any]) -> dict[Any, str]:
    """Above the limit, the devices whose rows per-device sections keep: ``{device: why}`` for
    the slowest rank and the median one."""
    found = rank_distribution(model)
    out: dict[Any, str] = {}
    for index, why in ((found["slowest_index"], "slowest"), (found["median_index"], "median")):
        if index is not None:
            r = model["ranks"][index]
            out.setdefault(r["device"], f"rank {r['rank']} ({why})")
    return out


def per_device(section: Mapping[str, Any]) -> bool:
    """Whether a section is a table with one block of rows per device (a ``device`` first column)."""
    return bool(section["columns"]) and section["columns"][0] == "device"


def section_rows(model: Mapping[str, Any], section: Mapping[str, Any]) -> tuple[list[int], list[str]]:
    """The indices of a section's rows to show, and its notes to show: all of them, unless the
    model has too many ranks and the section is per device with more than the limit's devices;
    then the slowest and median ranks' rows, and a note on where the others are."""
    rows = section["rows"]
    devices = {row[0] for row in rows} if per_device(section) else set()
    if not many(model) or len(devices) <= RANK_TABLE_LIMIT:
        return list(range(len(rows))), list(section["notes"])
    kept = kept_devices(model)
    shown = [i for i, row in enumerate(rows) if row[0] in kept]
    notes = [n for n in section["notes"] if _about(n) is None or _about(n) in kept]
    who = " and ".join(f"device {d}, {why}" for d, why in kept.items())
    notes.append(f"{len(devices)} devices: only the rows of {who} are shown; every device's rows are in "
                 "`jobprof summary --json`, or narrow with `--rank R`")
    return shown, notes


def _about(note: str) -> Any:
    """The device a per-device note is about (``"device 3: ..."``), or None."""
    head, sep, _ = note.partition(":")
    words = head.split()
    if sep and len(words) == 2 and words[0] == "device" and words[1].isdigit():
        return int(words[1])
    return None


class HeatGrid(TypedDict):
    """The rank x iteration heatmap's cells: row ``i`` is ranks ``rows[i]`` (first, last), column
    ``j`` iterations ``columns[j]`` (first, last); a cell is the mean of the known values in it,
    None where none is known."""
    rows: list[tuple[int, int]]
    columns: list[tuple[int, int]]
    cells: list[list[float | None]]


def buckets(items: Sequence[int], limit: int) -> list[list[int]]:
    """``items`` cut into at most ``limit`` runs of consecutive items, of equal size but the last."""
    size = max(1, math.ceil(len(items) / limit))
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def heat_grid(model: Mapping[str, Any], value: Callable[[Mapping[str, Any]], float | None],
              columns: int = HEAT_COLUMNS, rows: int = HEAT_ROWS) -> HeatGrid:
    """``value`` of each ``model["iterations"]`` row, by rank and iteration, binned into at most
    ``rows`` x ``columns`` cells (consecutive ranks, consecutive iteration numbers)."""
    table: dict[int, dict[int, float | None]] = {}
    for row in model["iterations"]:
        table.setdefault(row["rank"], {})[row["iteration"]] = value(row)
    rank_bins = buckets(sorted(table), rows)
    iteration_bins = buckets(sorted({i for r in table.values() for i in r}), columns)
    cells: list[list[float | None]] = []
    for rank_bin in rank_bins:
        line: list[float | None] = []
        for it_bin in iteration_bins:
            known = [v for r in rank_bin for i in it_bin if (v := table[r].get(i)) is not None]
            line.append(statistics.fmean(known) if known else None)
        cells.append(line)
    return {"rows": [(b[0], b[-1]) for b in rank_bins], "columns": [(b[0], b[-1]) for b in iteration_bins],
            "cells": cells}


def iteration_time(row: Mapping[str, Any]) -> float | None:
    """An iteration row's time (ms)."""
    v = row.get("iteration_ms")
    return v if isinstance(v, int | float) else None


def outside_collectives(row: Mapping[str, Any]) -> float | None:
    """An iteration row's time outside collectives (ms): the iteration less the communication not
    overlapped; None where that part is not known."""
    it, comm = row.get("iteration_ms"), row.get("communication_not_overlapped_ms")
    if not isinstance(it, int | float) or not isinstance(comm, int | float):
        return None
    return it - comm
