"""The report's view of one iteration: its operators on a time axis, drawn in the page itself.

A trace viewer (Perfetto, chrome://tracing) needs the timeline file and, for Perfetto's UI, the
network; the report stays one offline file, so it draws one representative iteration as inline
SVG: the **median iteration of the slowest rank** (the one a user would open first), every
operator on each thread, nested down to :data:`MAX_DEPTH` levels, hover for name, duration,
input shapes and offset.  The timeline file of that iteration is named beside it for the rest.

Bounded: at most :data:`MAX_SPANS` rectangles (the longest kept, the count of the others said),
so a 100,000-operator iteration still gives a page of a few hundred KB.
"""

from __future__ import annotations

import statistics
from html import escape
from typing import TYPE_CHECKING, Any

from jobprof.analysis.report.svg import PALETTE, nice_ticks, tick_label
from jobprof.files import rawstore
from jobprof.plugin.opview import OpView
from jobprof.plugin.records import DEVICE_KINDS
from jobprof.plugin.values import STEP_MODE_MODEL_ID

if TYPE_CHECKING:
    from jobprof.analysis.profile import Profile

MAX_DEPTH = 4
MAX_SPANS = 1500
#: iterations tried around the median when the median one has no operators (task_trace_every)
TRIES = 9
WIDTH, LABEL, ROW, AXIS, TOP = 900, 150, 16, 30, 8
#: the report's palette lightened (dark text stays readable on every bar)
LIGHT = tuple("#" + "".join(f"{(int(c[i:i + 2], 16) + 2 * 255) // 3:02x}" for i in (1, 3, 5))
              for c in PALETTE[:7])


