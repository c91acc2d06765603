"""The report's views of many ranks: a rank x iteration heatmap (iteration time, and time outside
collectives) and a straggler view (how often each rank was the slowest), plus the tables that
replace per-rank tables above :data:`~jobprof.analysis.scale.RANK_TABLE_LIMIT` ranks.

The heatmap stays light at any size: at most :data:`~jobprof.analysis.scale.HEAT_COLUMNS`
columns and :data:`~jobprof.analysis.scale.HEAT_ROWS` rows (each the mean of consecutive
iterations / ranks), drawn as one SVG path per colour level, so 256 ranks x 200 iterations
is a few hundred kB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from html import escape
from typing import Any

from jobprof.analysis import breakdown, scale
from jobprof.analysis.report.fmt import MS, cell, key, num, table
from jobprof.analysis.report.svg import (
    BOTTOM,
    PALETTE,
    TOP,
    Frame,
    index_ticks,
    legend,
    nice_ticks,
    open_svg,
    x_axis,
)

#: the heatmap's colour levels, low to high (viridis: ordered in lightness, colour-blind safe)
LEVELS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58",
          "#b5de2b", "#fde725")
#: a cell with no value
NO_VALUE = "#d0d4da"
#: the colour scale stops at this quantile of the cells, and at most at :data:`CLIP_MEDIANS` times
#: their median (a warm-up iteration must not wash out the rest); cells above take the top colour
CLIP = 0.95
CLIP_MEDIANS = 2.0


def _figure(svg: str, caption: str, extra: str = "") -> str:
    return f"<figure>{svg}{extra}<figcaption>{escape(caption)}</figcaption></figure>"


def _span(first: int, last: int, what: str) -> str:
    return f"{what} {first}" if first == last else f"{what}s {first}-{last}"


def heatmap(model: Mapping[str, Any], cls: str, title: str,
            value: Callable[[Mapping[str, Any]], float | None]) -> str:
    """One rank x iteration heatmap of ``value`` of the model's iteration rows ("" when no cell
    has a value)."""
    grid = scale.heat_grid(model, value)
    known = sorted(v for line in grid["cells"] for v in line if v is not None)
    if not known:
        return ""
    low = known[0]
    high = min(known[scale.nearest(len(known), CLIP)], CLIP_MEDIANS * known[scale.nearest(len(known), 0.5)])
    if high <= low:
        high = known[-1] if known[-1] > low else low + 1.0
    n_rows, n_cols = len(grid["rows"]), len(grid["columns"])
    cell_h = max(2.0, min(14.0, 520 / n_rows))
    frame = Frame(1.0, height=math.ceil(TOP + BOTTOM + n_rows * cell_h), left=72)
    sx, sy = frame.plot_w / n_cols, cell_h

    def level(v: float) -> int:
        return min(len(LEVELS) - 1, max(0, int((v - low) / (high - low) * len(LEVELS))))

    def colour(v: float | None) -> str:
        return NO_VALUE if v is None else LEVELS[level(v)]

    # each run of one colour along a row is a horizontal stroke one row thick, the runs of a colour
    # in a row one sub-path of relative moves: a few bytes a run, whatever the data
    paths: dict[str, list[str]] = {}
    for y, line in enumerate(grid["cells"]):
        x, ends = 0, dict[str, int]()
        while x < n_cols:
            here = colour(line[x])
            end = x + 1
            while end < n_cols and colour(line[end]) == here:
                end += 1
            last = ends.get(here)
            paths.setdefault(here, []).append(f"M{x} {y}.5h{end - x}" if last is None
                                              else f"m{x - last} 0h{end - x}")
            ends[here] = end
            x = end
    svg = [open_svg(f"heatmap {cls}", title, frame, f'data-rows="{n_rows}" data-columns="{n_cols}"'),
           f'<g transform="translate({frame.left} {TOP}) scale({sx:.4f} {sy:.4f})" '
           'shape-rendering="crispEdges">']
    svg += [f'<path stroke="{c}" stroke-width="1" fill="none" d="{"".join(d)}"/>' for c, d in paths.items()]
    for y, ((first, last), line) in enumerate(zip(grid["rows"], grid["cells"], strict=True)):
        row = [v for v in line if v is not None]
        tip = (f"{_span(first, last, 'rank')}: mean {sum(row) / len(row):.3f} ms, highest {max(row):.3f} ms"
               if row else f"{_span(first, last, 'rank')}: no value")
        svg.append(f'<rect class="row" x="0" y="{y}" width="{n_cols}" height="1" fill-opacity="0">'
                   f"<title>{escape(tip)}</title></rect>")
    svg.append("</g>")
    step = max(1, math.ceil(n_rows / 12))
    for y in range(0, n_rows, step):
        first, last = grid["rows"][y]
        label = str(first) if first == last else f"{first}-{last}"
        svg.append(f'<text class="tick" x="{frame.left - 6}" y="{TOP + (y + 0.5) * cell_h + 4:.1f}" '
                   f'text-anchor="end">{label}</text>')
    mid = TOP + n_rows * cell_h / 2
    svg.append(f'<text class="axis-label" transform="translate(14 {mid:.1f}) rotate(-90)" '
               f'text-anchor="middle">rank</text>')
    svg.append(x_axis(frame, index_ticks([c[0] for c in grid["columns"]]), "iteration"))
    svg.append("</svg>")
    width = (high - low) / len(LEVELS)
    keys = [(c, f"{low + i * width:.3f}-{low + (i + 1) * width:.3f} ms" if i < len(LEVELS) - 1
             else f"≥ {low + i * width:.3f} ms") for i, c in enumerate(LEVELS)]
    keys.append((NO_VALUE, "N/A"))
    per_row = math.ceil(len({r["rank"] for r in model["iterations"]}) / n_rows)
    per_col = max(c[1] - c[0] + 1 for c in grid["columns"])
    caption = (f"{title}: one row per {'rank' if per_row == 1 else f'{per_row} consecutive ranks'}, one "
               f"column per {'iteration' if per_col == 1 else f'up to {per_col} consecutive iterations'}"
               f"{'' if per_row == per_col == 1 else ' (their mean)'}; colours from the lowest cell to the "
               f"{CLIP:.0%} quantile of the cells or {CLIP_MEDIANS:g} times their median, the lower "
               f"({high:.3f} ms), the cells above it in the top colour; "
               "grey: no value.")
    return _figure("".join(svg), caption, legend(keys))


def heatmaps(model: Mapping[str, Any]) -> str:
    """The rank x iteration heatmaps: iteration time and time outside collectives."""
    if len(model["ranks"]) < scale.HEATMAP_MIN_RANKS:
        return ""
    return (heatmap(model, "heat-iteration", "Iteration time by rank and iteration", scale.iteration_time)
            + heatmap(model, "heat-busy", "Time outside collectives by rank and iteration "
                      "(iteration less comm not overlapped)", scale.outside_collectives))


def straggler_chart(model: Mapping[str, Any]) -> str:
    """Horizontal bars: how often each rank was the slowest (the top stragglers above the limit)."""
    cross = model.get("cross_rank")
    if not cross or len(model["ranks"]) < scale.HEATMAP_MIN_RANKS:
        return ""
    shown = scale.stragglers(cross) if scale.many(model) else \
        sorted(cross["slowest_count"], key=lambda r: (-cross["slowest_count"][r], int(r)))
    if not shown:
        return ""
    n = cross["iterations_compared"]
    ticks = nice_ticks(max(cross["slowest_count"][r] for r in shown))
    bar_h = 20
    frame = Frame(ticks[-1], height=TOP + BOTTOM + bar_h * max(len(shown), 4), left=90, right=120)
    svg = [open_svg("stragglers", "How often each rank was the slowest", frame, f'data-bars="{len(shown)}"')]
    base = TOP + frame.plot_h
    for t in ticks:
        x = frame.x(t / ticks[-1])
        svg.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{base}"/>')
    for i, rank in enumerate(shown):
        y = TOP + i * bar_h
        count = cross["slowest_count"][rank]
        excess = cross["median_excess"][rank]
        vs = "" if excess is None else f", {100 * excess:+.1f}% vs the median (median)"
        w = frame.plot_w * count / ticks[-1]
        name = escape(rank)
        svg.append(f'<g class="bar" data-rank="{name}"><title>rank {name}: slowest in {count} '
                   f"of {n} iterations{escape(vs)}</title>"
                   f'<text class="tick" x="{frame.left - 6}" y="{y + 14}" text-anchor="end">rank {name}'
                   f'</text><rect x="{frame.left}" y="{y + 3}" width="{max(w, 0.5):.2f}" '
                   f'height="{bar_h - 6}" fill="{PALETTE[1]}"/>'
                   f'<text class="value" x="{frame.left + w + 4:.1f}" y="{y + 14}">{count} of {n}</text></g>')
    svg.append(x_axis(frame, [(t / ticks[-1], f"{t:g}") for t in ticks],
                      "iterations in which it was the slowest"))
    svg.append("</svg>")
    what = "time outside collectives" if cross["measure"] == "busy" else "iteration time"
    left = len([c for c in cross["slowest_count"].values() if c]) - len(shown)
    caption = (f"Per rank, in how many of the {n} compared iterations it was the slowest ({what})"
               + (f"; the {len(shown)} slowest most often ({left} more were the slowest at times; every "
                  "rank's count is in summary --json)" if left > 0 else "")
               + "; ranks never the slowest are left out.")
    return _figure("".join(svg), caption)


# -- tables of many ranks ------------------------------------------------------------------------

def ranks_tables(model: Mapping[str, Any]) -> str:
    """The "Ranks" table folded into groups, and each rank's mean distributed across ranks (every
    value is one rank's, tagged with its place in the model)."""
    groups = scale.rank_groups(model)
    rows = [[f"<td class=\"fixed\">{escape(scale.rank_list(g['ranks'], 6))}</td>", _count(len(g["ranks"])),
             _count(g["hosts"]), _count(g["count"]), cell(g["range"], ""), cell(g["method"], ""),
             cell("yes" if g["finished"] else "no (killed?)", "")] for g in groups]
    n = len(model["ranks"])
    out = ['<h2 id="ranks">Ranks and iteration breakdown</h2>',
           f'<p class="note">{n} ranks, grouped where they read the same; each rank\'s own tables: '
           "<code>jobprof summary --json</code>, or <code>--rank R</code>.</p>",
           table(["ranks", "count", "hosts", "iterations", "range", "found by", "finished"],
                 rows, "rank-groups")]
    found = scale.rank_distribution(model)
    if not found["measured"]:
        return "".join(out)
    keys = ("iteration", *breakdown.PARTS)
    body = []
    for stat in scale.STATS:
        line = [f"<td>{stat}</td>"]
        for k in keys:
            d = found["stats"][k]
            if d is None:
                line.append(cell(None, key("ranks", 0, "breakdown_ms", k, "mean"), MS))
                continue
            i = d[stat]["index"]
            line.append(cell(d[stat]["value"], key("ranks", i, "breakdown_ms", k, "mean"), MS)
                        .replace("<td ", f'<td title="rank {model["ranks"][i]["rank"]}" ', 1))
        body.append(line)
    out += [f"<h3>Iteration time (ms): each rank's mean, distributed across {found['measured']} ranks</h3>",
            table(["", *(breakdown.LABELS[k] for k in keys)], body, "distribution")]
    notes = ["parts add up to each rank's iteration time; docs/cli.md defines each part; percentiles are "
             "nearest-rank: each value is one rank's (hover for which)"]
    notes += sorted({f"{breakdown.LABELS[k]}: {v}" for r in model["ranks"] for k, v in r["basis"].items()})
    out.append("".join(f'<p class="note">{escape(t)}</p>' for t in notes))
    if found["outliers"]:
        items = "; ".join(
            f"rank {o['rank']} "
            + num(o["mean_ms"], key("ranks", o["index"], "breakdown_ms", "iteration", "mean"), MS, tag="span")
            + " ms" + (f" ({100 * o['vs_p50']:+.0f}% vs p50)" if o["vs_p50"] is not None else "")
            for o in found["outliers"])
        out.append(f'<p class="note outliers">Slowest ranks by mean iteration time (the '
                   f"{scale.SLOWEST_SHOWN} slowest and any over p50 x {scale.OUTLIER_FACTOR:g}): {items}</p>")
    ends = [f"unfinished rank(s) (no end_info): {scale.rank_list(found['unfinished'])}"
            if found["unfinished"] else "every rank finished"]
    if found["no_iterations"]:
        ends.append(f"rank(s) with no iteration: {scale.rank_list(found['no_iterations'])}")
    out.append("".join(f'<p class="note">{escape(t)}</p>' for t in ends))
    return "".join(out)


def _count(n: int) -> str:
    """A count of the folded table: no single value of the model, so not tagged with a path."""
    return f'<td class="num fixed">{n}</td>'


def cross_rows(model: Mapping[str, Any]) -> tuple[list[str], str]:
    """Above the limit, the ranks of the "Across ranks" table (the top stragglers) and a note."""
    cross = model["cross_rank"]
    shown = scale.stragglers(cross)
    counts = cross["slowest_count"]
    never = sum(1 for c in counts.values() if not c)
    rest = len(counts) - len(shown) - never
    note = "; ".join(([f"{rest} more rank(s) were the slowest in fewer iterations"] if rest else [])
                     + ([f"{never} rank(s) were never the slowest"] if never else [])
                     + ["every rank's count is in jobprof summary --json"])
    return shown, f'<p class="note">The {len(shown)} rank(s) slowest most often; {escape(note)}.</p>'

