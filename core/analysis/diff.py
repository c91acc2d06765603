"""``jobprof diff``: what got slower or faster between two profiles (before / after a change).

Each side is read from its ranks' facts (:mod:`jobprof.analysis.facts`, as ``jobprof summary``
reads them): every selected iteration's breakdown (the same parts ``jobprof summary`` shows) and,
per rank, the tables plugins contribute through ``jobprof_diff_tables``
(:class:`~jobprof.plugin.DiffTable`: task_trace's operator types, hccl's collectives, ...).
Counts and times are normalised per iteration of one rank, because the two runs may have run
different numbers of iterations or ranks; the raw numbers of iterations are part of the model.

A change is called ``slower`` / ``faster`` only when it passes both noise thresholds below (a
relative one and an absolute one); otherwise it is ``unchanged``.  Keys (operator types,
collectives) present on one side only are ``new`` / ``gone``.  The model's keys are stable
(``SCHEMA``); each table adds its own key.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from jobprof.analysis import breakdown, facts
from jobprof.analysis.facts import Progress
from jobprof.analysis.profile import Profile
from jobprof.analysis.selection import Selection, narrowed
from jobprof.analysis.stats import median_interval, p95
from jobprof.engine.manager import PluginManager
from jobprof.plugin.results import PROFILER, DiffCount, DiffTable

SCHEMA = "jobprof.diff/1"

# -- noise thresholds: a change must pass BOTH the relative and the absolute one -------------
#: relative change (of the median iteration time / part, or of a table row's time per
#: iteration) below which a difference is noise
RELATIVE = 0.05
#: iteration time and its parts: absolute change of the median, ms
ITERATION_MS = 0.1
#: a table row (an operator type, a collective): absolute change of its time per iteration, ms
OPERATOR_MS = 0.05

CHANGES = ("slower", "faster", "unchanged", "new", "gone")
#: a DiffTable's time unit, per ms
_PER_MS = {"ns": 1_000_000, "us": 1000}
#: ... per µs
_PER_US = {"ns": 1000, "us": 1}


class DiffError(ValueError):
    """A side cannot be compared (no data selected); the message names the profile."""


@attrs.frozen
class Side:
    """What one profile contributes: per rank its iteration rows and the plugins' tables."""

    prof_dir: Path
    selection: Selection
    #: rank -> one row per selected iteration (``iteration_ms`` and ``<part>_ms``)
    rows: dict[int, list[dict[str, Any]]]
    #: table key -> rank -> that rank's table
    tables: dict[str, dict[int, DiffTable]] = attrs.field(factory=dict)
    #: what job it is (:func:`job_of`): hardware, world size, backend, how iterations were cut
    job: dict[str, str] = attrs.field(factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rows)

    def iterations(self, ranks: Iterable[int] | None = None) -> int:
        return sum(len(self.rows.get(r, ())) for r in (self.ranks if ranks is None else ranks))

    def present(self, key: str) -> bool:
        """Whether some rank has the table's data."""
        return any(t.present for t in self.tables.get(key, {}).values())

    def covered(self, key: str, ranks: Iterable[int] | None = None) -> int:
        """The iterations the table's rows cover over ``ranks`` (every rank: None)."""
        per = self.tables.get(key, {})
        total = 0
        for rank in self.ranks if ranks is None else ranks:
            table = per.get(rank)
            if table is not None:
                total += len(self.rows.get(rank, ())) if table.covered is None else table.covered
        return total


def load(path: Path, selection: Selection, manager: PluginManager, progress: Progress | None = None,
         engine: str = "local", jobs: int | None = None, scheduler: str | None = None) -> Side:
    """Read one side from its ranks' facts (:func:`jobprof.analysis.facts.gather`: facts files
    where valid, else each rank reduced on ``engine``); raises FileNotFoundError when ``path``
    holds no PROF_ directory."""
    profile = Profile(path, selection)
    rows: dict[int, list[dict[str, Any]]] = {}
    tables: dict[str, dict[int, DiffTable]] = {}
    owners: dict[str, str] = {}
    gathered = facts.gather(profile, manager, engine, jobs, scheduler, progress, tables=True)
    for device, found in gathered.items():
        rank = profile.rank(device)
        rows[rank] = found["rows"]
        for plugin, plain in found["diff_tables"].items():
            for table in map(DiffTable.from_plain, plain):
                owner = owners.setdefault(table.key, plugin)
                if owner != plugin:
                    manager.fail(plugin, f"jobprof_diff_tables returned table '{table.key}', which "
                                         f"belongs to plugin '{owner}'")
                    break
                tables.setdefault(table.key, {})[rank] = table
    if not any(rows.values()):
        chosen = narrowed(selection.describe())
        present = sorted(profile.rank(d) for d in profile.all_devices) or "none"
        raise DiffError(f"{profile.path}: no iterations recorded"
                        f"{' for ' + chosen if chosen else ''} (ranks present: {present})")
    return Side(profile.path, selection, rows, tables, job_of(profile))


