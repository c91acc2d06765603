"""The L2 section of ``jobprof summary``: where the data came from, or why there is none."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobprof.ops.opcapture import EXTRA, KIND
from jobprof.ops.opcapture import STREAM as OPS_STREAM
from jobprof.plugin.types import NA, Section
from jobprof.plugins.l2.join import CACHE_SOURCES, R_VALUES, cupti_hit_rate, hit_rate, ratio_cell
from jobprof.plugins.l2.writer import STREAM

if TYPE_CHECKING:
    from jobprof.analysis.profile import Profile


def l2_sections(profile: Profile) -> list[Section]:
    rows: list[list[Any]] = []
    notes: list[str] = []
    for device in profile.devices:
        jobprof = profile.info(device).get("jobprof", {})
        if jobprof.get("options", {}).get("l2") in (None, "", "off"):
            continue
        about = jobprof.get("l2")
        if not about:
            continue
        if not about.get("available"):
            rows.append([device, "unavailable", 0, NA])
            notes.append(f"L2 cache: unavailable: {about.get('reason', 'unknown reason')}")
            continue
        source = about.get("source", "?")
        measured, rate = _measure(profile, device, source)
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


def _measure(profile: Profile, device: int, source: str) -> tuple[int, str]:
    """(operators or kernels with a value, overall hit rate cell)."""
    measured = accesses = misses = 0
    rates: list[float] = []
    for _, streams in profile.streams(device):
        if source == "CUPTI":
            for r in streams.get(OPS_STREAM, ()):
                if r[KIND] == "kernel":
                    value = cupti_hit_rate(r[EXTRA])
                    if value is not None:
                        rates.append(value)
            continue
        for r in streams.get(STREAM, ()):
            measured += 1
            if source in CACHE_SOURCES:
                accesses += r[R_VALUES]
                misses += r[R_VALUES + 1]
    if source == "CUPTI":
        return len(rates), ratio_cell(sum(rates) / len(rates) if rates else None)
    return measured, ratio_cell(hit_rate(accesses, misses)) if source in CACHE_SOURCES else NA
