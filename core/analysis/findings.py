"""The core's findings (from the iteration breakdown and the cross-rank comparison) and what a
profile is missing.  Plugins add their own findings to their report sections; :func:`rank`
orders all of them, most important first, which is the order they are numbered in, after
grouping the per-rank findings that say the same thing on :data:`GROUP_MIN` or more ranks into
one (:func:`grouped`: ``ranks 0-31 (32 ranks): ...`` with the median rank's numbers and the
outlier ranks named), so a profile of 1024 ranks does not list 1024 copies of a finding.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from jobprof.analysis import scale
from jobprof.analysis.breakdown import LABELS, PARTS
from jobprof.analysis.profile import Profile
from jobprof.analysis.selection import OPEN, Run, merged, ranges, run_texts
from jobprof.files import handover
from jobprof.plugin.results import Finding, Section
from jobprof.plugin.values import PartSource

if TYPE_CHECKING:
    from jobprof.engine.manager import PluginManager

#: a part of the iteration worth a finding once its share of the run reaches this
PART_SHARE = {"profiler": 0.05, "communication_not_overlapped": 0.15, "free": 0.20, "refresh": 0.30}
#: a rank is a straggler when slower than the ranks' median by this much ...
STRAGGLER_EXCESS = 0.10
#: ... in at least this share of the iterations compared
STRAGGLER_SHARE = 0.5
#: the first iteration is called warm-up when it takes this many medians
WARMUP_FACTOR = 3.0
#: iteration times vary when p95 exceeds the median by this factor
JITTER_FACTOR = 1.5

_ADVICE = {
    "profiler": "jobprof's own hand-over at each iteration end, on the training thread (with task_trace "
    "on, mostly PyTorch's profiler-session swap); task_trace l0 or off, or fewer plugins, lower it",
    "communication_not_overlapped": "collectives the loop waited for with nothing computing; larger "
    "DDP buckets, fewer/larger collectives, or overlapping them with compute would help",
    "free": "time outside forward/backward and the optimizer step (host work between steps: logging, "
    ".item() syncs, checkpointing, zero_grad)",
    "refresh": "the optimizer step; a fused/foreach optimizer or fewer parameter groups would help",
}


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _parts(model: dict[str, Any], stragglers: list[Finding]) -> list[Finding]:
    out = []
    late = {f.evidence["rank"] for f in stragglers}
    for part, threshold in PART_SHARE.items():
        hit = [(r["share"][part], r) for r in model["ranks"] if (r["share"].get(part) or 0) >= threshold]
        if not hit:
            continue
        share, worst = max(hit, key=lambda sr: sr[0])
        mean = worst["breakdown_ms"][part]["mean"]
        iteration = worst["breakdown_ms"]["iteration"]["mean"]
        ranks = sorted(r["rank"] for _, r in hit)
        where = f" on rank {worst['rank']}" if len(model["ranks"]) > 1 else ""
        also = f" (over {threshold:.0%} on ranks {scale.rank_list(ranks)})" if len(ranks) > 1 else ""
        advice = _ADVICE[part]
        if part == "communication_not_overlapped" and late and worst["rank"] not in late:
            advice = (f"most of it is waiting for rank {scale.rank_list(late)} (the slower "
                      "rank, see its finding), so making that rank faster helps most")
        out.append(Finding(
            part, f"{LABELS[part]}: {_pct(share)} of iteration time{where} (mean {mean:.3f} ms of "
            f"{iteration:.3f} ms){also}: {advice}",
            {"rank": worst["rank"], "share": share, "mean_ms": mean, "iteration_mean_ms": iteration,
             "ranks": ranks}, weight=3 if share >= 2 * threshold else 2))
    return out


def _straggler(model: dict[str, Any]) -> list[Finding]:
    cross = model.get("cross_rank")
    if not cross:
        return []
    out = []
    n = cross["iterations_compared"]
    for rank_key in cross["slowest_count"]:
        limit = 1 + STRAGGLER_EXCESS
        # an iteration some ranks lack (processes that ran different loops: a parent and the
        # children it spawned) counts for the ranks that have it
        times = [(e["median_ms"], e["per_rank_ms"].get(rank_key)) for e in cross["per_iteration"]]
        slower = sum(1 for median, ms in times if median > 0 and ms is not None and ms > median * limit)
        excess = cross["median_excess"].get(rank_key)
        if n and slower / n >= STRAGGLER_SHARE and excess is not None:
            what = "time outside collectives" if cross["measure"] == "busy" else "iteration time"
            out.append(Finding(
                "straggler", f"rank {rank_key} is {_pct(excess)} slower than the ranks' median "
                f"({what}, median over iterations) and over {STRAGGLER_EXCESS:.0%} slower in {slower} of {n} "
                "iterations; the other ranks wait for it in collectives",
                {"rank": int(rank_key), "median_excess": excess, "iterations_slower": slower,
                 "iterations_compared": n, "measure": cross["measure"]}, weight=3))
    return out


def _iteration_shape(model: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    jitter: list[Finding] = []
    firsts: dict[int, dict[str, Any]] = {}  # each rank's first row: one pass, not one per rank
    for row in model["iterations"]:
        firsts.setdefault(row["rank"], row)
    for r in model["ranks"]:
        if r["iterations"]["count"] < 4:
            continue
        stats = r["breakdown_ms"]["iteration"]
        first = firsts.get(r["rank"])
        who = f"rank {r['rank']}: " if len(model["ranks"]) > 1 else ""
        # the job's own time: jobprof's part (its start-up, hand-overs) is not the job's warm-up
        job_ms = first["iteration_ms"] - (first.get("profiler_ms") or 0.0) if first else 0.0
        if first and first["iteration"] == 1 and job_ms > WARMUP_FACTOR * stats["median"]:
            out.append(Finding(
                "warmup", f"{who}iteration 1 took {first['iteration_ms']:.3f} ms, "
                f"{first['iteration_ms'] / stats['median']:.1f} times the median ({stats['median']:.3f} ms): "
                "warm-up (first allocations, DataLoader start-up, lazy init); "
                "`--iterations 2-` leaves it out",
                {"rank": r["rank"], "iteration_ms": first["iteration_ms"], "median_ms": stats["median"]}))
        elif stats["p95"] > JITTER_FACTOR * stats["median"]:
            jitter.append(Finding(
                "jitter", f"{who}iteration time varies: p95 {stats['p95']:.3f} ms against a median of "
                f"{stats['median']:.3f} ms; the worst, iteration {stats['worst_iteration']}, took "
                f"{stats['worst']:.3f} ms",
                {"rank": r["rank"], "p95_ms": stats["p95"], "median_ms": stats["median"],
                 "worst_ms": stats["worst"], "worst_iteration": stats["worst_iteration"]}))
    if jitter:  # one finding, for the rank that varies most; the others are listed
        top = max(jitter, key=lambda f: f.evidence["p95_ms"] / f.evidence["median_ms"])
        others = sorted(f.evidence["rank"] for f in jitter if f is not top)
        text = top.text + (f" (ranks {scale.rank_list(others)} vary too)" if others else "")
        out.append(Finding(top.key, text, {**top.evidence, "ranks": sorted([top.evidence["rank"], *others])}))
    return out


def core(model: dict[str, Any]) -> list[Finding]:
    """Findings from the breakdown and the cross-rank comparison."""
    stragglers = _straggler(model)
    found = _parts(model, stragglers) + stragglers + _iteration_shape(model)
    unfinished = [r for r in model["ranks"] if not r["finished"]]
    if unfinished:
        ends = [str(r["iterations"]["last"]) if r["iterations"]["last"] is not None
                else "none (no iteration saved)" for r in unfinished]
        if len(unfinished) > 2:  # many: each end once, with its ranks
            by_end: dict[str, list[int]] = {}
            for r, end in zip(unfinished, ends, strict=True):
                by_end.setdefault(end, []).append(r["rank"])
            ends = [f"{end} (rank {scale.rank_list(rs)})" if len(by_end) > 1 else end
                    for end, rs in by_end.items()]
        ranks = [r["rank"] for r in unfinished]
        found.append(Finding(
            "unfinished", f"rank(s) {scale.rank_list(ranks)} did not finish (no end_info: "
            "killed or crashed); their data ends at iteration " + ", ".join(ends),
            {"ranks": ranks}, weight=2))
    return found


def rank(own: Iterable[Finding], sections: Iterable[Section]) -> list[Finding]:
    """Every finding, per-rank ones grouped across ranks (:func:`grouped`), heaviest first
    (stable within a weight: the core's, then by section; a group where its first finding was);
    the one about jobprof's own time (key ``profiler``) after the job's, as the text prints it."""
    every = list(own) + [f for s in sections for f in s.findings]
    return sorted(grouped(every), key=lambda f: (f.key == "profiler", -f.weight))


#: per-rank findings are grouped when at least this many say the same (1 and 2 rank profiles
#: keep one finding per rank, as they always did)
GROUP_MIN = 3
#: a rank is named as an outlier of its group when its measure is this far (relative) from the
#: representative's (the group's median)
GROUP_OUTLIER = 0.10
#: at most this many outliers are named in a group's text
GROUP_OUTLIERS_SHOWN = 5
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _rank_of(f: Finding) -> int | None:
    r = f.evidence.get("rank")
    return r if type(r) is int else None


def _measure(f: Finding) -> str | None:
    """The finding's own measure: its evidence's first number (not the rank)."""
    return next((k for k, v in f.evidence.items() if k not in ("rank", "count")
                 and isinstance(v, int | float) and not isinstance(v, bool)), None)


def _shown(name: str, value: float) -> str:
    if "share" in name or "excess" in name:
        return _pct(value)
    if name.endswith("_ms"):
        return f"{value:.3f} ms"
    return f"{value:g}"


def grouped(found: Iterable[Finding], at_least: int = GROUP_MIN) -> list[Finding]:
    """Per-rank findings that say the same thing, merged into one finding per group.

    A finding is per rank when its evidence has an int ``rank``.  Findings group when they
    have the same ``key`` and the same text once every number (the rank's included) is blanked
    out, so ``rank 3: 81% of compute task time is in 5 operator type(s) (mm, ...)`` and
    ``rank 7: 79% ...(mm, ...)`` group, while another list of operators, or another verdict, does
    not.  A rank that has two such findings (two DataLoaders) contributes its first to the first
    group, its second to a second one.  Groups of fewer than ``at_least`` findings stay as they
    are (so 1- and 2-rank profiles read as before).

    A group becomes one finding: the text of its representative (the median finding by the
    finding's own measure, its evidence's first number, e.g. ``share``; the lowest rank when it
    has none) with ``rank R`` replaced by the group's ranks (``ranks 0-2, 5 (4 ranks)``), plus
    which rank's numbers the text quotes and the ranks whose measure is more than
    :data:`GROUP_OUTLIER` (relative) from it.  Its evidence: the representative's, plus
    ``ranks``, ``count`` and (when any) ``outliers``; its weight: the group's heaviest.
    """
    found = list(found)
    groups: dict[tuple[str, str, int], list[int]] = {}
    seen: dict[tuple[str, str, int], int] = {}
    for i, f in enumerate(found):
        r = _rank_of(f)
        if r is None:
            continue
        shape = _NUMBER.sub("#", f.text)
        nth = seen.get((f.key, shape, r), 0)
        seen[(f.key, shape, r)] = nth + 1
        groups.setdefault((f.key, shape, nth), []).append(i)
    merged: dict[int, Finding] = {}
    dropped: set[int] = set()
    for members in groups.values():
        if len(members) < at_least:
            continue
        merged[members[0]] = _merge([found[i] for i in members])
        dropped.update(members[1:])
    return [merged.get(i, f) for i, f in enumerate(found) if i not in dropped]


def _merge(group: list[Finding]) -> Finding:
    """One finding for ``group`` (same key and text but numbers, one per rank)."""
    group = sorted(group, key=lambda f: _rank_of(f) or 0)
    ranks = sorted({_rank_of(f) or 0 for f in group})
    measure = _measure(group[0])
    values: dict[int, float] = {}  # the measure of each finding of the group, by its place
    if measure is not None:
        values = {i: v for i, f in enumerate(group)
                  if isinstance(v := f.evidence.get(measure), int | float) and not isinstance(v, bool)}
    if measure is not None and len(values) == len(group):
        ordered = sorted(values, key=lambda i: (values[i], i))
        rep_at = ordered[(len(ordered) - 1) // 2]  # the (lower) median: a real rank's finding
    else:
        measure, rep_at = None, 0
    rep = group[rep_at]
    who = f"ranks {scale.rank_list(ranks)} ({len(ranks)} ranks)"
    mention = re.compile(rf"\brank {_rank_of(rep)}\b")
    if mention.search(rep.text):
        text = mention.sub(who, rep.text, count=1)
        text = text.replace(f"{who} is ", f"{who} are ", 1)
    else:
        text = f"{who}: {rep.text}"
    odd: list[int] = []
    if measure is not None:
        base = values[rep_at]
        odd = sorted((i for i in values if abs(values[i] - base) > GROUP_OUTLIER * abs(base)),
                     key=lambda i: (-abs(values[i] - base), i))
        named = ", ".join(f"rank {_rank_of(group[i])} {_shown(measure, values[i])}"
                          for i in odd[:GROUP_OUTLIERS_SHOWN])
        more = f" and {len(odd) - GROUP_OUTLIERS_SHOWN} more" if len(odd) > GROUP_OUTLIERS_SHOWN else ""
        text += (f" [numbers of rank {_rank_of(rep)}, the median by {measure}; "
                 + (f"{measure} differs by over {GROUP_OUTLIER:.0%} on {named}{more}]" if odd
                    else f"every rank within {GROUP_OUTLIER:.0%} of it]"))
    else:
        text += f" [numbers of rank {_rank_of(rep)}]"
    evidence = {**rep.evidence, "ranks": ranks, "count": len(group)}
    if odd:
        evidence["outliers"] = sorted(_rank_of(group[i]) or 0 for i in odd)
    return Finding(rep.key, text, evidence, weight=max(f.weight for f in group))


def _minus(runs: list[Run], cut: list[Run]) -> list[Run]:
    out = []
    for first, last in runs:
        for a, b in cut:
            if b < first or a > last:
                continue
            if a > first:
                out.append((first, a - 1))
            first = b + 1
            if first > last:
                break
        if first <= last:
            out.append((first, last))
    return out


def _text(runs: list[Run]) -> str:
    return ", ".join(run_texts(runs))


def _recorded(value: Any, low: int, high: int) -> list[Run]:
    """An info.json list of ``[first, last]`` runs, within ``[low, high]``; malformed ones skipped."""
    runs = []
    for run in value if isinstance(value, list) else ():
        if isinstance(run, list) and len(run) == 2 and all(type(n) is int for n in run) \
                and 1 <= run[0] <= run[1] and run[1] >= low and run[0] <= high:
            runs.append((max(run[0], low), min(run[1], high)))
    return merged(runs)


def _lost(profile: Profile, r: dict[str, Any], indices: list[int]) -> list[str]:
    """A rank's selected iterations that have no raw data (aged, or lost) or no rendered files.

    Named from what the process recorded at its end (info.json ``jobprof.aged``) and from what
    is on disk, so a process killed before it could record anything is covered too: numbers
    below the first stored one and between stored ones have no raw data; a stored one without
    its master timeline (the last file rendered for an iteration) was not rendered.
    """
    info = profile.info(r["device"])
    recorded = info.get("jobprof")
    job: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    # a dynamic-mode capture begins where it was asked to, not at iteration 1
    capture = job.get("capture")
    first = capture.get("first") if isinstance(capture, dict) else None
    # an imported trace begins at the step its profiler schedule began at (jobprof import)
    imported = isinstance(job.get("imported"), list)
    if imported and indices:
        first = indices[0]
    low, high = profile.selection.iterations or (first if isinstance(first, int) else 1, OPEN)
    notes = []
    aged = _recorded(job.get("aged"), low, high)
    absent = [(low, indices[0] - 1)] if indices and indices[0] > low else []
    absent += [(a + 1, b - 1) for a, b in itertools.pairwise(indices) if b > a + 1]
    lost = _minus(merged(absent), aged)
    if aged:
        notes.append(f"rank {r['rank']}: iteration(s) {_text(aged)} were deleted by storage ageing "
                     "(storage_limit, or under 20 MB free disk)")
    if lost:
        notes.append(f"rank {r['rank']}: no raw data for iteration(s) {_text(lost)} "
                     + ("(not in the imported traces)" if imported else
                        "(aged out by storage_limit, or lost in a crash)"))
    rendered = profile.rendered(r["device"])
    # from the disk, not from info.json's list: `jobprof export` may have rendered them since
    unrendered = set(indices) - rendered
    if unrendered:
        handed = handover.read(profile.folder(r["device"]))
        if handed is not None and handover.alive(handed.pid):
            notes.append(f"rank {r['rank']}: iteration(s) {', '.join(ranges(unrendered))} are not rendered "
                         f"yet: the job's background exporter (pid {handed.pid}) is rendering them "
                         f"(`jobprof export --wait {profile.path}` waits for it)")
        else:
            died = (f"; the job's background exporter (pid {handed.pid}) stopped before it finished"
                    if handed is not None else "")
            notes.append(f"rank {r['rank']}: iteration(s) {', '.join(ranges(unrendered))} have raw data but "
                         f"were not rendered (no timeline file{died}): run `jobprof export {profile.path}`")
    return notes


def part_sources(manager: PluginManager) -> list[tuple[str, PartSource]]:
    """Which plugin measures which part of the breakdown (``jobprof_breakdown_sources``)."""
    return [(plugin, source) for plugin, found in manager.breakdown_sources() for source in found]


def _disabled(profile: Profile, model: dict[str, Any]) -> list[str]:
    """What stopped working during the run (info.json ``disabled``: a failed plugin, the
    operator capture), one line per thing and reason, naming the ranks."""
    ranks: dict[tuple[str, str], list[int]] = {}
    for r in model["ranks"]:
        for item in (profile.info(r["device"]).get("jobprof") or {}).get("disabled") or ():
            if isinstance(item, dict) and isinstance(item.get("what"), str):
                at = item.get("iteration")
                since = f" from iteration {at}" if isinstance(at, int) and not isinstance(at, bool) else ""
                key = (f"{item['what']} was disabled{since}", str(item.get("reason") or "no reason given"))
                ranks.setdefault(key, []).append(r["rank"])
    notes = []
    for (what, reason), found in ranks.items():
        who = "every rank" if len(found) == len(model["ranks"]) else f"rank(s) {', '.join(map(str, found))}"
        notes.append(f"{what} on {who}: {reason}; its files stop there")
    return notes


def missing(profile: Profile, model: dict[str, Any],
            sources: Iterable[tuple[str, PartSource]] = ()) -> list[str]:
    """What a reader should know is not in this profile (or not in the selection).

    ``sources`` are the plugins' ``(plugin, PartSource)`` claims (:func:`part_sources`): a part
    N/A on a rank is explained by the plugins that measure it (off in the run, or on but
    unseen).
    """
    sources = list(sources)
    notes = []
    world = next((r["world_size"] for r in model["ranks"] if isinstance(r.get("world_size"), int)), None)
    seen = {profile.rank(d) for d in profile.all_devices} if profile.all_devices else set()
    if world and len(seen) < world:
        absent = sorted(set(range(world)) - seen)
        notes.append(f"world size {world} but {len(seen)} rank folder(s): no data for rank(s) "
                     f"{', '.join(map(str, absent))} (not profiled, or on another host's output)")
    if profile.selection.ranks is not None:
        unknown = sorted(profile.selection.ranks - seen)
        if unknown:
            notes.append(f"--rank {', '.join(map(str, unknown))}: no such rank in this profile "
                         f"(ranks: {', '.join(map(str, sorted(seen)))})")
    stored: dict[int, list[int]] = {}
    for row in model.get("iterations") or ():
        stored.setdefault(row["device"], []).append(row["iteration"])
    # one line per kind of problem, naming its ranks (10,000 empty rank folders: two lines)
    empty: list[int] = []
    unfinished: dict[str, list[int]] = {}
    for r in model["ranks"]:
        its = r["iterations"]
        if its["count"] == 0:
            empty.append(r["rank"])
        if not r["finished"]:
            saved = (f"its raw data ends at iteration {its['last']}" if its["last"] is not None
                     else "no iteration's raw data is in the selection" if profile.selection.iterations
                     else "no iteration's raw data was saved")
            unfinished.setdefault(saved, []).append(r["rank"])
        notes += _lost(profile, r, sorted(stored.get(r["device"], [])))
    if empty:
        notes.append(f"{_ranks(empty)}: " + ("no iteration in the selection" if profile.selection.iterations
                                            else "no iteration was recorded"))
    for saved, ranks in unfinished.items():
        notes.append(f"{_ranks(ranks)}: no end_info (the job did not finish); {saved}")
    notes += _disabled(profile, model)
    for part in PARTS:
        claims = [(plugin, s.unseen) for plugin, s in sources if s.part == part]
        if not claims:
            continue
        why: dict[str, list[int]] = {}
        for r in model["ranks"]:
            if r["iterations"]["count"] and r["share"].get(part) is None:
                plugins = (profile.info(r["device"]).get("jobprof") or {}).get("plugins") or []
                reason = "; ".join(f"{source} was on but {unseen}" if source in plugins
                                   else f"{source} was off" for source, unseen in claims)
                why.setdefault(reason, []).append(r["rank"])
        for reason, unknown in why.items():
            who = "every rank" if len(unknown) == len(model["ranks"]) else \
                f"rank(s) {', '.join(map(str, unknown))}"
            notes.append(f"{LABELS[part]} is N/A on {who} ({reason}): that time is counted in "
                         "the phase it fell in")
    return notes


def _ranks(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 2-9, 12``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranges(ranks))}"
