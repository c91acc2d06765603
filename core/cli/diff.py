"""``jobprof diff PROF_A PROF_B``: iteration time and per-operator comparison of two profiles.

A one-line verdict, then tables (iteration time and its parts, then each plugin's table: every
operator type, every collective, ...), or the model of :mod:`jobprof.analysis.diff` with
``--json`` (stable keys).  ``--rank`` and ``--iterations`` narrow both sides; ``--iterations-b``
narrows B differently.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from jobprof.analysis import breakdown, diff
from jobprof.analysis.selection import narrowed
from jobprof.cli._common import add_engine, add_selection, new_manager, printable, progress_for, selection
from jobprof.plugin.results import DiffTable

#: operator / collective rows shown on a terminal without --top
TOP = 20
#: the exit status of --fail-on-regression when B regressed (1: error, 2: bad arguments)
REGRESSION_EXIT = 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="compare two profiles (before / after): iteration time, its parts, "
                                    "every operator type and collective, per iteration")
    p.add_argument("prof_a", type=Path, help="profile A (before): a PROF_* directory or a folder holding one")
    p.add_argument("prof_b", type=Path, help="profile B (after)")
    add_selection(p, "only these iterations (both sides): 5-20, 5-, -20 or 7")
    p.add_argument("--iterations-b", metavar="A-B",
                   help="B's iterations when they differ from A's (default: --iterations)")
    p.add_argument("--per-rank", action="store_true",
                   help="tables per rank (ranks matched by rank id) instead of all ranks pooled")
    p.add_argument("--top", type=int, metavar="N",
                   help=f"operator and collective rows to show (default {TOP} on a terminal; "
                        "all with --json)")
    p.add_argument("--json", action="store_true",
                   help="print the model as JSON (stable keys, see docs/cli.md)")
    p.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help=f"exit {REGRESSION_EXIT} when B's median iteration is slower than A's beyond the "
                        "noise thresholds and by more than PCT percent (a CI gate)")
    add_engine(p)
    p.set_defaults(func=run)


def _f(value: float | None, digits: int = 3, sign: bool = False) -> str:
    if value is None:
        return "N/A"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _get(entry: dict[str, Any] | None, key: str) -> float | None:
    return None if entry is None else entry.get(key)


def _side(name: str, side: dict[str, Any]) -> str:
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in side["iterations_per_rank"].items())
    sel = narrowed(side["selection"])
    return (f"{name}: {side['prof_dir']}  ({len(side['ranks'])} rank(s), {side['iterations']} iteration(s): "
            f"{per_rank}{'; ' + sel if sel else ''})")


def _title(spec: DiffTable, model: dict[str, Any], shown: int, total: int) -> str:
    key = spec.count_key or ""
    try:
        return spec.title.format(shown=shown, total=total, a=model["a"].get(key), b=model["b"].get(key))
    except (KeyError, IndexError, ValueError, AttributeError):  # a plugin's template gone wrong: as written
        return spec.title


def _table_headers(spec: DiffTable, per_rank: bool, noise: bool) -> list[str]:
    return [*(["rank"] if per_rank else []), *spec.headers, "A calls", "B calls",
            *(["Δ calls"] if spec.per_call else []), *(["A MB", "B MB"] if spec.sizes else []),
            "A ms", "B ms", "Δ ms", "Δ %", *(["A µs/call", "B µs/call"] if spec.per_call else []),
            *(["A median ms (95% CI)", "B median ms (95% CI)"] if noise else []), "change"]


def _table_row(spec: DiffTable, r: dict[str, Any], per_rank: bool, noise: bool) -> list[Any]:
    a, b = r["a"], r["b"]
    return [*([r["rank"]] if per_rank else []), *(r[c] for c in spec.columns),
            _f(_get(a, "calls_per_iteration"), 2), _f(_get(b, "calls_per_iteration"), 2),
            *([_f(r["delta_calls_per_iteration"], 2, sign=True)] if spec.per_call else []),
            *([_f(_get(a, "mb_per_iteration")), _f(_get(b, "mb_per_iteration"))] if spec.sizes else []),
            _f(_get(a, "ms_per_iteration")), _f(_get(b, "ms_per_iteration")),
            _f(r["delta_ms_per_iteration"], sign=True), _f(r["delta_pct"], 1, sign=True),
            *([_f(_get(a, "us_per_call"), 1), _f(_get(b, "us_per_call"), 1)] if spec.per_call else []),
            *([_median(a), _median(b)] if noise else []), r["change"]]


def _median(entry: dict[str, Any] | None) -> str:
    """``median (95% interval)`` of a side's ms per iteration."""
    if entry is None or entry.get("median_ms_per_iteration") is None:
        return "N/A"
    interval = entry.get("median_ci95_ms_per_iteration")
    span = f" ({interval[0]:.3f}-{interval[1]:.3f})" if interval else " (N/A)"
    return f"{entry['median_ms_per_iteration']:.3f}{span}"


def _noise(rows: list[dict[str, Any]]) -> bool:
    """Whether the table's rows carry a per-iteration series (their medians and intervals)."""
    return any(e is not None and "median_ms_per_iteration" in e for r in rows for e in (r["a"], r["b"]))