def pick(model: dict[str, Any]) -> tuple[int, int, int, list[int]] | None:
    """(rank, device, median iteration, the rank's other iterations nearest the median first) of
    the slowest rank (highest median iteration time), or None without iterations."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for row in model.get("iterations") or ():
        if row.get("iteration_ms") is not None and not row.get("skipped"):
            per_rank.setdefault(row["rank"], []).append(row)
    if not per_rank:
        return None
    rank = max(per_rank, key=lambda r: (statistics.median(x["iteration_ms"] for x in per_rank[r]), -r))
    rows = sorted(per_rank[rank], key=lambda x: (x["iteration_ms"], x["iteration"]))
    middle = rows[(len(rows) - 1) // 2]["iteration_ms"]
    order = sorted(rows, key=lambda x: (abs(x["iteration_ms"] - middle), x["iteration"]))
    return rank, rows[0]["device"], order[0]["iteration"], [x["iteration"] for x in order[1:]]


def one_iteration(profile: Profile, model: dict[str, Any]) -> dict[str, Any] | None:
    """The view's data: ``{rank, device, iteration, iteration_ms, median (bool), start_ns, end_ns,
    spans: [[lane label, depth, start ns, dur ns, name, shapes]], dropped, timeline}``; None when
    no iteration of the slowest rank near its median has operators (task_trace off)."""
    picked = pick(model)
    if picked is None:
        return None
    rank, device, median, others = picked
    by_index = {r["iteration"]: r for r in model["iterations"] if r["rank"] == rank}
    # with task_trace_every N only iterations 1, 1+N, ... have operators: try those
    every = profile.task_trace_every(device)
    candidates = [i for i in [median, *others] if (i - 1) % every == 0]
    for index in candidates[:TRIES]:
        streams = next((s for _, s in rawstore.read(profile.folder(device), only={index})), None)
        records = (streams or {}).get(rawstore.OPS_STREAM)
        if not records:
            continue
        row = by_index[index]
        start = row["start_ns"]
        end = start + round(row["iteration_ms"] * 1e6)
        spans, dropped = _spans(OpView(records), start, end)
        if not spans:
            continue
        return {"rank": rank, "device": device, "iteration": index, "iteration_ms": row["iteration_ms"],
                "profiler_ms": row.get("profiler_ms"),
                "median": index == median, "start_ns": start, "end_ns": end, "spans": spans,
                "dropped": dropped, "kineto": profile.is_on(device, "kineto_trace"),
                "timeline": f"device_{device}/timeline/msprof_{device}_{STEP_MODE_MODEL_ID}_{index}.json"}
    return None


def _spans(view: OpView, start: int, end: int) -> tuple[list[list[Any]], int]:
    records = view.records
    depth = [0] * len(records)
    for i in sorted(range(len(records)), key=lambda i: (records[i].start, -records[i].dur)):
        parent = view.parent[i]
        depth[i] = depth[parent] + 1 if parent >= 0 else 0
    chosen = [i for i, r in enumerate(records)
              if depth[i] < MAX_DEPTH and r.start < end and r.start + r.dur > start and r.dur > 0]
    dropped = 0
    if len(chosen) > MAX_SPANS:
        chosen.sort(key=lambda i: -records[i].dur)
        dropped = len(chosen) - MAX_SPANS
        chosen = chosen[:MAX_SPANS]
    out = []
    for i in sorted(chosen, key=lambda i: (records[i].tid, depth[i], records[i].start)):
        r = records[i]
        lane = f"{'stream' if r.kind in DEVICE_KINDS else 'thread'} {r.tid}"
        shapes = r.shapes if isinstance(r.shapes, list) else None
        out.append([lane, depth[i], r.start, r.dur, r.name, _shapes(shapes)])
    return out, dropped


def _shapes(shapes: list[Any] | None) -> str:
    if not shapes:
        return ""
    return ";".join(",".join(str(d) for d in s) if isinstance(s, list) else str(s) for s in shapes)


def svg(view: dict[str, Any]) -> str:
    """The view as an inline SVG (rows: a thread's nesting levels; x: ms into the iteration)."""
    start, end = view["start_ns"], view["end_ns"]
    lanes: dict[tuple[str, int], int] = {}
    for lane, depth, *_ in view["spans"]:
        lanes.setdefault((lane, depth), len(lanes))
    height = TOP + ROW * len(lanes) + AXIS
    plot = WIDTH - LABEL - 10
    span_ms = (end - start) / 1e6 or 1.0

    def x(ns: int) -> float:
        return LABEL + plot * min(max((ns - start) / 1e6 / span_ms, 0.0), 1.0)

    parts = [f'<svg class="chart iteration-view" viewBox="0 0 {WIDTH} {height}" role="img" '
             f'data-iteration="{view["iteration"]}" data-rank="{view["rank"]}" '
             f'aria-label="operators of iteration {view["iteration"]}">']
    for (lane, depth), row in lanes.items():
        if depth == 0:
            parts.append(f'<text class="tick" x="4" y="{TOP + ROW * row + 12}">{escape(lane)}</text>')
    colours: dict[str, str] = {}
    for lane, depth, s, dur, name, shapes in view["spans"]:
        row = lanes[(lane, depth)]
        x0, x1 = x(s), x(s + dur)
        colour = colours.setdefault(name, LIGHT[len(colours) % len(LIGHT)])
        tip = f"{name}: {dur / 1000:.1f} µs at +{(s - start) / 1e6:.3f} ms"
        if shapes:
            tip += f"; shapes {shapes}"
        label = ""
        if x1 - x0 > 40:
            short = name.rpartition("::")[2]
            room = int((x1 - x0 - 4) / 6.2)
            label = (f'<text class="span-label" x="{x0 + 2:.1f}" y="{TOP + ROW * row + 11}">'
                     f"{escape(short[:room])}</text>")
        parts.append(f'<g class="span"><title>{escape(tip)}</title><rect x="{x0:.2f}" '
                     f'y="{TOP + ROW * row + 1}" width="{max(x1 - x0, 0.6):.2f}" height="{ROW - 2}" '
                     f'fill="{colour}"/>{label}</g>')
    axis_y = TOP + ROW * len(lanes) + 4
    parts.append(f'<line class="axis" x1="{LABEL}" y1="{axis_y}" x2="{LABEL + plot}" y2="{axis_y}"/>')
    for tick in nice_ticks(span_ms, 8):
        if tick > span_ms * 1.0001:
            break
        tx = LABEL + plot * tick / span_ms
        parts.append(f'<text class="tick" x="{tx:.1f}" y="{axis_y + 14}" text-anchor="middle">'
                     f"{tick_label(tick)}</text>")
    parts.append(f'<text class="axis-label" x="{LABEL + plot / 2:.0f}" y="{height - 2}" text-anchor="middle">'
                 "ms into the iteration</text></svg>")
    return "".join(parts)


def section(view: dict[str, Any] | None) -> str:
    """The page's block for the view (heading, the SVG, where the rest is); empty without one."""
    if view is None:
        return ""
    which = "the median" if view["median"] else "the one nearest the median with operators"
    about = (f"Rank {view['rank']}, iteration {view['iteration']} ({view['iteration_ms']:.3f} ms): "
             f"{which} of the slowest rank's iterations. Every operator on each thread, nested down to "
             f"{MAX_DEPTH} levels; hover a bar for its name, duration, offset and input shapes.")
    more = (f"The whole iteration (every level, device tasks, flows): {view['timeline']}, in Perfetto "
            "(ui.perfetto.dev) or chrome://tracing"
            + (f"; `jobprof kineto --iterations {view['iteration']} --rank {view['rank']}` for "
               "TensorBoard / HTA." if view.get("kineto") else
               "; for TensorBoard / HTA, profile with \"kineto_trace\": \"on\" (then `jobprof kineto`)."))
    own = view.get("profiler_ms")
    if own:
        about += (f" Of its time, {own:.3f} ms was jobprof's own hand-over (the profiler's window swap: "
                  "a stretch without operators).")
    dropped = (f'<p class="note">{view["dropped"]} shorter operators are not drawn (at most {MAX_SPANS}).</p>'
               if view["dropped"] else "")
    return (f'<section data-view="iteration"><h2 id="iteration-view">One iteration</h2>'
            f'<p class="note">{escape(about)}</p><figure>{svg(view)}</figure>{dropped}'
            f'<p class="note">{escape(more)}</p></section>')

