"""The step-trace section of ``jobprof summary``: iteration-time breakdown per device."""

from __future__ import annotations

import statistics
from typing import Any

from jobprof.types import Section


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) / 1e6:.3f}" if values else "N/A"


def step_sections(profile: Any) -> list[Section]:
    rows = []
    for device in profile.devices:
        its = {it.index: it for it in profile.iterations(device)}
        if not its:
            continue
        points = {r["_iteration"]: r for r in profile.records("training_trace", device)}
        times, fpbp, refresh, bound = [], [], [], []
        for index, it in its.items():
            times.append(it.end_ns - it.start_ns)
            rec = points.get(index, {})
            fp, bp = rec.get("fp_start", it.fp_start_ns), rec.get("bp_end", it.bp_end_ns)
            if fp is not None and bp is not None:
                fpbp.append(bp - fp)
            if bp is not None:
                refresh.append(it.end_ns - bp)
            if index > 1 and fp is not None:
                bound.append(fp - it.start_ns)
        method = profile.info(device).get("jobprof", {}).get("iteration_method") or "N/A"
        rows.append([device, len(its), method, _ms(times), _ms(fpbp), _ms(refresh), _ms(bound),
                     "yes" if profile.finished(device) else "no (killed?)"])
    if not rows:
        return []
    return [Section("Step trace (median per iteration, ms)",
                    ["device", "iterations", "found by", "iteration", "FP to BP", "refresh",
                     "data aug bound", "finished"], rows)]
