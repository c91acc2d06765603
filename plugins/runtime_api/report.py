"""runtime_api's part of ``jobprof summary`` / ``report``: the API table and synchronising calls.

Map/reduce: :func:`iteration_digest` (``jobprof_iteration_facts``) reduces one iteration's API
calls to per-API totals and its synchronising calls grouped by (API, why, operator, Python
frame); :func:`rank_facts` adds a device's digests up; :func:`sections` reads them back.

Finding ``runtime_api_sync`` (once per rank, where the data has synchronising calls): how many
calls per iteration blocked the host until the device finished, the host time blocked in them
(per iteration and as a share of the iterations' time), and the call site that blocked longest:
its API, the operator that made the call and the Python frame where the trace has one.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, OPS_STREAM, Finding, OpView, Section
from jobprof.plugins.runtime_api.calls import ApiCall, calls, has_calls
from jobprof.plugins.runtime_api.writer import statistics as per_api

if TYPE_CHECKING:
    from jobprof.plugin import Iteration, Profile

NAME = "runtime_api"
TOP = 10
#: synchronising call sites listed per rank
TOP_SYNC = 10
#: share of the iterations' time blocked in synchronising calls from which the finding weighs more
BLOCKED_SHARE = 0.05


def blocked_ns(found: list[ApiCall]) -> int:
    """Host time blocked in synchronising calls: the union of their spans per thread (a
    synchronising call inside another, a driver call inside a runtime call, counts once)."""
    total = 0
    by_thread: dict[int, list[tuple[int, int]]] = {}
    for c in found:
        if c.sync is not None:
            by_thread.setdefault(c.tid, []).append((c.start, c.end))
    for spans in by_thread.values():
        end = None
        for a, b in sorted(spans):
            if end is None or a >= end:
                total += b - a
                end = b
            elif b > end:
                total += b - end
                end = b
    return total


def iteration_digest(iteration: Iteration, streams: Mapping[str, list[Any]]) -> dict[str, Any] | None:
    """One iteration's API calls in a few numbers: ``apis``, ``[level, name, count, total ns,
    min ns, max ns]`` per API; ``sync``, ``[name, why, operator, frame, count, total ns, max
    ns]`` per synchronising call site; ``blocked`` ns (:func:`blocked_ns`); ``wall`` ns (the
    iteration's span).  None for an iteration without API calls."""
    ops = streams.get(OPS_STREAM) or []
    if not ops or not has_calls(ops):
        return None
    found = calls(OpView(list(ops)))
    sites: dict[tuple[str, str, str | None, str | None], list[int]] = {}
    for c in found:
        if c.sync is None:
            continue
        site = sites.setdefault((c.name, c.sync, c.operator, c.frame), [0, 0, 0])
        site[0] += 1
        site[1] += c.dur
        site[2] = max(site[2], c.dur)
    return {
        "apis": [[s.level, s.name, s.count, s.total, s.least, s.most] for s in per_api(found)],
        "sync": [[*key, *values] for key, values in sorted(sites.items(), key=lambda kv: -kv[1][1])],
        "blocked": blocked_ns(found),
        "wall": max(0, iteration.end_ns - iteration.start_ns),
    }


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """A device's API calls over its iterations: the :data:`TOP` APIs by total time (``top``:
    ``[level, name, count, total, min, max]``), every API's total (``api_ns``) and count
    (``calls``), the :data:`TOP_SYNC` synchronising call sites (``sync``: ``[name, why,
    operator, frame, count, total, max]``), per-iteration synchronising calls and blocked ns
    (``per_iteration``: ``[index, calls, blocked ns, wall ns]``); None when runtime_api was off
    or no API call was recorded."""
    if not profile.is_on(device, NAME):
        return None
    apis: dict[tuple[str, str], list[int]] = {}
    sites: dict[tuple[Any, ...], list[int]] = {}
    per_iteration: list[list[int]] = []
    for index, d in profile.iteration_facts(NAME, device, iteration_digest):
        for level, name, count, total, least, most in d.get("apis") or []:
            agg = apis.get((level, name))
            if agg is None:
                apis[(level, name)] = [count, total, least, most]
            else:
                agg[0] += count
                agg[1] += total
                agg[2] = min(agg[2], least)
                agg[3] = max(agg[3], most)
        sync_calls = 0
        for *key, count, total, most in d.get("sync") or []:
            site = sites.setdefault(tuple(key), [0, 0, 0])
            site[0] += count
            site[1] += total
            site[2] = max(site[2], most)
            sync_calls += count
        per_iteration.append([index, sync_calls, d.get("blocked", 0), d.get("wall", 0)])
    if not apis:
        return None
    ranked = sorted(apis.items(), key=lambda kv: (-kv[1][1], kv[0]))
    return {
        "top": [[level, name, *values] for (level, name), values in ranked[:TOP]],
        "apis": len(apis),
        "calls": sum(v[0] for v in apis.values()),
        "api_ns": sum(v[1] for v in apis.values()),
        "sync": [[*key, *values] for key, values in
                 sorted(sites.items(), key=lambda kv: (-kv[1][1], str(kv[0])))[:TOP_SYNC]],
        "per_iteration": per_iteration,
    }


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _us(ns: float) -> str:
    return f"{ns / 1e3:.3f}"


def sections(profile: Profile) -> list[Section]:
    table: list[list[Any]] = []
    sync_rows: list[list[Any]] = []
    findings: list[Finding] = []
    many = len(profile.devices) > 1
    for device in profile.devices:
        facts = profile.facts(NAME, device, rank_facts)
        if not facts:
            continue
        rank = profile.rank(device)
        iterations = max(1, len(facts["per_iteration"]))
        for level, name, count, total, least, most in facts["top"]:
            share = f"{100 * total / facts['api_ns']:.1f}" if facts["api_ns"] else NA
            table.append([device, level, name, count, _ms(total), _us(total / count), _us(least), _us(most),
                          share])
        for name, why, operator, frame, count, total, most in facts["sync"]:
            sync_rows.append([device, name, why, operator or NA, frame or NA, count,
                              f"{count / iterations:.2f}", _ms(total), _us(most)])
        finding = _sync_finding(f"rank {rank}: " if many else "", rank, facts)
        if finding is not None:
            findings.append(finding)
    if not table:
        return []
    out = [Section(f"Runtime API: top {TOP} APIs by total host time",
                   ["device", "level", "API", "calls", "total (ms)", "mean (us)", "min (us)", "max (us)",
                    "% of API time"], table,
                   ["every CUDA runtime (level runtime) and driver (level driver) call Kineto recorded in "
                    "the iterations (HIP's on ROCm), its host time; per iteration in api_statistic_*.csv"],
                   key="runtime_api", findings=findings)]
    if sync_rows:
        out.append(Section(f"Runtime API: synchronising calls (top {TOP_SYNC} call sites by blocked time)",
                           ["device", "API", "why", "operator", "Python frame", "calls", "per iteration",
                            "blocked (ms)", "max (us)"], sync_rows,
                           ["blocked: the host time of the call, during which the calling thread waited for "
                            "the device; operator: the innermost dispatcher operator around the call "
                            "(N/A: none); Python frame: N/A where the trace has no python_function events "
                            "(torch.profiler's with_stack)"],
                           key="runtime_api_sync"))
    return out


def _sync_finding(who: str, rank: int, facts: dict[str, Any]) -> Finding | None:
    series = facts["per_iteration"]
    if not facts["sync"] or not series:
        return None
    # the facts' rows: [iteration, sync calls, blocked ns, wall ns]
    counts = [calls for _, calls, _, _ in series]
    blocked = [ns for _, _, ns, _ in series]
    wall = sum(wall_ns for _, _, _, wall_ns in series)
    share = sum(blocked) / wall if wall else None
    name, why, operator, frame, count, total, _most = facts["sync"][0]
    caller = f"by {operator}" if operator else "outside every operator"
    text = (f"{who}{statistics.median(counts):g} synchronising API call(s) per iteration (median over "
            f"{len(series)} iteration(s)) blocked the host for {_ms(statistics.median(blocked))} ms per "
            "iteration"
            + (f" ({100 * share:.1f}% of the iterations' time)" if share is not None else "")
            + f"; the longest: {name} ({why}) called {caller}"
            + (f" at {frame}" if frame else " (Python frame N/A)")
            + f", {count} call(s), {_ms(total)} ms in all. Each waits for the device to finish queued work "
              "(.item(), .cpu(), printing a CUDA tensor, explicit synchronize); moving it out of the step "
              "or deferring it lets the host queue ahead")
    evidence = {"rank": rank, "sync_calls_median": statistics.median(counts),
                "blocked_ns_median": statistics.median(blocked), "blocked_ns_total": sum(blocked),
                "blocked_share": share, "api": name, "why": why, "operator": operator, "frame": frame,
                "calls": count, "blocked_ns": total}
    return Finding("runtime_api_sync", text, evidence,
                   weight=2 if share is not None and share >= BLOCKED_SHARE else 1)
