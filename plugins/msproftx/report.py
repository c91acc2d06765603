"""The markers section of ``jobprof summary``: where the user-defined ranges spent their time."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from jobprof.plugin import Section, TxRecord
from jobprof.plugin import histogram as hist

if TYPE_CHECKING:
    from jobprof.plugin import Profile

TOP = 15
WIDTH = 60  # messages may be 255 bytes: keep the table readable


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's ranges and markers: ``ranges``, one ``[message, domain, count, total ns,
    {bucket: count}]`` per (message, domain) in the order first seen, and ``marks``, how many
    markers; None without either."""
    totals: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, defaultdict(int)])
    marks = 0
    for _, _, record in profile.typed(TxRecord, device):
        if record.is_marker:
            marks += 1
            continue
        entry = totals[(record.message, record.domain or "")]
        entry[0] += 1
        entry[1] += record.end_ns - record.start_ns
        hist.add(entry[2], record.end_ns - record.start_ns)
    if not totals and not marks:
        return None
    return {"ranges": [[message, domain, count, ns, hist.jsonable(histogram)]
                       for (message, domain), (count, ns, histogram) in totals.items()],
            "marks": marks}


def marker_sections(profile: Profile) -> list[Section]:
    # across every rank: devices in order, each one's ranges in the order first seen, as one
    # pass over the records would meet them (so ties rank the same)
    totals: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, defaultdict(int)])
    marks = 0
    for device in profile.devices:
        facts = profile.facts("msproftx", device, rank_facts)
        if not facts:
            continue
        marks += facts["marks"]
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
        return [f"{hist.quantile(histogram, 0.5) / 1e6:.3f}", f"{hist.quantile(histogram, 0.95) / 1e6:.3f}"]

    rows = [[short(message), domain, count, f"{ns / 1e6:.3f}", f"{ns / count / 1e6:.3f}",
             *spread(histogram, count)]
            for (message, domain), (count, ns, histogram) in ranked[:TOP]]
    notes = [f"{marks} marker(s) (instants) not shown"] if marks else []
    if len(ranked) > TOP:
        notes.append(f"{len(ranked) - TOP} more range name(s) in the msprof_tx files")
    notes.append("nested ranges are counted in full in each level, so totals may exceed the run")
    notes.append("median and p95 beside the mean: a first call's warm-up moves the mean alone "
                 "(within 1%: durations kept in 2% buckets)")
    return [Section("Markers (msproftx): top ranges by total time",
                    ["message", "domain", "count", "total ms", "mean ms", "median ms", "p95 ms"], rows, notes,
                    key="markers")]
