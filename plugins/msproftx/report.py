"""The markers section of ``jobprof summary``: where the user-defined ranges spent their time."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from jobprof.plugin import PROFILER_STREAM, Section, TxRecord
from jobprof.plugin import histogram as hist

if TYPE_CHECKING:
    from jobprof.plugin import Profile

TOP = 15
WIDTH = 60  # messages may be 255 bytes: keep the table readable


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's ranges and markers: ``ranges``, one ``[message, domain, count, total ns,
    {bucket: count}]`` per (message, domain) in the order first seen (durations less jobprof's own
    time inside them: ``own_ns`` in all, over ``own_ranges`` ranges), and ``marks``, how many
    markers; None without either."""
    totals: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, defaultdict(int)])
    marks = 0
    own = _Own(profile.records(PROFILER_STREAM, device))
    own_ns = own_ranges = 0
    for _, _, record in profile.typed(TxRecord, device):
        if record.is_marker:
            marks += 1
            continue
        entry = totals[(record.message, record.domain or "")]
        inside = own.inside(record.start_ns, record.end_ns)
        if inside:
            own_ns += inside
            own_ranges += 1
        ns = record.end_ns - record.start_ns - inside
        entry[0] += 1
        entry[1] += ns
        hist.add(entry[2], ns)
    if not totals and not marks:
        return None
    return {"ranges": [[message, domain, count, ns, hist.jsonable(histogram)]
                       for (message, domain), (count, ns, histogram) in totals.items()],
            "marks": marks, "own_ns": own_ns, "own_ranges": own_ranges}


class _Own:
    """jobprof's own spans on the device (the core's ``profiler`` stream: the hand-over at each
    iteration end), to take out of the user's ranges that enclose one: a range around
    ``optimizer.step()`` holds the iteration end, and with it jobprof's time, which the job
    unprofiled would not have spent."""

    def __init__(self, spans: Iterable[Any]) -> None:
        # the stream's records are [start_ns, end_ns] pairs (jobprof.plugin.PROFILER_STREAM)
        pairs = sorted((int(start), int(end)) for start, end, *_ in
                       (s for s in spans if isinstance(s, (list, tuple)) and len(s) >= 2))
        self.starts = [a for a, _ in pairs]
        self.pairs = pairs

    def inside(self, start: int, end: int) -> int:
        """ns of jobprof's own spans within ``[start, end)``."""
        total = 0
        for a, b in self.pairs[max(0, bisect.bisect_right(self.starts, start) - 1):]:
            if a >= end:
                break
            total += max(0, min(b, end) - max(a, start))
        return total


def marker_sections(profile: Profile) -> list[Section]:
    # across every rank: devices in order, each one's ranges in the order first seen, as one
    # pass over the records would meet them (so ties rank the same)
    totals: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, defaultdict(int)])
    marks = own_ns = own_ranges = 0
    for device in profile.devices:
        facts = profile.facts("msproftx", device, rank_facts)
        if not facts:
            continue
        marks += facts["marks"]
        own_ns += facts.get("own_ns", 0)
        own_ranges += facts.get("own_ranges", 0)
        for message, domain, count, ns, *histogram in facts["ranges"]:
            entry = totals[(message, domain)]
            entry[0] += count
            entry[1] += ns
            hist.merge(entry[2], histogram[0] if histogram else {})
    if not totals and not marks:
        return []
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    short = lambda text: text if len(text) <= WIDTH else text[:WIDTH - 3] + "..."  # noqa: E731

    def spread(histogram: dict[int, int], count: int) -> list[str]:
        if sum(histogram.values()) != count:  # a facts file written before histograms: unknown
            return ["N/A", "N/A"]
        # durations kept in 2% log buckets (jobprof.plugin.histogram): ns -> ms
        return [f"{q / 1e6:.3f}" for q in hist.median_p95(histogram)]

    rows = [[short(message), domain, count, f"{ns / 1e6:.3f}", f"{ns / count / 1e6:.3f}",
             *spread(histogram, count)]
            for (message, domain), (count, ns, histogram) in ranked[:TOP]]
    notes = [f"{marks} marker(s) (instants) not shown"] if marks else []
    if len(ranked) > TOP:
        notes.append(f"{len(ranked) - TOP} more range name(s) in the msprof_tx files")
    notes.append("nested ranges are counted in full in each level, so totals may exceed the run")
    notes.append("median and p95 beside the mean: a first call's warm-up moves the mean alone "
                 "(within 1%: durations kept in 2% buckets)")
    if own_ns:
        notes.append(f"jobprof's own time taken out of {own_ranges} range(s) that enclosed an iteration "
                     f"end ({own_ns / 1e6:.3f} ms in all, its hand-over: not the job's); the msprof_tx files "
                     "keep the wall durations")
    return [Section("Markers (msproftx): top ranges by total time",
                    ["message", "domain", "count", "total ms", "mean ms", "median ms", "p95 ms"], rows, notes,
                    key="markers")]
