"""Durations kept as counts per logarithmic bucket (each 2% wide), for medians and p95s that
merge across iterations and ranks.

A plugin's ``jobprof_rank_facts`` keeps ``{bucket: count}`` per key instead of every duration:
memory is bounded by the range of the durations, not their number (a range ended once per
iteration of a long run, an operator called a million times), and two ranks' histograms add up
key by key.  A quantile read back is the centre of its bucket: within 1% of the true one.

    hist: dict[int, int] = {}
    add(hist, 1_250_000)                  # one duration (any unit, here ns)
    quantile(hist, 0.95) / 1e6            # the p95, in ms
    median_p95(hist)                      # both, as report sections show them
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: the width of a bucket: a factor of 1.02
BUCKET = math.log(1.02)


def bucket(value: float) -> int:
    """The bucket of a duration (values below 1 share the bucket of 1)."""
    return round(math.log(max(value, 1)) / BUCKET)


def add(histogram: dict[int, int], value: float, count: int = 1) -> None:
    """Count ``value`` in ``histogram``."""
    key = bucket(value)
    histogram[key] = histogram.get(key, 0) + count


def merge(into: dict[int, int], other: Mapping[Any, int]) -> None:
    """Add ``other``'s counts to ``into``; ``other``'s keys may be the str a JSON facts file
    gives back."""
    for key, n in other.items():
        k = int(key)
        into[k] = into.get(k, 0) + n


def quantiles(histogram: Mapping[int, int], *qs: float) -> tuple[float, ...]:
    """The nearest-rank quantiles ``qs`` (each 0-1, ascending) of the counted values, each as its
    bucket's centre (the values' unit), in one pass over the sorted buckets; NaNs for an empty
    histogram."""
    total = sum(histogram.values())
    if not total:
        return tuple(math.nan for _ in qs)
    ranks = [max(1, math.ceil(q * total)) for q in qs]
    found: list[float] = []
    seen = 0
    for key in sorted(histogram):
        seen += histogram[key]
        while len(found) < len(ranks) and seen >= ranks[len(found)]:
            found.append(math.exp(key * BUCKET))
        if len(found) == len(ranks):
            break
    return tuple(found)


def quantile(histogram: Mapping[int, int], q: float) -> float:
    """The nearest-rank quantile ``q`` (0-1) of the counted values (see :func:`quantiles`)."""
    return quantiles(histogram, q)[0]


def median_p95(histogram: Mapping[int, int]) -> tuple[float, float]:
    """``(quantile(h, 0.5), quantile(h, 0.95))``: what every report section shows of a histogram."""
    median, p95 = quantiles(histogram, 0.5, 0.95)
    return median, p95


def jsonable(histogram: Mapping[int, int]) -> dict[str, int]:
    """The histogram with str keys, as JSON holds it."""
    return {str(k): n for k, n in histogram.items()}
