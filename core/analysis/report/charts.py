"""The report's charts, from the summary model: the iteration breakdown (stacked bars per rank),
iteration time per rank (lines; the slowest rank drawn bold), and the top operators (bars).

Long runs stay legible and light: a chart shows at most :data:`MAX_BARS` bars or points, each the
mean of as many consecutive iterations as it takes, and its caption says how many that is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence
from html import escape
from typing import Any

from jobprof.analysis.breakdown import LABELS, PARTS
from jobprof.analysis.report.svg import (
    BOTTOM,
    PALETTE,
    TOP,
    Frame,
    index_ticks,
    legend,
    nice_ticks,
    open_svg,
    tick_label,
    x_axis,
    y_axis,
)
from jobprof.plugin.values import STEP_MODE_MODEL_ID

MAX_BARS = 300
#: the breakdown chart's scale stops at this many times the median bar (taller bars are cut)
CUT_AT = 3.0
#: one colour per part of the iteration, in painting order
PART_COLOURS = dict(zip(PARTS, ("#CC79A7", "#E69F00", "#D55E00", "#0072B2", "#009E73", "#999999"),
                        strict=True))


def per_bar(n: int, limit: int = MAX_BARS) -> int:
    """How many consecutive iterations one bar or point stands for."""
    return max(1, math.ceil(n / limit))


def chunks(items: Sequence[Any], limit: int = MAX_BARS) -> list[Sequence[Any]]:
    """``items`` cut into at most ``limit`` runs of equal length (the last may be shorter)."""
    size = per_bar(len(items), limit)
    return [items[i:i + size] for i in range(0, len(items), size)]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _span(group: Sequence[dict[str, Any]]) -> str:
    first, last = group[0]["iteration"], group[-1]["iteration"]
    return f"iteration {first}" if first == last else f"iterations {first}-{last} (mean)"


def _figure(svg: str, caption: str, extra: str = "") -> str:
    return f"<figure>{svg}{extra}<figcaption>{escape(caption)}</figcaption></figure>"


def breakdown(model: dict[str, Any], ranks: Collection[int] | None = None) -> str:
    """Stacked bars of the iteration's parts per iteration: one chart per rank (of ``ranks``;
    None: every rank), one y scale."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in model["iterations"]:
        if ranks is None or row["rank"] in ranks:
            by_rank.setdefault(row["rank"], []).append(row)
    if not by_rank:
        return ""
    # the scale of what is drawn (bars are means when binned), and at most CUT_AT times the
    # median bar: one outlier (the first iteration's warm-up) would flatten the rest; a bar
    # above the scale is cut, marked, and its value written above it
    heights = sorted(_mean([r["iteration_ms"] for r in g]) or 0.0 for rows in by_rank.values()
                     for g in chunks(rows))
    highest, typical = heights[-1], heights[len(heights) // 2]
    y_top = nice_ticks(min(highest, CUT_AT * typical) if typical > 0 else highest)
    limit = y_top[-1]
    known = [p for p in PARTS if any(r[f"{p}_ms"] is not None for rows in by_rank.values() for r in rows)]
    out = [legend([(PART_COLOURS[p], LABELS[p]) for p in known]
                  + [("#ffffff", f"{LABELS[p]}: N/A") for p in PARTS if p not in known])]
    devices = {r["rank"]: r["device"] for r in model["ranks"]}
    for rank, rows in sorted(by_rank.items()):
        frame = Frame(y_top[-1])
        cut_any = False
        groups = chunks(rows)
        slot = frame.plot_w / len(groups)
        width = max(1.0, slot * 0.8)
        svg = [open_svg("breakdown", f"Rank {rank}: where each iteration's time went", frame,
                        f'data-rank="{rank}" data-bars="{len(groups)}"'),
               y_axis(frame, y_top, "time (ms)")]
        for i, group in enumerate(groups):
            x = frame.x(i / len(groups)) + (slot - width) / 2
            base = 0.0
            rects, tips = [], [f"{_span(group)}: {_mean([r['iteration_ms'] for r in group]):.3f} ms"]
            if len(group) == 1 and rank in devices:  # where to look next: the iteration's timeline
                device, index = devices[rank], group[0]["iteration"]
                name = f"msprof_{device}_{STEP_MODE_MODEL_ID}_{index}.json"
                tips.append(f"timeline device_{device}/timeline/{name}")
            for part in known:
                value = _mean([r[f"{part}_ms"] for r in group])
                tips.append(f"{LABELS[part]} {'N/A' if value is None else f'{value:.3f} ms'}")
                if not value or base >= limit:
                    base += value or 0.0
                    continue
                top, bottom = frame.y(min(base + value, limit)), frame.y(base)
                rects.append(f'<rect x="{x:.2f}" y="{top:.2f}" width="{width:.2f}" '
                             f'height="{bottom - top:.2f}" fill="{PART_COLOURS[part]}"/>')
                base += value
            total = _mean([r["iteration_ms"] for r in group]) or 0.0
            cut = total > limit * 1.0001
            if cut:  # cut at the top of the scale: a zig-zag and the value
                cut_any = True
                y0 = frame.y(limit)
                half = width / 2
                rects.append(f'<path class="cut" d="M{x:.2f},{y0 + 4:.2f} l{half:.2f},-4 l{half:.2f},4" '
                             'stroke="#ffffff" stroke-width="2" fill="none"/>'
                             f'<text class="cut-value" x="{x + width / 2:.2f}" y="{y0 - 2:.2f}" '
                             f'text-anchor="middle" font-size="9">{total:.0f}</text>')
            cls = "bar cut" if cut else "bar"
            svg.append(f'<g class="{cls}"><title>{escape("; ".join(tips))}</title>{"".join(rects)}</g>')
        svg.append(x_axis(frame, index_ticks([g[0]["iteration"] for g in groups]), "iteration"))
        svg.append("</svg>")
        n = per_bar(len(rows))
        caption = (f"Rank {rank}: {len(rows)} iterations, "
                   + ("one bar per iteration" if n == 1 else f"one bar per {n} consecutive iterations (their "
                      f"mean), at most {MAX_BARS} bars") + "; the parts add up to the iteration time.")
        if cut_any:
            caption += (f" The scale stops at {tick_label(limit)} ms ({CUT_AT:g}x the median bar): taller "
                        "bars are cut, their time (ms) written above them and in their tooltip.")
        out.append(_figure("".join(svg), caption))
    return "".join(out)


def _lines(cls: str, title: str, y_label: str, series: dict[int, list[tuple[int, float]]],
           bold: int | None, notes: dict[int, str], labels: dict[int, str] | None = None) -> str:
    """One line per rank (or per ``labels`` entry) over the iteration number (each binned to at
    most MAX_BARS points)."""
    points = [p for s in series.values() for p in s]
    if not points:
        return ""
    binned = {rank: [(statistics.fmean(i for i, _ in g), statistics.fmean(v for _, v in g))
                     for g in chunks(values)] for rank, values in series.items()}
    ticks = nice_ticks(max(v for xy in binned.values() for _, v in xy))  # the scale of what is drawn
    frame = Frame(ticks[-1])
    lo, hi = min(i for i, _ in points), max(i for i, _ in points)

    def fx(iteration: float) -> float:
        return frame.x(0.5 if hi == lo else (iteration - lo) / (hi - lo))

    svg = [open_svg(cls, title, frame, f'data-series="{len(series)}"'), y_axis(frame, ticks, y_label)]
    keys = []

    def name(key: int) -> str:
        return labels[key] if labels is not None else f"rank {key}"

    for n, (rank, xy) in enumerate(sorted(binned.items())):
        colour = PALETTE[n % len(PALETTE)]
        coords = " ".join(f"{fx(i):.1f},{frame.y(v):.1f}" for i, v in xy)
        width = 3 if rank == bold else 1.5
        svg.append(f'<polyline class="series" data-rank="{rank}" points="{coords}" fill="none" '
                   f'stroke="{colour}" stroke-width="{width}"><title>{escape(name(rank))}</title></polyline>')
        if len(xy) == 1:  # a single point draws no line
            cx, cy = fx(xy[0][0]), frame.y(xy[0][1])
            svg.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{colour}"/>')
        keys.append((colour, f"{name(rank)}{notes.get(rank, '')}"))
    step = max(1, math.ceil((hi - lo + 1) / 10))
    svg.append(x_axis(frame, [((i - lo) / (hi - lo) if hi > lo else 0.5, str(i))
                              for i in range(lo, hi + 1, step)], "iteration"))
    svg.append("</svg>")
    n = per_bar(max(len(s) for s in series.values()))
    caption = (f"{title}: " + ("one point per iteration" if n == 1 else
                               f"one point per {n} consecutive iterations (their mean), at most {MAX_BARS}")
               + (f"; rank {bold}, the slowest most often, is drawn bold." if bold is not None else "."))
    return _figure("".join(svg), caption, legend(keys))


def rank_times(model: dict[str, Any], ranks: Collection[int] | None = None) -> str:
    """Iteration time per rank (of ``ranks``; None: every rank) and, across ranks, the time outside
    collectives where stragglers show."""
    series: dict[int, list[tuple[int, float]]] = {}
    for row in model["iterations"]:
        if ranks is None or row["rank"] in ranks:
            series.setdefault(row["rank"], []).append((row["iteration"], row["iteration_ms"]))
    cross = model.get("cross_rank")
    bold, notes = None, {}
    if cross:
        counts = {int(r): n for r, n in cross["slowest_count"].items()}
        bold = max(counts, key=lambda r: (counts[r], -r))
        notes = {r: f" (slowest in {n} of {cross['iterations_compared']})" for r, n in counts.items()}
    out = [_lines("rank-times", "Iteration time per rank", "iteration time (ms)", series, bold, notes)]
    if cross and cross["measure"] == "busy":
        busy: dict[int, list[tuple[int, float]]] = {}
        for entry in cross["per_iteration"]:
            for rank, ms in entry["per_rank_ms"].items():
                if ranks is None or int(rank) in ranks:
                    busy.setdefault(int(rank), []).append((entry["iteration"], ms))
        out.append(_lines("rank-busy", "Time outside collectives per rank (what the others wait for)",
                          "time outside collectives (ms)", busy, bold, notes))
    return "".join(out)


def top_operators(section: dict[str, Any]) -> str:
    """Horizontal bars of each device's top operator types by total time (``sections.top_operators``)."""
    columns = section["columns"]
    if not {"device", "op_type", "total_ms"} <= set(columns):
        return ""
    at = {c: columns.index(c) for c in columns}
    by_device: dict[Any, list[Sequence[Any]]] = {}
    for row in section["rows"]:
        if isinstance(row[at["total_ms"]], int | float):
            by_device.setdefault(row[at["device"]], []).append(row)
    out = []
    for device, rows in by_device.items():
        rows = sorted(rows, key=lambda r: -r[at["total_ms"]])
        ticks = nice_ticks(max(r[at["total_ms"]] for r in rows))
        bar_h = 20
        frame = Frame(ticks[-1], height=TOP + BOTTOM + bar_h * len(rows), left=220, right=80)
        svg = [open_svg("top-operators", f"Device {device}: top operator types by total time", frame,
                        f'data-device="{escape(str(device))}" data-bars="{len(rows)}"')]
        base = TOP + frame.plot_h
        for t in ticks:  # the x axis carries the values here
            x = frame.x(t / ticks[-1])
            svg.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{base}"/>')
        for i, row in enumerate(rows):
            y = TOP + i * bar_h
            value = row[at["total_ms"]]
            label = str(row[at["op_type"]])
            if "core_type" in at:
                label += f" ({row[at['core_type']]})"
            comm = "core_type" in at and row[at["core_type"]] == "COMMUNICATION"
            colour = PALETTE[1] if comm else PALETTE[0]
            w = frame.plot_w * value / ticks[-1]
            svg.append(f'<g class="bar"><title>{escape(label)}: {value} ms</title>'
                       f'<text class="tick" x="{frame.left - 6}" y="{y + 14}" text-anchor="end">'
                       f"{escape(label[:34])}</text>"
                       f'<rect x="{frame.left}" y="{y + 3}" width="{max(w, 0.5):.2f}" height="{bar_h - 6}" '
                       f'fill="{colour}"/><text class="value" x="{frame.left + w + 4:.1f}" y="{y + 14}">'
                       f"{value}</text></g>")
        svg.append(x_axis(frame, [(t / ticks[-1], f"{t:g}") for t in ticks], "total time (ms)"))
        svg.append("</svg>")
        out.append(_figure("".join(svg), f"Device {device}: the {len(rows)} operator types with the most "
                           "total time (communication in orange); the table below has the counts and means."))
    return "".join(out)


def section_lines(section: dict[str, Any]) -> str:
    """A plugin section's ``chart`` columns as lines over its first column (an iteration)."""
    columns = section["columns"]
    wanted = [c for c in section.get("chart") or () if c in columns]
    series: dict[int, list[tuple[int, float]]] = {}
    labels: dict[int, str] = {}
    for n, column in enumerate(wanted):
        j = columns.index(column)
        points = [(row[0], row[j]) for row in section["rows"]
                  if isinstance(row[0], int) and isinstance(row[j], int | float)]
        if points:
            series[n], labels[n] = points, section["headers"][j]
    if not series:
        return ""
    return _lines("section-lines", section["title"], section["title"].rpartition("(")[2].rstrip(")") or "",
                  series, None, {}, labels)
