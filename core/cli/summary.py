"""``jobprof summary``: where each rank's iteration time went, and what to do about it.

Tables on a terminal, or the model of :mod:`jobprof.analysis.summary` with ``--json`` (stable keys,
documented in the README).  ``--iterations`` and ``--rank`` narrow what every section counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tabulate import tabulate

from jobprof.analysis import breakdown
from jobprof.analysis.profile import Profile
from jobprof.analysis.report.fmt import MS, PCT, text
from jobprof.analysis.selection import narrowed
from jobprof.analysis.summary import summarize
from jobprof.cli._common import add_prof_dir, add_selection, new_manager, progress_for, selection

STATS = ("mean", "median", "p95", "worst")


def load(args: argparse.Namespace) -> tuple[Profile, dict[str, Any]]:
    """The selected profile and its summary model (raises ValueError on a bad selection)."""
    profile = Profile(args.prof_dir, selection(args))
    manager, _ = new_manager()
    manager.load_entry_points()
    return profile, summarize(profile, manager, progress_for())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summary", help="per-rank iteration breakdown, top operators, collectives, findings")
    add_prof_dir(p)
    p.add_argument("--json", action="store_true", help="print the model as JSON (stable keys, see README)")
    add_selection(p)
    p.set_defaults(func=run)


def _f(value: float | None) -> str:
    return text(value, MS)


def _pct(value: float | None) -> str:
    return text(value, PCT)


def render(model: dict[str, Any]) -> str:
    """The model as terminal text."""
    out: list[str] = []
    ranks = model["ranks"]
    sel = narrowed(model["selection"])
    out.append(f"{model['prof_dir']}  ({len(ranks)} rank(s){'; ' + sel if sel else ''})")
    if ranks:
        rows = [[r["rank"], r["device"], r["hostname"] or "N/A", r["iterations"]["count"],
                 f"{r['iterations']['first']}-{r['iterations']['last']}" if r["iterations"]["count"] else "-",
                 r["iteration_method"] or "N/A", "yes" if r["finished"] else "no (killed?)"] for r in ranks]
        out += ["", "Ranks", tabulate(rows, headers=["rank", "device", "host", "iterations", "range",
                                                     "found by", "finished"])]
        keys = ("iteration", *breakdown.PARTS)
        rows = []
        for r in (r for r in ranks if r["iterations"]["count"]):
            for stat in STATS:
                rows.append([r["rank"], stat, *(_f(r["breakdown_ms"][k][stat]) for k in keys)])
            rows.append([r["rank"], "share", "100%", *(_pct(r["share"][k]) for k in breakdown.PARTS)])
        out += ["", "Iteration time (ms): where it went, per rank",
                tabulate(rows, headers=["rank", "", *(breakdown.LABELS[k] for k in keys)])]
        worst = [f"rank {r['rank']}: worst iteration {r['breakdown_ms']['iteration']['worst_iteration']}"
                 for r in ranks if r["iterations"]["count"]]
        bases = sorted({f"{breakdown.LABELS[k]}: {v}" for r in ranks for k, v in r["basis"].items()})
        out += [f"  note: {n}" for n in ["parts add up to the iteration time; see README for definitions",
                                         *bases, "; ".join(worst)] if n]
    cross = model["cross_rank"]
    if cross:
        what = "time outside collectives" if cross["measure"] == "busy" else "iteration time"
        spread = cross["spread_share"]
        rows = [[rank, f"{n} of {cross['iterations_compared']}", _pct(cross["median_excess"][rank])]
                for rank, n in cross["slowest_count"].items()]
        out += ["", f"Across ranks ({what}, {cross['iterations_compared']} iterations)",
                tabulate(rows, headers=["rank", "slowest in", "vs median (median)"]),
                f"  spread (max - min) as a share of the iteration: median {_pct(spread['median'])}, "
                f"p95 {_pct(spread['p95'])}, worst {_pct(spread['worst'])} "
                f"(iteration {spread['worst_iteration']})"]
    for section in model["sections"].values():
        out += ["", section["title"], tabulate(section["rows"], headers=section["headers"], missingval="N/A")]
        out += [f"  note: {n}" for n in section["notes"]]
    if model["findings"]:
        out += ["", "Findings"]
        out += [f"  {i}. {f['text']}" for i, f in enumerate(model["findings"], 1)]
    if model["missing"]:
        out += ["", "Missing"] + [f"  - {m}" for m in model["missing"]]
    if not ranks and not model["sections"]:
        out.append("no data: no plugin reported anything for this profile")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        _, model = load(args)
    except ValueError as exc:
        print(f"jobprof: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(model, indent=2, default=str))
    else:
        print(render(model))
    return 0 if usable(model) else 1


def usable(model: dict[str, Any]) -> bool:
    """Whether any rank had an iteration to show: exit status 1 when none did (nothing usable:
    no device folder, or every raw line unreadable, each named on stderr)."""
    return any(r["iterations"]["count"] for r in model["ranks"])
