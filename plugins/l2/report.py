"""The L2 section of ``jobprof summary``: where the data came from, or why there is none.

Map/reduce: :func:`rank_facts` reduces one device's raw stream to its totals
(``jobprof_rank_facts``); :func:`l2_sections` reads them back with ``profile.facts`` and reads
no raw record itself.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, OPS_STREAM, Section
from jobprof.plugins.l2.join import CACHE_SOURCES, cupti_hit_rate, hit_rate, ratio_cell
from jobprof.plugins.l2.records import counter_records
from jobprof.plugins.l2.writer import STREAM

if TYPE_CHECKING:
    from jobprof.plugin import Profile


def _about(profile: Profile, device: int) -> dict[str, Any] | None:
    """What info.json says of the device's L2 data, or None when l2 was off or said nothing."""
    if not profile.is_on(device, "l2"):
        return None
    about = profile.info(device).get("jobprof", {}).get("l2")
    return about or None


def _finite(value: float) -> float | str:
    # facts are JSON, which has no NaN or infinity: those travel as their str() and come back
    # through float() (_number), the same value
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's L2 totals, from its raw ``l2`` (counters) or operator (CUPTI) stream:
    ``measured``, the operators (kernels) with a value; with counters, ``accesses`` and
    ``misses`` summed over them; with CUPTI, ``rate_sum``, the sum of the kernels' hit rates.
    None when l2 was off or its data unavailable."""
    about = _about(profile, device)
    if about is None or not about.get("available"):
        return None
    source = about.get("source", "?")
    measured = accesses = misses = 0
    rates: list[float] = []
    for _, streams in profile.streams(device):
        if source == "CUPTI":
            for r in streams.get(OPS_STREAM, ()):
                if r.kind == "kernel":
                    value = cupti_hit_rate(r.extra)
                    if value is not None:
                        rates.append(value)
            continue
        for r in counter_records(streams.get(STREAM, ())):
            measured += 1
            if source in CACHE_SOURCES:
                accesses += r.accesses
                misses += r.misses
    if source == "CUPTI":
        return {"source": source, "measured": len(rates), "rate_sum": _finite(sum(rates)) if rates else None}
    return {"source": source, "measured": measured, "accesses": _finite(accesses), "misses": _finite(misses)}


def l2_sections(profile: Profile) -> list[Section]:
    rows: list[list[Any]] = []
    notes: list[str] = []
    for device in profile.devices:
        about = _about(profile, device)
        if about is None:
            continue
        if not about.get("available"):
            rows.append([device, "unavailable", 0, NA])
            notes.append(f"L2 cache: unavailable: {about.get('reason', 'unknown reason')}")
            continue
        source = about.get("source", "?")
        measured, rate = _measure(profile.facts("l2", device, rank_facts), source)
        rows.append([device, source, measured, rate])
        if source == "software":
            events = ", ".join(about.get("events", []))
            notes.append(f"device {device}: diagnostic software events ({events}), not cache events: "
                         "no hit rate")
        elif source == "CUPTI":
            notes.append(f"device {device}: CUPTI {', '.join(about.get('metrics', []))} per kernel "
                         "(unverified path)")
    if not rows:
        return []
    notes.append("hit rate: counters: hits / accesses summed over every measured operator; CUPTI: the "
                 "mean of the kernels' rates; Victim Rate is N/A (no source counts evictions)")
    return [Section("L2 cache", ["device", "source", "operators measured", "hit rate"], rows, notes,
                    key="l2_cache")]


def _number(value: Any) -> Any:
    # the counts as summed (int counters), or a NaN / infinity _finite kept as str
    return float(value) if isinstance(value, str) else value


def _measure(facts: dict[str, Any] | None, source: str) -> tuple[int, str]:
    """(operators or kernels with a value, overall hit rate cell), from :func:`rank_facts`."""
    if not facts:  # the plugin failed on this device: nothing measured
        return 0, NA
    if source == "CUPTI":
        rate_sum = facts["rate_sum"]
        return facts["measured"], ratio_cell(_number(rate_sum) / facts["measured"]
                                             if rate_sum is not None else None)
    return facts["measured"], ratio_cell(hit_rate(_number(facts["accesses"]), _number(facts["misses"]))) \
        if source in CACHE_SOURCES else NA
