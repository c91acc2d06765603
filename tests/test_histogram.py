"""jobprof.plugin.histogram: quantiles read back from 2% log buckets against the exact ones
(numpy's nearest-rank quantile of the same durations), merged across ranks through JSON."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from jobprof.plugin import histogram as hist


@pytest.mark.parametrize("n", [1, 2, 3, 20, 21, 1000])
def test_quantiles_within_a_bucket_of_the_exact_ones(n):
    rng = random.Random(n)
    values = [rng.lognormvariate(13, 1.5) for _ in range(n)]  # ns: ~0.4 ms, a long tail
    counted: dict[int, int] = {}
    for v in values:
        hist.add(counted, v)
    for q, got in zip((0.5, 0.95), hist.median_p95(counted), strict=True):
        exact = float(np.quantile(values, q, method="inverted_cdf"))  # nearest rank
        assert got == hist.quantile(counted, q)
        assert abs(got / exact - 1) <= 0.0101, (q, got, exact)


def test_ranks_merge_through_json_as_if_counted_together():
    a: dict[int, int] = {}
    b: dict[int, int] = {}
    both: dict[int, int] = {}
    for i in range(1, 200):
        hist.add(a if i % 3 else b, i * 1000.0)
        hist.add(both, i * 1000.0)
    merged: dict[int, int] = {}
    for part in (a, b):
        hist.merge(merged, json.loads(json.dumps(hist.jsonable(part))))  # str keys, as facts hold them
    assert merged == both
    assert hist.median_p95(merged) == hist.median_p95(both)


def test_empty_and_sub_unit_values():
    assert all(math.isnan(v) for v in hist.median_p95({}))
    counted: dict[int, int] = {}
    hist.add(counted, 0.0, count=3)  # below 1: the bucket of 1
    assert hist.median_p95(counted) == (1.0, 1.0)