def render(model: dict[str, Any], specs: list[DiffTable], top: int | None) -> str:
    """The model as terminal text; ``specs`` (:func:`jobprof.analysis.diff.tables`) say how to
    show each plugin's table."""
    per_rank = model["scope"] == "per_rank"
    out = [_side("A", model["a"]), _side("B", model["b"]), "", model["verdict"]]
    jobs = [[key, model["a"]["job"].get(key, "N/A"), model["b"]["job"].get(key, "N/A"),
             "" if model["a"]["job"].get(key) == model["b"]["job"].get(key) else "differs"]
            for key in diff.JOB_KEYS]
    if any(row[3] for row in jobs):
        out += ["", "The jobs", tabulate(jobs, headers=["", "A", "B", ""], disable_numparse=True)]
    rows = [[*([r["rank"] if r["rank"] is not None else "all"] if per_rank else []),
             breakdown.LABELS[r["part"]],
             _f(_get(r["a"], "mean")), _f(_get(r["a"], "median")), _f(_get(r["a"], "p95")),
             _f(_get(r["b"], "mean")), _f(_get(r["b"], "median")), _f(_get(r["b"], "p95")),
             _f(r["delta_ms"], sign=True), _f(r["delta_pct"], 1, sign=True), r["change"]]
            for r in model["iteration"]]
    out += ["", "Iteration time (ms; Δ of the median)",
            tabulate(rows, headers=[*(["rank"] if per_rank else []), "", "A mean", "A median", "A p95",
                                    "B mean", "B median", "B p95", "Δ ms", "Δ %", "change"],
                     disable_numparse=True)]
    limit = TOP if top is None else top
    for spec in specs:
        table = model.get(spec.key)
        if not table:
            continue
        shown = table[:limit]
        noise = _noise(shown)
        out += ["", _title(spec, model, len(shown), len(table)),
                tabulate([_table_row(spec, r, per_rank, noise) for r in shown],
                         headers=_table_headers(spec, per_rank, noise), disable_numparse=True)]
    t = model["thresholds"]
    notes = [*model["notes"],
             f"a change is slower/faster only beyond {100 * t['relative']:.0f}% and {t['iteration_ms']} ms "
             f"(iteration, parts: median) or {t['operator_ms']} ms per iteration (operators, collectives); "
             "an operator is slower/faster only when its per-iteration median moved the same way and the "
             "two medians' 95% intervals (distribution-free, from the iterations' spread; N/A under 6 "
             "iterations) do not overlap"]
    out += [""] + [f"  note: {n}" for n in notes]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    if args.top is not None and args.top < 0:
        print("jobprof: error: --top must be 0 or more", file=sys.stderr)
        return 2
    if args.fail_on_regression is not None and not args.fail_on_regression >= 0:
        print("jobprof: error: --fail-on-regression must be a percentage, 0 or more", file=sys.stderr)
        return 2
    try:
        sel_a = selection(args)
        sel_b = selection(args, args.iterations_b) if args.iterations_b is not None else sel_a
        manager, _ = new_manager()
        manager.load_entry_points()
        engine = (args.engine, args.jobs, args.scheduler)
        a = diff.load(args.prof_a, sel_a, manager, progress_for(), *engine)
        b = diff.load(args.prof_b, sel_b, manager, progress_for(), *engine)
        model = diff.compare(a, b, per_rank=args.per_rank)
        specs = diff.tables(a, b)
    except (diff.DiffError, FileNotFoundError, NotADirectoryError) as exc:  # nothing usable to compare
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 1
    except ValueError as exc:  # a bad --iterations / --rank
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 2
    if args.json:
        if args.top is not None:
            for spec in specs:
                if model[spec.key] is not None:
                    model[spec.key] = model[spec.key][:args.top]
        print(json.dumps(model, indent=2))
    else:
        print(printable(render(model, specs, args.top)))
    return regression(model, args.fail_on_regression)


def regression(model: dict[str, Any], limit: float | None) -> int:
    """:data:`REGRESSION_EXIT` (said on stderr) when B's median iteration is slower than A's,
    beyond noise, by more than ``limit`` percent; else 0."""
    if limit is None:
        return 0
    it = diff.overall(model["iteration"])
    pct = it["delta_pct"]
    own = diff.own_change(model["iteration"])
    if it["change"] == "slower" and pct is not None and pct > limit and own is not None and own > 0.5:
        # jobprof's time is never counted as the job's: a deeper profile of B is no regression
        print(printable(f"jobprof: note: B's median iteration is {pct:.1f}% slower than A's, but "
                        f"{100 * own:.0f}% of the change is jobprof's own hand-over (B was profiled with "
                        "other options): not called a regression"), file=sys.stderr)
        return 0
    if it["change"] == "slower" and pct is not None and pct > limit:
        print(printable(f"jobprof: regression: B's median iteration is {pct:.1f}% slower than A's "
                        f"(limit {limit:g}%)"), file=sys.stderr)
        return REGRESSION_EXIT
    return 0