#: what :func:`job_of` describes, in the order shown
JOB_KEYS = ("device", "world size", "backend", "iterations cut by", "torch", "source")


def job_of(profile: Profile) -> dict[str, str]:
    """The job a profile is of, from its ranks' info.json: the devices (their names), world
    size, backend, how iterations were found, torch, and what it was imported from (if it was);
    several values of a key across ranks are joined."""
    found: dict[str, set[str]] = {key: set() for key in JOB_KEYS}
    for device in profile.devices:  # the ranks selected (--rank)
        info = profile.info(device)
        recorded = info.get("jobprof")
        own: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        for d in info.get("DeviceInfo") or ():
            if isinstance(d, dict):
                found["device"].add(f"{d.get('name', d.get('type', 'N/A'))}")
        found["world size"].add(str(own.get("world_size", "N/A")))
        found["backend"].add(str(own.get("backend", "N/A")))
        found["iterations cut by"].add(str(own.get("iteration_method", "N/A")))
        found["torch"].add(str(own.get("torch", "N/A")))
        imported = own.get("imported")
        found["source"].add("jobprof import: " + ", ".join(sorted(
            Path(str(i.get("source", "?"))).name for i in imported if isinstance(i, dict)))
            if isinstance(imported, list) else "profiled run")
    return {key: ", ".join(sorted(values)) or "N/A" for key, values in found.items()}


# -- comparing ---------------------------------------------------------------------------------

def change(a: float | None, b: float | None, minimum: float) -> str:
    """``slower`` / ``faster`` when ``b`` differs from ``a`` beyond both thresholds, else
    ``unchanged``; ``new`` / ``gone`` when one side has nothing."""
    if a is None and b is None:
        return "unchanged"
    if a is None:
        return "new"
    if b is None:
        return "gone"
    delta = b - a
    if abs(delta) < minimum or (a > 0 and abs(delta) / a < RELATIVE):
        return "unchanged"
    return "slower" if delta > 0 else "faster"


def _pct(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else 100 * (b - a) / a


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "p95": p95(values)}


def iteration_table(a: Side, b: Side, scopes: list[int | None]) -> list[dict[str, Any]]:
    """Iteration time and each part, A vs B, per scope (a rank, or None for all ranks pooled)."""
    out = []
    for scope in scopes:
        ra = [r for rank in ([scope] if scope is not None else a.ranks) for r in a.rows.get(rank, ())]
        rb = [r for rank in ([scope] if scope is not None else b.ranks) for r in b.rows.get(rank, ())]
        for part in ("iteration", *breakdown.PARTS):
            key = f"{part}_ms"
            sa = _stats([r[key] for r in ra if r[key] is not None])
            sb = _stats([r[key] for r in rb if r[key] is not None])
            ma, mb = (sa or {}).get("median"), (sb or {}).get("median")
            delta_ms: float | None = None
            delta_mean_ms: float | None = None
            if sa is not None and sb is not None:
                delta_ms, delta_mean_ms = sb["median"] - sa["median"], sb["mean"] - sa["mean"]
            out.append({
                "rank": scope, "part": part, "a": sa, "b": sb,
                "delta_ms": delta_ms, "delta_pct": _pct(ma, mb),
                "delta_mean_ms": delta_mean_ms,
                # a part only one side measured (no dp, no hccl on the other) is new / gone, never
                # a change either way (the verdict and the gate weigh slower / faster only)
                "change": change(ma, mb, ITERATION_MS),
            })
    return out


def _ranks(side: Side, scope: int | None) -> list[int]:
    return side.ranks if scope is None else [scope]


def tables(a: Side, b: Side) -> list[DiffTable]:
    """One table of each key either side has (A's first), in the tables' ``order``: what the
    text rendering needs to know of each (title, headers, which columns)."""
    first: dict[str, DiffTable] = {}
    for side in (a, b):
        for key, per in side.tables.items():
            if key not in first and per:
                first[key] = per[min(per)]
    return sorted(first.values(), key=lambda t: (t.order, t.key))


