"""The four numbers every per-iteration series gets: mean, median, p95 and the worst."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile (a value that occurred, as in most profilers)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def describe(values: Sequence[float | None], index: Sequence[int]) -> dict[str, float | int | None]:
    """``{"mean", "median", "p95", "worst", "worst_iteration"}`` over the known values (ms)."""
    known = [(v, i) for v, i in zip(values, index, strict=True) if v is not None]
    if not known:
        return {"mean": None, "median": None, "p95": None, "worst": None, "worst_iteration": None}
    vals = [v for v, _ in known]
    worst, at = max(known, key=lambda vi: (vi[0], -vi[1]))
    return {"mean": statistics.fmean(vals), "median": statistics.median(vals), "p95": p95(vals),
            "worst": worst, "worst_iteration": at}
