"""The aicpu section of ``jobprof summary``: where top-level operator time goes, per device.

Map/reduce: :func:`rank_facts` reduces one device's operator stream to its top operators and
median dispatch share (``jobprof_rank_facts``); :func:`aicpu_sections` reads them back with
``profile.facts`` and reads no raw record itself.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from jobprof.plugin import OPS_STREAM, Finding, OpView, Section
from jobprof.plugin import histogram as hist
from jobprof.plugins.aicpu.split import launching_tops, split

if TYPE_CHECKING:
    from jobprof.plugin import Profile

TOP = 10
#: median per-iteration dispatch share above which the operators are called framework-bound
FRAMEWORK_BOUND_SHARE = 0.5


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}" if whole else "N/A"


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's top-level operators: ``top``, the :data:`TOP` operators with the most total
    time, one ``[name, calls, total ns, compute ns, memcpy ns, host-only calls, median ns, p95 ns]``
    each (quantiles within 1%: 2% buckets), most time first, and ``dispatch_share``, the median
    per-iteration share of dispatch time; None when aicpu was off or no top-level operator ran."""
    if not profile.is_on(device, "aicpu"):
        return None
    # name -> [calls, total, compute, memcpy, host-only calls, {2% bucket: calls}]
    per_op: dict[str, list[Any]] = defaultdict(lambda: [0, 0, 0, 0, 0, {}])
    shares: list[float] = []
    for _, streams in profile.streams(device):
        records = streams.get(OPS_STREAM)
        if not records:
            continue
        view = OpView(records)
        launched = launching_tops(view) if view.has_device else None
        total = dispatch = 0
        for i in view.top:
            s = split(view, i)
            agg = per_op[records[i].name]
            agg[0] += 1
            agg[1] += s.total
            agg[2] += s.compute
            agg[3] += s.memcpy
            agg[4] += launched is not None and i not in launched
            hist.add(agg[5], s.total)
            total += s.total
            dispatch += s.dispatch
        if total:
            shares.append(dispatch / total)
    if not per_op:
        return None
    ranked = sorted(per_op.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP]
    # per device rows: the quantiles themselves, not histograms, keep the facts small
    return {"top": [[name, *values[:5], *map(round, hist.median_p95(values[5]))] for name, values in ranked],
            "dispatch_share": statistics.median(shares) if shares else 0.0}


def aicpu_sections(profile: Profile) -> list[Section]:
    rows: list[list[Any]] = []
    notes: list[str] = []
    findings: list[Finding] = []
    for device in profile.devices:
        facts = profile.facts("aicpu", device, rank_facts)
        if not facts:
            continue
        for name, calls, total, compute, memcpy, host, *spread in facts["top"]:
            median_us, p95_us = (f"{v / 1e3:.3f}" for v in spread) if spread else ("N/A", "N/A")
            rows.append([device, name + (" [host]" if host else ""), calls, f"{total / 1e6:.3f}",
                         f"{total / calls / 1e3:.3f}", median_us, p95_us, _pct(compute, total),
                         _pct(memcpy, total), _pct(total - compute - memcpy, total)])
        median = facts["dispatch_share"]
        if median > FRAMEWORK_BOUND_SHARE:
            who = f"rank {profile.rank(device)}: " if len(profile.devices) > 1 else ""
            findings.append(Finding("framework_bound", f"{who}framework-bound: a median "
                         f"{100 * median:.0f}% of top-level "
                         "operator time per iteration is dispatch (dispatcher, autograd bookkeeping, "
                         "allocation, views), not compute or copies; fewer, larger operators (batching, "
                         "fused ops, torch.compile) would cut it",
                                    {"rank": profile.rank(device), "dispatch_share": median}, weight=2))
        else:
            notes.append(f"device {device}: median dispatch share per iteration {100 * median:.0f}% "
                         "of top-level operator time")
    if not rows:
        return []
    notes.append("shares are time-weighted over every call; median and p95 per call beside the mean "
                 "(within 1%); '[host]': ran on the host without launching device work (CUDA jobs)")
    notes.append("a call here is a top-level operator with everything under it (dispatch included), so its "
                 "times differ from the task durations of Top operators")
    return [Section(f"AI CPU: top {TOP} top-level operators by total time",
                    ["device", "operator", "calls", "total (ms)", "mean (us)", "median (us)", "p95 (us)",
                     "compute %", "memcpy %", "dispatch %"], rows, notes, key="aicpu", findings=findings)]