def _pooled(side: Side, key: str, ranks: list[int]) -> dict[tuple[str, ...], DiffCount]:
    """The ranks' counts of one table summed key by key (the per-iteration series joined)."""
    # accumulated in lists, one DiffCount per key at the end: joining tuples rank by rank is
    # quadratic (1,024 ranks x 1,000 iterations took minutes)
    calls: dict[tuple[str, ...], int] = {}
    time: dict[tuple[str, ...], float] = {}
    size: dict[tuple[str, ...], int | None] = {}
    series: dict[tuple[str, ...], list[float] | None] = {}
    per = side.tables.get(key, {})
    for rank in ranks:
        table = per.get(rank)
        for row, count in (table.rows.items() if table is not None else ()):
            if row not in calls:
                calls[row], time[row] = 0, 0
                size[row] = None if count.bytes is None else 0
                series[row] = None if count.series is None else []
            calls[row] += count.calls
            time[row] += count.time
            before, joined = size[row], series[row]
            size[row] = None if before is None or count.bytes is None else before + count.bytes
            if joined is not None:
                if count.series is None:
                    series[row] = None
                else:
                    joined.extend(count.series)
    return {row: DiffCount(calls[row], time[row], size[row], series[row]) for row in calls}


def _entry(spec: DiffTable, count: DiffCount | None, iterations: int) -> dict[str, Any] | None:
    """One side's row values per iteration of one rank."""
    if count is None or not iterations:
        return None
    entry: dict[str, Any] = {"calls_per_iteration": count.calls / iterations}
    if spec.sizes:
        entry["mb_per_iteration"] = (count.bytes or 0) / 1e6 / iterations
    entry["ms_per_iteration"] = count.time / _PER_MS[spec.time_unit] / iterations
    if count.series is not None:
        series = [*count.series, *[0.0] * (iterations - len(count.series))]
        per_ms = _PER_MS[spec.time_unit]
        entry["median_ms_per_iteration"] = statistics.median(series) / per_ms
        interval = median_interval(series)
        # the noise of the row: where the median of its per-iteration times lies (95%)
        entry["median_ci95_ms_per_iteration"] = None if interval is None else \
            [interval[0] / per_ms, interval[1] / per_ms]
    if spec.per_call:
        entry["us_per_call"] = count.time / _PER_US[spec.time_unit] / count.calls if count.calls else None
    return entry


def _row(head: dict[str, Any], ea: dict[str, Any] | None, eb: dict[str, Any] | None,
         count_key: str) -> dict[str, Any]:
    ta = ea["ms_per_iteration"] if ea else None
    tb = eb["ms_per_iteration"] if eb else None
    verdict = change(ta, tb, OPERATOR_MS)
    # with a per-iteration series (operators): the median iteration must move the same way,
    # since one slow iteration (a page fault, a busy neighbour) shifts the mean alone
    # (slower / faster: both sides have a time, so both entries are there)
    if verdict in ("slower", "faster") and ea is not None and eb is not None \
            and "median_ms_per_iteration" in ea and \
            change(ea["median_ms_per_iteration"], eb["median_ms_per_iteration"], OPERATOR_MS) != verdict:
        verdict = "unchanged"
    # ... and the two medians' 95% intervals must not overlap, where both sides ran enough
    # iterations for one: a shift inside the iterations' own spread is not called a change
    if verdict in ("slower", "faster") and ea is not None and eb is not None \
            and ea.get("median_ci95_ms_per_iteration") and eb.get("median_ci95_ms_per_iteration"):
        (alo, ahi), (blo, bhi) = ea["median_ci95_ms_per_iteration"], eb["median_ci95_ms_per_iteration"]
        if not (blo > ahi if verdict == "slower" else bhi < alo):
            verdict = "unchanged"
    return {**head, "a": ea, "b": eb,
            f"delta_{count_key}": (eb[count_key] if eb else 0.0) - (ea[count_key] if ea else 0.0),
            "delta_ms_per_iteration": (tb or 0.0) - (ta or 0.0), "delta_pct": _pct(ta, tb),
            "change": verdict}


