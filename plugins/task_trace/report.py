"""The "Top operators" section of ``jobprof summary``: where each device's task time went.

Read from the op_statistic files (one per iteration, already grouped), so the summary costs a
few small CSV reads however many operators ran.  Iterations whose files were not rendered
(a killed job before ``jobprof export``) are not counted; the note says how many were.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from jobprof.types import Section

TOP = 15


def _groups(summary: Path) -> tuple[dict[tuple[str, str], list[float]], int]:
    """{(OP Type, Core Type): [count, total µs]} over every op_statistic file, and the file count."""
    groups: dict[tuple[str, str], list[float]] = {}
    files = 0
    for path in sorted(summary.glob("op_statistic_*.csv")):
        try:
            with open(path, newline="") as handle:
                rows = list(csv.DictReader(handle))
        except OSError:
            continue
        files += 1
        for row in rows:
            try:
                count, total = int(row["Count"]), float(row["Total Time(us)"])
            except (KeyError, TypeError, ValueError):
                continue
            g = groups.setdefault((row["OP Type"], row["Core Type"]), [0, 0.0])
            g[0] += count
            g[1] += total
    return groups, files


def top_sections(profile: Any) -> list[Section]:
    rows, notes = [], []
    for device in profile.devices:
        groups, files = _groups(Path(profile.path) / f"device_{device}" / "summary")
        if not groups:
            continue
        grand = sum(g[1] for g in groups.values())
        ranked = sorted(groups.items(), key=lambda item: (-item[1][1], item[0]))
        for (op, core), (count, total) in ranked[:TOP]:
            share = f"{100 * total / grand:.1f}" if grand else "N/A"
            rows.append([device, op, core, int(count), f"{total / 1000:.3f}", f"{total / count:.3f}", share])
        iterations = len(profile.iterations(device))
        if files < iterations:
            notes.append(f"device {device}: {iterations - files} of {iterations} iterations have no "
                         "op_statistic file yet (run `jobprof export`)")
        if len(ranked) > TOP and grand:
            notes.append(f"device {device}: {len(ranked) - TOP} more operator types, "
                         f"{100 * sum(g[1] for _, g in ranked[TOP:]) / grand:.1f}% of task time")
    if not rows:
        return []
    return [Section(f"Top operators (top {TOP} per device, all iterations)",
                    ["device", "OP Type", "Core Type", "count", "total ms", "mean µs", "% of task time"],
                    rows, notes)]
