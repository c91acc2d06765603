"""What the recorded-trace tests compute from a Kineto trace themselves, independently of jobprof
(test_cuda_recorded, test_import, test_import_hta): one copy each."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def union(spans: Iterable[tuple[float, float]]) -> float:
    """The length covered by ``spans`` (overlaps counted once)."""
    total, end = 0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def launch_outcomes(trace: Mapping[str, Any],
                    counts: Callable[[int], bool] = lambda _corr: True) -> dict[str, set[bool]]:
    """Per operator name (``cpu_op``), whether its calls launched device work: a runtime /
    driver call (whose correlation ``counts``) inside the call's span on its thread.  A name
    with ``False`` had a call that launched nothing."""
    launches: dict[Any, list[float]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("cat") in LAUNCH_CATS and counts(e["args"]["correlation"]):
            launches[e["tid"]].append(e["ts"])
    for times in launches.values():
        times.sort()
    outcomes: dict[str, set[bool]] = defaultdict(set)
    for e in trace["traceEvents"]:
        if e.get("cat") == "cpu_op":
            times = launches[e["tid"]]
            at = bisect_left(times, e["ts"])
            outcomes[e["name"]].add(at < len(times) and times[at] <= e["ts"] + e["dur"])
    return outcomes


def check_host_marks(rows: Iterable[Mapping[str, str]], outcomes: Mapping[str, set[bool]]) -> tuple[int, int]:
    """aicpu's rows against :func:`launch_outcomes`: a ``[host]`` operator had a call that
    launched nothing, any other one a call that launched device work.  (marked, unmarked)."""
    marked = unmarked = 0
    for r in rows:
        name = r["Node"].removesuffix(" [host]")
        assert outcomes[name], name
        if r["Node"].endswith(" [host]"):
            marked += 1
            assert False in outcomes[name], name  # some call of it launched nothing
        else:
            unmarked += 1
            assert True in outcomes[name], name
    return marked, unmarked