def table_rows(spec: DiffTable, a: Side, b: Side, scopes: list[int | None]) -> list[dict[str, Any]] | None:
    """Every key of either side's table ``spec.key``, per iteration of one rank, sorted by
    |Δ time|; None (or ``[]``, see ``null_when_absent``) unless both sides have the data."""
    key = spec.key
    if not (a.present(key) and b.present(key)):
        return None if spec.null_when_absent else []
    out = []
    for scope in scopes:
        na, nb = a.covered(key, _ranks(a, scope)), b.covered(key, _ranks(b, scope))
        ga, gb = _pooled(a, key, _ranks(a, scope)), _pooled(b, key, _ranks(b, scope))
        for row in sorted(ga.keys() | gb.keys()):
            ea, eb = _entry(spec, ga.get(row), na), _entry(spec, gb.get(row), nb)
            out_row = _row({"rank": scope, **dict(zip(spec.columns, row, strict=True))}, ea, eb,
                           "calls_per_iteration")
            if spec.sizes:
                out_row["delta_mb_per_iteration"] = (eb["mb_per_iteration"] if eb else 0.0) - \
                    (ea["mb_per_iteration"] if ea else 0.0)
            out.append(out_row)
    # ties (a rerun: every Δ near 0) by the time at stake, so --top keeps the rows that matter
    out.sort(key=lambda r: (-abs(round(r["delta_ms_per_iteration"], 6)), -max(
        (e["ms_per_iteration"] for e in (r["a"], r["b"]) if e), default=0.0),
        r["rank"] if r["rank"] is not None else -1, *(r[c] for c in spec.columns)))
    return out


def _side_json(side: Side, specs: list[DiffTable]) -> dict[str, Any]:
    out = {"prof_dir": str(side.prof_dir), "selection": side.selection.describe(), "ranks": side.ranks,
           "iterations": side.iterations(), "job": side.job,
           "iterations_per_rank": {str(r): len(side.rows[r]) for r in side.ranks}}
    for spec in specs:
        if spec.count_key:
            out[spec.count_key] = side.covered(spec.key)
        if spec.present_key:
            out[spec.present_key] = side.present(spec.key)
    return out


def overall(iterations: list[dict[str, Any]]) -> dict[str, Any]:
    """The iteration-time row of every rank pooled (the verdict's and the CI gate's)."""
    return next(r for r in iterations if r["rank"] is None and r["part"] == "iteration")


def own_change(iterations: list[dict[str, Any]]) -> float | None:
    """The share of the pooled iteration's mean change that is jobprof's own hand-over (the
    ``profiler`` part), when the iteration got slower; None otherwise.  Above one half, B is slower
    because it was profiled more deeply (other options), not because the job changed."""
    it = overall(iterations)
    own = next((r for r in iterations if r["rank"] is None and r["part"] == PROFILER), None)
    total = it["delta_mean_ms"]
    if own is None or own["delta_mean_ms"] is None or not total or total <= 0:
        return None
    return own["delta_mean_ms"] / total


def _verdict(iterations: list[dict[str, Any]], named: DiffTable | None,
             rows: list[dict[str, Any]] | None) -> str:
    it = overall(iterations)
    a, b, pct = it["a"]["median"], it["b"]["median"], it["delta_pct"]
    signed = f", {pct:+.1f}%" if pct is not None else ""
    if it["change"] in ("slower", "faster"):
        text = f"B is {abs(pct):.1f}% {it['change']} per iteration (median {a:.3f} → {b:.3f} ms)"
    else:
        text = f"B is unchanged per iteration (median {a:.3f} → {b:.3f} ms{signed}, within noise)"
    parts = [r for r in iterations if r["rank"] == it["rank"] and r["part"] != "iteration"
             and r["change"] in ("slower", "faster") and r["delta_mean_ms"] is not None]
    if parts:
        top = max(parts, key=lambda r: abs(r["delta_mean_ms"]))
        text += f": {top['delta_mean_ms']:+.3f} ms in {top['part']} (mean)"
        if top["part"] == PROFILER:
            text += (" (jobprof's own hand-over, not the job's: were A and B profiled with the same "
                     "options?)")
    if named is None or not rows:
        return text
    flagged = [r for r in rows if r["change"] != "unchanged"]
    if flagged:
        top = flagged[0]
        ca = top["a"]["calls_per_iteration"] if top["a"] else 0
        cb = top["b"]["calls_per_iteration"] if top["b"] else 0
        who = f"rank {top['rank']} " if top["rank"] is not None else ""
        text += (f"; top change: {who}{top[named.columns[0]]} ({top['change']}) "
                 f"{top['delta_ms_per_iteration']:+.3f} ms/iteration ({_calls(ca)} → {_calls(cb)} calls)")
    else:
        text += f"; {named.verdict}"
    return text


