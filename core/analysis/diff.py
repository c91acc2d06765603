"""``jobprof diff``: what got slower or faster between two profiles (before / after a change).

Each side is read once: every selected iteration's breakdown (:func:`jobprof.analysis.summary.iteration_rows`,
the same parts ``jobprof summary`` shows), every selected ``op_statistic`` file (all operator
types, not only the summary's top ones) and the hccl records.  Counts and times are normalised
per iteration of one rank, because the two runs may have run different numbers of iterations or
ranks; the raw numbers of iterations are part of the model.

A change is called ``slower`` / ``faster`` only when it passes both noise thresholds below (a
relative one and an absolute one); otherwise it is ``unchanged``.  Operator types and collectives
present on one side only are ``new`` / ``gone``.  The model's keys are stable (``SCHEMA``).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from jobprof.analysis import breakdown
from jobprof.analysis.profile import Profile
from jobprof.analysis.selection import Selection, narrowed
from jobprof.analysis.stats import p95
from jobprof.analysis.summary import Progress, iteration_rows, quiet
from jobprof.files import rawstore
from jobprof.plugin.manager import PluginManager

SCHEMA = "jobprof.diff/1"

# -- noise thresholds: a change must pass BOTH the relative and the absolute one -------------
#: relative change (of the median iteration time / part, or of an operator's or collective's
#: time per iteration) below which a difference is noise
RELATIVE = 0.05
#: iteration time and its parts: absolute change of the median, ms
ITERATION_MS = 0.1
#: an operator type (or collective): absolute change of its time per iteration, ms
OPERATOR_MS = 0.05

CHANGES = ("slower", "faster", "unchanged", "new", "gone")


class DiffError(ValueError):
    """A side cannot be compared (no data selected); the message names the profile."""


@attrs.frozen
class Side:
    """What one profile contributes: per rank its iteration rows, operator and collective totals."""

    prof_dir: Path
    selection: Selection
    #: rank -> one row per selected iteration (``iteration_ms`` and ``<part>_ms``)
    rows: dict[int, list[dict[str, Any]]]
    #: rank -> (OP Type, Core Type) -> [calls, total µs, µs per file holding it], over the selected
    #: op_statistic files
    ops: dict[int, dict[tuple[str, str], list[Any]]]
    #: rank -> op_statistic files read (iterations with operator data)
    op_files: dict[int, int]
    #: rank -> (op, group) -> [calls, bytes, total ns]; None when the profile has no hccl records
    collectives: dict[int, dict[tuple[str, str], list[int]]] | None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rows)

    def iterations(self, ranks: Iterable[int] | None = None) -> int:
        return sum(len(self.rows.get(r, ())) for r in (self.ranks if ranks is None else ranks))


def read_op_statistic(paths: Iterable[Path]) -> tuple[dict[tuple[str, str], list[Any]], int]:
    """``{(OP Type, Core Type): [calls, total µs, [µs in each file holding it]]}`` over ``paths``,
    and the number of files read (an operator type absent from a file spent 0 µs there)."""
    groups: dict[tuple[str, str], list[Any]] = {}
    files = 0
    for path in paths:
        try:
            found = _op_statistic(path)
        except (OSError, ValueError, csv.Error) as exc:  # one unreadable file: the others count
            rawstore.problem(f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}: left out")
            continue
        for key, (count, total) in found.items():
            g = groups.setdefault(key, [0, 0.0, []])
            g[0] += count
            g[1] += total
            g[2].append(total)
        files += 1
    return groups, files


def _op_statistic(path: Path) -> dict[tuple[str, str], tuple[int, float]]:
    """One op_statistic file's (OP Type, Core Type) -> (calls, total µs); ValueError names what is
    wrong with a file that is not one."""
    found: dict[tuple[str, str], tuple[int, float]] = {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = {"OP Type", "Core Type", "Count", "Total Time(us)"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"not an op_statistic file (no column {', '.join(sorted(missing))})")
        for row in reader:
            try:
                count, total = int(row["Count"]), float(row["Total Time(us)"])
            except (TypeError, ValueError):
                continue  # an N/A cell (or a short row): nothing measured to add
            if count < 0 or not math.isfinite(total):
                continue
            key = (str(row["OP Type"]), str(row["Core Type"]))
            before = found.get(key, (0, 0.0))
            found[key] = (before[0] + count, before[1] + total)
    return found


def _collective(r: dict[str, Any]) -> tuple[tuple[str, str], int, int] | None:
    """A hccl record's ((op, group), bytes, ns), or None when it has no usable duration or is not
    shaped as the hccl plugin writes it."""
    if r.get("duration_unknown") or r.get("end_ns") is None:
        return None
    start, end, size = r.get("start_ns"), r["end_ns"], r.get("bytes") or 0
    group = r.get("group_desc") or r.get("group")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, size)) \
            or not isinstance(r.get("op"), str) or not isinstance(group, str) or end < start:
        raise ValueError("not a hccl record (op, group, start_ns, end_ns, bytes)")
    return (r["op"], group), size, end - start


def load(path: Path, selection: Selection, manager: PluginManager, progress: Progress = quiet) -> Side:
    """Read one side (raises FileNotFoundError when ``path`` holds no PROF_ directory)."""
    profile = Profile(path, selection)
    rows: dict[int, list[dict[str, Any]]] = {}
    ops: dict[int, dict[tuple[str, str], list[Any]]] = {}
    files: dict[int, int] = {}
    collectives: dict[int, dict[tuple[str, str], list[int]]] = {}
    seen_hccl = False
    for device in profile.devices:
        rank = profile.rank(device)
        rows[rank] = list(iteration_rows(profile, manager, device, progress))
        ops[rank], files[rank] = read_op_statistic(profile.summary_files(device, "op_statistic"))
        per = collectives.setdefault(rank, {})
        bad = 0
        for r in profile.records("hccl", device):
            seen_hccl = True
            try:
                found = _collective(r) if isinstance(r, dict) else None
            except ValueError:
                bad += 1
                continue
            if found is None:
                continue
            c = per.setdefault(found[0], [0, 0, 0])
            c[0] += 1
            c[1] += found[1]
            c[2] += found[2]
        if bad:
            rawstore.problem(f"{profile.folder(device) / 'data'}: {bad} hccl record(s) not shaped as the "
                             "hccl plugin writes them (op, group, start_ns, end_ns, bytes): left out")
    if not any(rows.values()):
        chosen = narrowed(selection.describe())
        present = sorted(profile.rank(d) for d in profile.all_devices) or "none"
        raise DiffError(f"{profile.path}: no iterations recorded"
                        f"{' for ' + chosen if chosen else ''} (ranks present: {present})")
    return Side(profile.path, selection, rows, ops, files, collectives if seen_hccl else None)


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
            both = sa is not None and sb is not None
            out.append({
                "rank": scope, "part": part, "a": sa, "b": sb,
                "delta_ms": mb - ma if both else None, "delta_pct": _pct(ma, mb),
                "delta_mean_ms": sb["mean"] - sa["mean"] if both else None,
                # a part one side cannot measure (no dp, no hccl) is not a change
                "change": change(ma, mb, ITERATION_MS) if both else "unchanged",
            })
    return out


def _ranks(side: Side, scope: int | None) -> list[int]:
    return side.ranks if scope is None else [scope]


def operator_table(a: Side, b: Side, scopes: list[int | None]) -> list[dict[str, Any]]:
    """Every operator type of either side, per iteration of one rank, sorted by |Δ time|."""
    out = []
    for scope in scopes:
        na = sum(a.op_files.get(r, 0) for r in _ranks(a, scope))
        nb = sum(b.op_files.get(r, 0) for r in _ranks(b, scope))
        if not na and not nb:
            continue
        ga = _pooled(a.ops, _ranks(a, scope))
        gb = _pooled(b.ops, _ranks(b, scope))
        for key in sorted(ga.keys() | gb.keys()):
            ea = _op_entry(ga.get(key), na)
            eb = _op_entry(gb.get(key), nb)
            out.append(_row({"rank": scope, "op_type": key[0], "core_type": key[1]}, ea, eb,
                            "calls_per_iteration"))
    out.sort(key=lambda r: (-abs(r["delta_ms_per_iteration"]), r["rank"] if r["rank"] is not None else -1,
                            r["op_type"], r["core_type"]))
    return out


def _pooled(table: dict[int, dict[tuple[str, str], list]], ranks: list[int]) -> dict[tuple[str, str], list]:
    """Sum the ranks' entries field by field (lists, the per-file series, are joined)."""
    out: dict[tuple[str, str], list] = {}
    for rank in ranks:
        for key, values in table.get(rank, {}).items():
            acc = out.setdefault(key, [[] if isinstance(v, list) else 0 for v in values])
            for i, v in enumerate(values):
                acc[i] = acc[i] + v
    return out


