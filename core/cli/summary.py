"""``jobprof summary``: where each rank's iteration time went, and what to do about it.

Tables on a terminal, or the model of :mod:`jobprof.analysis.summary` with ``--json`` (stable keys,
documented in docs/cli.md).  ``--iterations`` and ``--rank`` narrow what every section counts.
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
from jobprof.analysis.summary import BEFORE_FIRST, process_marks, summarize
from jobprof.cli._common import (
    add_engine,
    add_prof_dir,
    add_selection,
    new_manager,
    printable,
    progress_for,
    selection,
)

STATS = ("mean", "median", "p95", "worst")
#: ``--json`` is indented up to this many ranks, one line above
RANKS_INDENTED = 16


def load(args: argparse.Namespace) -> tuple[Profile, dict[str, Any]]:
    """The selected profile and its summary model (raises ValueError on a bad selection)."""
    profile = Profile(args.prof_dir, selection(args))
    manager, _ = new_manager()
    manager.load_entry_points()
    return profile, summarize(profile, manager, progress_for(), args.engine, args.jobs, args.scheduler)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summary", help="per-rank iteration breakdown, top operators, collectives, findings")
    add_prof_dir(p)
    p.add_argument("--json", action="store_true",
                   help="print the model as JSON (stable keys, see docs/cli.md)")
    add_selection(p)
    add_engine(p)
    p.set_defaults(func=run)


def _f(value: float | None) -> str:
    return text(value, MS)


def _pct(value: float | None) -> str:
    return text(value, PCT)


#: the finding about jobprof's own time (jobprof.analysis.findings, the "profiler" part)
OWN_COST = "profiler"


def startup_note(ranks: list[dict[str, Any]]) -> str:
    """What came before iteration 1 on each rank, in no iteration (empty when unknown)."""
    said = []
    for r in ranks:
        startup = r.get("startup")
        if not startup:
            continue
        ranked = sorted(startup["own"].items(), key=lambda kv: -kv[1])
        own = ", ".join(f"{what} {ms:,.0f} ms" for what, ms in ranked if ms >= 1)
        said.append(f"rank {r['rank']}: {startup['ms'] / 1e3:,.2f} s" + (
            f" ({startup['own_ms']:,.0f} ms of it jobprof's own startup: {own})" if own else ""))
    if not said:
        return ""
    return f"{BEFORE_FIRST}: " + "; ".join(said)


def render(model: dict[str, Any]) -> str:
    """The model as terminal text.

    Above :data:`~jobprof.analysis.scale.RANK_TABLE_LIMIT` ranks, the per-rank tables become
    distributions across ranks (:mod:`jobprof.analysis.scale`): the ranks folded into groups,
    min / p50 / p95 / max of each rank's mean, the outlier ranks named, the top stragglers, and
    per-device sections cut to the slowest and a median rank.
    """
    from jobprof.analysis import scale

    out: list[str] = []
    ranks = model["ranks"]
    sel = narrowed(model["selection"])
    out.append(f"{model['prof_dir']}  ({len(ranks)} rank(s){'; ' + sel if sel else ''})")
    if ranks and scale.many(model):
        out += _rank_distribution(model)
    elif ranks:
        marked, notes = process_marks(ranks)
        rows = [[f"{r['rank']}*" if r["device"] in marked else r["rank"], r["device"],
                 r["hostname"] or "N/A", r.get("pid") or "N/A", r["iterations"]["count"],
                 f"{r['iterations']['first']}-{r['iterations']['last']}" if r["iterations"]["count"] else "-",
                 r["iteration_method"] or "N/A", "yes" if r["finished"] else "no (killed?)"] for r in ranks]
        out += ["", "Ranks", tabulate(rows, headers=["rank", "device", "host", "pid", "iterations", "range",
                                                     "found by", "finished"])]
        out += [f"  note: {n}" for n in notes]
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
        first = ("in each iteration the parts add up to its time, so the mean row adds up too; the median, "
                 "p95 and worst are each column's own (of different iterations); definitions in "
                 "docs/cli.md (jobprof summary)")
        out += [f"  note: {n}" for n in [first, *bases, "; ".join(worst), startup_note(ranks)] if n]
    cross = model["cross_rank"]
    if cross:
        what = "time outside collectives" if cross["measure"] == "busy" else "iteration time"
        spread = cross["spread_share"]
        shown = scale.stragglers(cross) if scale.many(model) else list(cross["slowest_count"])
        rows = [[rank, f"{cross['slowest_count'][rank]} of {cross['iterations_compared']}",
                 _pct(cross["median_excess"][rank])] for rank in shown]
        title = f"Across ranks ({what}, {cross['iterations_compared']} iterations)"
        if scale.many(model):
            title += f": the {len(shown)} rank(s) slowest most often"
        out += ["", title, tabulate(rows, headers=["rank", "slowest in", "vs median (median)"])]
        if scale.many(model):
            out.append(f"  note: {_others(cross, shown)}")
        out.append(f"  spread (max - min) as a share of the iteration: median {_pct(spread['median'])}, "
                   f"p95 {_pct(spread['p95'])}, worst {_pct(spread['worst'])} "
                   f"(iteration {spread['worst_iteration']})")
    for section in model["sections"].values():
        kept, notes = scale.section_rows(model, section)
        rows = [section["rows"][i] for i in kept]
        out += ["", section["title"], tabulate(rows, headers=section["headers"], missingval="N/A")]
        out += [f"  note: {n}" for n in notes]
    # the job's findings first; the profiler's own cost apart, on its own line, so the first
    # answer is about the job, never about jobprof
    job = [f for f in model["findings"] if f["key"] != OWN_COST]
    own = [f for f in model["findings"] if f["key"] == OWN_COST]
    if job:
        out += ["", "Findings"]
        out += [f"  {i}. {f['text']}" for i, f in enumerate(job, 1)]
    if own:
        out += ["", "jobprof's own cost"] + [f"  {f['text']}" for f in own]
    if model["missing"]:
        out += ["", "Missing"] + [f"  - {m}" for m in model["missing"]]
    if not ranks and not model["sections"]:
        out.append("no data: no plugin reported anything for this profile")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        _, model = load(args)
    except ValueError as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 2
    if args.json:
        # above 16 ranks one line: the model grows with ranks x iterations, and the indented
        # form is written by Python's pure encoder, three times slower than the C one
        indent = None if len(model["ranks"]) > RANKS_INDENTED else 2
        print(json.dumps(model, indent=indent, default=str))
    else:
        print(printable(render(model)))
    if not usable(model):  # the exit status says it; stderr says why, for a script's log
        print(printable(f"jobprof: no iteration in {model['prof_dir']}: nothing to summarize "
                        "(why: the Missing list)"), file=sys.stderr)
        return 1
    return 0


def usable(model: dict[str, Any]) -> bool:
    """Whether any rank had an iteration to show: exit status 1 when none did (nothing usable:
    no device folder, or every raw line unreadable, each named on stderr)."""
    return any(r["iterations"]["count"] for r in model["ranks"])


def _others(cross: dict[str, Any], shown: list[str]) -> str:
    """What the top-stragglers table leaves out."""
    counts = cross["slowest_count"]
    never = sum(1 for n in counts.values() if not n)
    rest = len(counts) - len(shown) - never
    parts = [f"{rest} more rank(s) were the slowest in fewer iterations"] if rest else []
    parts += [f"{never} rank(s) were never the slowest"] if never else []
    return "; ".join([*parts, "every rank's count is in `jobprof summary --json`"])


def _rank_distribution(model: dict[str, Any]) -> list[str]:
    """The "Ranks" and per-rank iteration tables of many ranks, as distributions across ranks."""
    from jobprof.analysis import scale

    ranks = model["ranks"]
    groups = scale.rank_groups(model)
    rows = [[scale.rank_list(g["ranks"], 6), len(g["ranks"]), g["hosts"], g["count"], g["range"], g["method"],
             "yes" if g["finished"] else "no (killed?)"] for g in groups]
    out = ["", f"Ranks ({len(ranks)}, grouped where they read the same)",
           tabulate(rows, headers=["ranks", "count", "hosts", "iterations", "range", "found by", "finished"])]
    found = scale.rank_distribution(model)
    if not found["measured"]:
        return out
    keys = ("iteration", *breakdown.PARTS)
    rows = [[stat, *(_f(d[stat]["value"]) if d else "N/A" for d in (found["stats"][k] for k in keys))]
            for stat in scale.STATS]
    out += ["", f"Iteration time (ms): each rank's mean, distributed across {found['measured']} ranks",
            tabulate(rows, headers=["", *(breakdown.LABELS[k] for k in keys)], disable_numparse=True)]
    it = found["stats"]["iteration"]
    notes = ["parts add up to each rank's iteration time; definitions in docs/cli.md (jobprof summary); "
             "percentiles are nearest-rank (each value is one rank's)"]
    notes += sorted({f"{breakdown.LABELS[k]}: {v}" for r in ranks for k, v in r["basis"].items()})
    if it:
        named = ", ".join(f"rank {o['rank']} {o['mean_ms']:.3f} ms"
                          + (f" ({o['vs_p50']:+.0%} vs p50)" if o["vs_p50"] is not None else "")
                          for o in found["outliers"])
        notes.append(f"slowest ranks by mean iteration time (the {scale.SLOWEST_SHOWN} slowest and any over "
                     f"p50 x {scale.OUTLIER_FACTOR:g}): {named}")
    started = sorted((r["startup"]["ms"], r["rank"]) for r in ranks if r.get("startup"))
    if started:
        p50 = started[(len(started) - 1) // 2][0]  # nearest rank, as the table's
        longest, rank = started[-1]
        notes.append(f"before iteration 1, in no iteration (profiling start to the first forward): p50 "
                     f"{p50 / 1e3:,.2f} s, the longest {longest / 1e3:,.2f} s (rank {rank}), "
                     f"over {len(started)} ranks")
    notes.append(f"unfinished rank(s) (no end_info): {scale.rank_list(found['unfinished'])}"
                 if found["unfinished"] else "every rank finished")
    if found["no_iterations"]:
        notes.append(f"rank(s) with no iteration: {scale.rank_list(found['no_iterations'])}")
    notes.append("each rank's table: `jobprof summary --json`, or `--rank R`")
    return out + [f"  note: {n}" for n in notes]