#: one side's share of the other's operator time from keys the other never ran, past which the
#: two profiles are called different programs
FOREIGN_SHARE = 0.5


def _different_program(rows: list[dict[str, Any]], named: DiffTable) -> str | None:
    """A warning when most of either side's time is in keys (operator types) the other side
    never ran: not the same program (another model, or the same one on other inputs)."""
    def time(entry: dict[str, Any] | None) -> float:
        return (entry or {}).get("ms_per_iteration") or 0.0

    for side, other in (("a", "b"), ("b", "a")):
        total = sum(time(r[side]) for r in rows)
        alone = [r for r in rows if r[other] is None and time(r[side]) > 0]
        share = sum(time(r[side]) for r in alone) / total if total else 0.0
        if share > FOREIGN_SHARE:
            biggest = sorted(alone, key=lambda r: -time(r[side]))[:3]
            names = ", ".join(str(r[named.columns[0]]) for r in biggest)
            return (f"A and B do not look like the same program: {100 * share:.0f}% of "
                    f"{side.upper()}'s {named.key} time is in {len(alone)} kind(s) the other never ran "
                    f"({names}{', ...' if len(alone) > 3 else ''}); the comparison may mean little")
    return None


def _calls(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.005 else f"{value:.2f}"


def _format(template: str, **values: Any) -> str:
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError, AttributeError):  # a plugin's template gone wrong: as written
        return template


def compare(a: Side, b: Side, per_rank: bool = False) -> dict[str, Any]:
    """The diff model (JSON-ready; keys documented in docs/cli.md, "jobprof diff")."""
    matched = sorted(set(a.ranks) & set(b.ranks))
    only_a, only_b = sorted(set(a.ranks) - set(b.ranks)), sorted(set(b.ranks) - set(a.ranks))
    notes = []
    if only_a or only_b:
        notes.append(f"rank sets differ: A has {a.ranks}, B has {b.ranks}; "
                     + ("per-rank tables compare the ranks both have" if per_rank
                        else "all ranks are pooled, per iteration of one rank"))
    if per_rank and not matched:
        raise DiffError(f"--per-rank: no rank in both profiles (A: {', '.join(map(str, a.ranks)) or 'none'}, "
                        f"B: {', '.join(map(str, b.ranks)) or 'none'})")
    scopes: list[int | None] = [None, *matched] if per_rank else [None]
    detail: list[int | None] = list(matched) if per_rank else [None]
    specs = tables(a, b)
    for name, side in (("A", a), ("B", b)):
        its = side.iterations()
        for spec in specs:
            files = side.covered(spec.key)
            if not side.present(spec.key):
                if spec.absent_note:
                    notes.append(f"{name}: {spec.absent_note}")
            elif spec.partial_note and files < its:
                notes.append(f"{name}: " + _format(spec.partial_note, missing=its - files, iterations=its))
    iterations = iteration_table(a, b, scopes)
    compared = {spec.key: table_rows(spec, a, b, detail) for spec in specs}
    for spec in specs:
        if spec.one_sided_note and a.present(spec.key) != b.present(spec.key):
            notes.append(spec.one_sided_note)
    differs = [key for key in JOB_KEYS if a.job.get(key) != b.job.get(key) and key != "source"]
    if differs:
        notes.insert(0, "different jobs: " + "; ".join(f"{key} {a.job.get(key)} (A) vs {b.job.get(key)} (B)"
                                                        for key in differs))
    named = next((spec for spec in specs if spec.verdict is not None), None)
    named_rows = compared[named.key] if named is not None else None
    if named is not None and named_rows:
        different = _different_program(named_rows, named)
        if different:
            notes.insert(0, different)
    return {
        "schema": SCHEMA, "a": _side_json(a, specs), "b": _side_json(b, specs),
        "scope": "per_rank" if per_rank else "all",
        "ranks": {"matched": matched, "only_a": only_a, "only_b": only_b},
        "thresholds": {"relative": RELATIVE, "iteration_ms": ITERATION_MS, "operator_ms": OPERATOR_MS},
        "verdict": _verdict(iterations, named, compared[named.key] if named else None),
        "counts": {key: None if rows is None else len(rows) for key, rows in compared.items()},
        "iteration": iterations, **compared, "notes": notes,
    }