def _op_entry(values: list[Any] | None, iterations: int) -> dict[str, float | None] | None:
    if values is None or not iterations:
        return None
    calls, total_us, per_file = values
    series = [*per_file, *[0.0] * (iterations - len(per_file))]
    return {"calls_per_iteration": calls / iterations, "ms_per_iteration": total_us / 1000 / iterations,
            "median_ms_per_iteration": statistics.median(series) / 1000,
            "us_per_call": total_us / calls if calls else None}


def _row(head: dict[str, Any], ea: dict[str, Any] | None, eb: dict[str, Any] | None,
         count_key: str) -> dict[str, Any]:
    ta = ea["ms_per_iteration"] if ea else None
    tb = eb["ms_per_iteration"] if eb else None
    verdict = change(ta, tb, OPERATOR_MS)
    # operators: the median iteration must move the same way, since one slow iteration (a page
    # fault, a busy neighbour) shifts the mean alone
    if verdict in ("slower", "faster") and "median_ms_per_iteration" in ea and \
            change(ea["median_ms_per_iteration"], eb["median_ms_per_iteration"], OPERATOR_MS) != verdict:
        verdict = "unchanged"
    return {**head, "a": ea, "b": eb,
            f"delta_{count_key}": (eb[count_key] if eb else 0.0) - (ea[count_key] if ea else 0.0),
            "delta_ms_per_iteration": (tb or 0.0) - (ta or 0.0), "delta_pct": _pct(ta, tb),
            "change": verdict}


