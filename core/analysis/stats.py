"""The four numbers every per-iteration series gets (mean, median, p95 and the worst), and the
confidence interval of a median that ``jobprof diff`` shows as a row's noise."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile (a value that occurred, as in most profilers)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


#: above this many values the median's interval uses the normal approximation of the binomial
_EXACT_UP_TO = 400


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median: ``(x_(j), x_(n-j+1))`` of the sorted
    values, with the largest ``j`` whose coverage ``1 - 2 P(Bin(n, 1/2) < j)`` is at least
    ``confidence`` (exact up to 400 values, the normal approximation above).  None when there are
    too few values for any such interval (fewer than 6 at 95%).  It assumes the values are
    independent draws (iterations of a steady loop), which a warm-up or a drift breaks."""
    n = len(values)
    tail = (1 - confidence) / 2
    if n <= _EXACT_UP_TO:
        j, below = 0, 0.0  # below: P(Bin(n, 1/2) <= j - 1)
        while True:
            nxt = below + math.comb(n, j) / 2 ** n
            if nxt > tail:
                break
            below, j = nxt, j + 1
        if j < 1:
            return None
    else:
        z = statistics.NormalDist().inv_cdf(1 - tail)
        j = max(1, math.floor((n - z * math.sqrt(n)) / 2))
    ordered = sorted(values)
    return ordered[j - 1], ordered[n - j]


def describe(values: Sequence[float | None], index: Sequence[int]) -> dict[str, float | int | None]:
    """``{"mean", "median", "p95", "worst", "worst_iteration"}`` over the known values (ms)."""
    known = [(v, i) for v, i in zip(values, index, strict=True) if v is not None]
    if not known:
        return {"mean": None, "median": None, "p95": None, "worst": None, "worst_iteration": None}
    vals = [v for v, _ in known]
    worst, at = max(known, key=lambda vi: (vi[0], -vi[1]))
    return {"mean": statistics.fmean(vals), "median": statistics.median(vals), "p95": p95(vals),
            "worst": worst, "worst_iteration": at}