def collective_table(a: Side, b: Side, scopes: list[int | None]) -> list[dict[str, Any]] | None:
    """Per collective (op, group): calls, MB and time per iteration of one rank; None unless both
    sides recorded hccl data."""
    if a.collectives is None or b.collectives is None:
        return None
    out = []
    for scope in scopes:
        na, nb = a.iterations(_ranks(a, scope)), b.iterations(_ranks(b, scope))
        ga = _pooled(a.collectives, _ranks(a, scope))
        gb = _pooled(b.collectives, _ranks(b, scope))
        for key in sorted(ga.keys() | gb.keys()):
            ea = _coll_entry(ga.get(key), na)
            eb = _coll_entry(gb.get(key), nb)
            row = _row({"rank": scope, "op": key[0], "group": key[1]}, ea, eb, "calls_per_iteration")
            row["delta_mb_per_iteration"] = (eb["mb_per_iteration"] if eb else 0.0) - \
                (ea["mb_per_iteration"] if ea else 0.0)
            out.append(row)
    out.sort(key=lambda r: (-abs(r["delta_ms_per_iteration"]), r["rank"] if r["rank"] is not None else -1,
                            r["op"], r["group"]))
    return out


def _coll_entry(values: list[int] | None, iterations: int) -> dict[str, float] | None:
    if values is None or not iterations:
        return None
    calls, size, ns = values
    return {"calls_per_iteration": calls / iterations, "mb_per_iteration": size / 1e6 / iterations,
            "ms_per_iteration": ns / 1e6 / iterations}


def _side_json(side: Side) -> dict[str, Any]:
    return {"prof_dir": str(side.prof_dir), "selection": side.selection.describe(), "ranks": side.ranks,
            "iterations": side.iterations(),
            "iterations_per_rank": {str(r): len(side.rows[r]) for r in side.ranks},
            "op_statistic_files": sum(side.op_files.values()), "hccl": side.collectives is not None}


def _verdict(iterations: list[dict[str, Any]], operators: list[dict[str, Any]]) -> str:
    it = next(r for r in iterations if r["rank"] is None and r["part"] == "iteration")
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
    flagged = [r for r in operators if r["change"] != "unchanged"]
    if flagged:
        top = flagged[0]
        ca = top["a"]["calls_per_iteration"] if top["a"] else 0
        cb = top["b"]["calls_per_iteration"] if top["b"] else 0
        who = f"rank {top['rank']} " if top["rank"] is not None else ""
        text += (f"; top change: {who}{top['op_type']} ({top['change']}) "
                 f"{top['delta_ms_per_iteration']:+.3f} ms/iteration ({_calls(ca)} → {_calls(cb)} calls)")
    elif operators:
        text += "; no operator type changed beyond noise"
    return text


def _calls(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.005 else f"{value:.2f}"


def compare(a: Side, b: Side, per_rank: bool = False) -> dict[str, Any]:
    """The diff model (JSON-ready; keys documented in the README's "diff --json" section)."""
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
    for name, side in (("A", a), ("B", b)):
        its, files = side.iterations(), sum(side.op_files.values())
        if files and files < its:
            notes.append(f"{name}: {its - files} of {its} iterations have no op_statistic file "
                         "(killed before export? run `jobprof export`); operators are per iteration with one")
        if not files:
            notes.append(f"{name}: no op_statistic files (task_trace off?): no operator comparison")
    iterations = iteration_table(a, b, scopes)
    operators = operator_table(a, b, detail) if any(a.op_files.values()) and any(b.op_files.values()) else []
    collectives = collective_table(a, b, detail)
    if collectives is None and (a.collectives is not None or b.collectives is not None):
        notes.append("only one side has hccl data: no collective comparison")
    return {
        "schema": SCHEMA, "a": _side_json(a), "b": _side_json(b),
        "scope": "per_rank" if per_rank else "all",
        "ranks": {"matched": matched, "only_a": only_a, "only_b": only_b},
        "thresholds": {"relative": RELATIVE, "iteration_ms": ITERATION_MS, "operator_ms": OPERATOR_MS},
        "verdict": _verdict(iterations, operators),
        "counts": {"operators": len(operators),
                   "collectives": None if collectives is None else len(collectives)},
        "iteration": iterations, "operators": operators, "collectives": collectives, "notes": notes,
    }
