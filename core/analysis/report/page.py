"""The report page: one self-contained HTML file (inline CSS and SVG, no script, no URL).

A Content-Security-Policy of ``default-src 'none'`` makes the browser refuse any fetch the page
might attempt, so viewing it offline is guaranteed, not just intended.
"""

from __future__ import annotations

import datetime as _dt
from html import escape
from typing import Any

from jobprof.analysis import breakdown, scale
from jobprof.analysis.report import charts, scaled, trace
from jobprof.analysis.report.fmt import MS, PCT, cell, key, num, table
from jobprof.analysis.selection import narrowed
from jobprof.analysis.summary import BEFORE_FIRST, process_marks
from jobprof.files.rawstore import escaped

STATS = ("mean", "median", "p95", "worst")
#: sections the page places itself; every other one (third-party ones too) follows as a table
PLACED = ("top_operators", "operator_shapes", "communication")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2430;
background:#fff}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #d8dde6;
padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.meta{color:#4a5568;margin:0}.meta b{color:#1d2430}
nav{margin:10px 0;font-size:13px}nav a{margin-right:12px;color:#0b5cad}
table{border-collapse:collapse;margin:6px 0 4px;font-size:13px}
th,td{border:1px solid #d8dde6;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f2f4f8;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:hover{background:#f7f9fc}
.note{color:#4a5568;font-size:12.5px;margin:2px 0}
ol.findings li{margin:6px 0}.evidence{color:#4a5568;font-size:12.5px}
.evidence span.num{background:#f2f4f8;border-radius:3px;padding:0 4px;font-variant-numeric:tabular-nums}
figure{margin:12px 0}figcaption{color:#4a5568;font-size:12.5px}
svg.chart{display:block;width:100%;height:auto;max-width:900px}
svg .title{font-size:14px;font-weight:600;fill:#1d2430}svg .tick,svg .value{font-size:11px;fill:#4a5568}
svg .axis-label{font-size:12px;fill:#1d2430}svg .axis{stroke:#4a5568}svg .grid{stroke:#e6e9ef}
svg g.bar:hover rect{opacity:.75}
.legend{font-size:12.5px;margin:4px 0}.legend .key{margin-right:14px;white-space:nowrap}
.legend i{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:-1px;
border:1px solid #8a94a6}
ul.missing li{color:#8a3b12}
svg .span-label{font-size:10.5px;fill:#1d2430}
details{margin:4px 0}details summary{cursor:pointer;color:#0b5cad}
"""


def _notes(notes: list[str]) -> str:
    return "".join(f'<p class="note">{escape(n)}</p>' for n in notes if n)


def _header(model: dict[str, Any], generated: str) -> str:
    sel = narrowed(model["selection"], "; ", ", ") or "all iterations, all ranks"
    ranks = scale.rank_list(r["rank"] for r in model["ranks"]) or "none"
    return (f"<h1>jobprof report</h1>"
            f'<p class="meta"><b>Profile</b> <code>{escape(model["prof_dir"])}</code></p>'
            f'<p class="meta"><b>Ranks</b> {escape(ranks)} ({len(model["ranks"])}) &nbsp; '
            f"<b>Selection</b> {escape(sel)} &nbsp; <b>Generated</b> {escape(generated)} &nbsp; "
            f'<b>Model</b> {escape(model["schema"])}</p>')


def _evidence(index: int, evidence: dict[str, Any]) -> str:
    parts = []
    for name, value in evidence.items():
        kind = PCT if any(w in name for w in ("share", "excess")) else MS if name.endswith("_ms") else "raw"
        if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            shown = num(value, key("findings", index, "evidence", name), kind, tag="span")
            parts.append(f"{escape(name)} {shown}{' ms' if kind == MS and value is not None else ''}")
        else:
            text = ", ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
            parts.append(f"{escape(name)} {escape(text)}")
    return f'<div class="evidence">evidence: {"; ".join(parts)}</div>'


#: the finding about jobprof's own time (jobprof.analysis.findings, the "profiler" part)
OWN_COST = "profiler"


def _findings(model: dict[str, Any]) -> str:
    # the job's findings; jobprof's own cost apart, after them (the first answer is the job's)
    every = list(enumerate(model["findings"]))
    job = [(i, f) for i, f in every if f["key"] != OWN_COST]
    own = [(i, f) for i, f in every if f["key"] == OWN_COST]
    if not job:
        html = '<h2 id="findings">Findings</h2><p class="note">No finding: nothing stood out.</p>'
    else:
        items = "".join(f'<li data-finding-key="{escape(f["key"])}"><span class="text">{escape(f["text"])}'
                        f"</span>{_evidence(i, f['evidence'])}</li>" for i, f in job)
        html = f'<h2 id="findings">Findings</h2><ol class="findings">{items}</ol>'
    for i, f in own:
        html += (f'<p class="own-cost" data-finding-key="{escape(f["key"])}"><b>jobprof\'s own cost:</b> '
                 f'<span class="text">{escape(f["text"])}</span>{_evidence(i, f["evidence"])}</p>')
    return html


def _ranks(model: dict[str, Any]) -> str:
    ranks = model["ranks"]
    if not ranks:
        return ""
    if scale.many(model):
        return scaled.ranks_tables(model)
    rows = []
    marked, notes = process_marks(ranks)
    for i, r in enumerate(ranks):
        its = r["iterations"]
        span = f"{its['first']}-{its['last']}" if its["count"] else "-"
        rank = cell(r["rank"], key("ranks", i, "rank"))
        if r["device"] in marked:  # the footnote's mark, after the number (kept machine-readable)
            rank = rank.removesuffix("</td>") + "*</td>"
        rows.append([rank, cell(r["device"], key("ranks", i, "device")),
                     cell(r["hostname"] or "N/A", ""),
                     cell(its["count"], key("ranks", i, "iterations", "count")),
                     cell(span, ""), cell(r["iteration_method"] or "N/A", ""),
                     cell("yes" if r["finished"] else "no (killed?)", "")])
    out = ['<h2 id="ranks">Ranks and iteration breakdown</h2>',
           table(["rank", "device", "host", "iterations", "range", "found by", "finished"], rows, "ranks"),
           *(f'<p class="note">{escape(n)}</p>' for n in notes)]
    keys = ("iteration", *breakdown.PARTS)
    rows = []
    for i, r in enumerate(ranks):
        if not r["iterations"]["count"]:
            continue  # a rank with no iteration has no breakdown (Missing says why)
        for stat in STATS:
            rows.append([cell(r["rank"], key("ranks", i, "rank")), f"<td>{stat}</td>",
                         *(cell(r["breakdown_ms"][k][stat], key("ranks", i, "breakdown_ms", k, stat), MS)
                           for k in keys)])
        rows.append([cell(r["rank"], key("ranks", i, "rank")), "<td>share</td>",
                     '<td class="fixed">100%</td>',
                     *(cell(r["share"][k], key("ranks", i, "share", k), PCT) for k in breakdown.PARTS)])
    out += ["<h3>Iteration time (ms): where it went, per rank</h3>",
            table(["rank", "", *(breakdown.LABELS[k] for k in keys)], rows, "breakdown")]
    bases = sorted({f"{breakdown.LABELS[k]}: {v}" for r in ranks for k, v in r["basis"].items()})
    worst = "; ".join(f"rank {r['rank']}: worst iteration "
                      + num(r["breakdown_ms"]["iteration"]["worst_iteration"],
                            key("ranks", i, "breakdown_ms", "iteration", "worst_iteration"), tag="span")
                      for i, r in enumerate(ranks) if r["iterations"]["count"])
    out.append(_notes(["in each iteration the parts add up to its time, so the mean row adds up too; the "
                       "median, p95 and worst are each column's own (of different iterations); docs/cli.md "
                       "defines each part", *bases]))
    if worst:
        out.append(f'<p class="note">{worst}</p>')
    startup = "; ".join(
        f"rank {escape(str(r['rank']))}: "
        + num(r["startup"]["ms"], key("ranks", i, "startup", "ms"), MS, tag="span")
        + " ms, jobprof's own startup "
        + num(r["startup"]["own_ms"], key("ranks", i, "startup", "own_ms"), MS, tag="span") + " ms of it"
        for i, r in enumerate(ranks) if r.get("startup"))
    if startup:
        out.append(f'<p class="note">{escape(BEFORE_FIRST)}: {startup}</p>')
    return "".join(out)


def _cross(model: dict[str, Any]) -> str:
    cross = model["cross_rank"]
    if not cross:
        return ""
    what = "time outside collectives" if cross["measure"] == "busy" else "iteration time"
    n = cross["iterations_compared"]
    shown, note = scaled.cross_rows(model) if scale.many(model) else (list(cross["slowest_count"]), "")
    rows = [[f'<th scope="row">{escape(rank)}</th>', cell(count, key("cross_rank", "slowest_count", rank)),
             cell(n, key("cross_rank", "iterations_compared")),
             cell(cross["median_excess"][rank], key("cross_rank", "median_excess", rank), PCT)]
            for rank, count in ((r, cross["slowest_count"][r]) for r in shown)]
    spread = [[f"<td>{label}</td>",
               *(cell(cross[field][s], key("cross_rank", field, s), kind) for s in STATS),
               cell(cross[field]["worst_iteration"], key("cross_rank", field, "worst_iteration"))]
              for label, field, kind in (("share of the iteration", "spread_share", PCT),
                                         ("ms", "spread_ms", MS))]
    return (f'<h2 id="cross-rank">Across ranks ({escape(what)}, {n} iterations)</h2>'
            + note + table(["rank", "slowest in", "of iterations", "vs median (median)"], rows, "cross")
            + scaled.straggler_chart(model)
            + "<h3>Spread (slowest - fastest rank) per iteration</h3>"
            + table(["spread", *STATS, "worst iteration"], spread, "spread"))


def _section(model: dict[str, Any], skey: str, section: dict[str, Any], anchor: bool = True) -> str:
    kept, notes = scale.section_rows(model, section)
    rows = [[cell(v, key("sections", skey, "rows", i, j)) for j, v in enumerate(section["rows"][i])]
            for i in kept]
    head = f'<h2 id="s-{escape(skey)}">' if anchor else "<h3>"
    tail = "</h2>" if anchor else "</h3>"
    body = table(section["headers"], rows, "section") if rows else '<p class="note">(no rows)</p>'
    if section.get("chart") and rows:
        body = charts.section_lines(section) + body
    return (f'<section data-section="{escape(skey)}">{head}{escape(section["title"])}{tail}'
            f"{body}{_notes(notes)}</section>")


def _drill_down(model: dict[str, Any], section: dict[str, Any]) -> str:
    """The top operator types' input shapes, one collapsible block per type (``<details>``: no
    script), each shape's slowest call with its iteration and timeline file."""
    columns = section["columns"]
    at = {c: i for i, c in enumerate(columns)}
    groups: dict[tuple[Any, Any, Any], list[int]] = {}
    for i, row in enumerate(section["rows"]):
        groups.setdefault((row[at["device"]], row[at["op_type"]], row[at["core_type"]]), []).append(i)
    shown = [c for c in columns if c not in ("device", "op_type", "core_type")]
    headers = [section["headers"][at[c]] for c in shown]
    blocks = []
    for (device, op, core), indices in groups.items():
        rows = [[cell(section["rows"][i][at[c]], key("sections", "operator_shapes", "rows", i, at[c]))
                 for c in shown] for i in indices]
        calls = sum(section["rows"][i][at["calls"]] or 0 for i in indices)
        label = f"{op} ({core}, device {device}): {len(indices)} input shape(s), {calls} call(s) read"
        blocks.append(f"<details><summary>{escape(label)}</summary>"
                      f"{table(headers, rows, 'section')}</details>")
    notes = _notes(list(section.get("notes", [])))
    return (f'<section data-section="operator_shapes"><h3 id="s-operator_shapes">'
            f'{escape(section["title"])}</h3>{"".join(blocks)}{notes}</section>')


def _missing(model: dict[str, Any]) -> str:
    if not model["missing"]:
        return '<h2 id="missing">Missing</h2><p class="note">Nothing: every rank and part was measured.</p>'
    items = "".join(f"<li>{escape(m)}</li>" for m in model["missing"])
    return f'<h2 id="missing">Missing</h2><ul class="missing">{items}</ul>'


def _drawn(model: dict[str, Any]) -> tuple[set[int] | None, set[int] | None, str]:
    """The ranks the breakdown charts and the per-rank lines draw (None: all), and a note on which:
    above the limit, bars for the slowest and the median rank, lines for those, the fastest and
    the outliers (the heatmap shows every rank)."""
    if not scale.many(model):
        return None, None, ""
    found = scale.rank_distribution(model)
    ranks = model["ranks"]
    picked: dict[int, str] = {}
    if found["slowest_index"] is not None:
        picked[ranks[found["slowest_index"]]["rank"]] = "slowest"
    it = found["stats"]["iteration"]
    if it:
        picked.setdefault(ranks[it["p50"]["index"]]["rank"], "median")
        picked.setdefault(ranks[it["min"]["index"]]["rank"], "fastest")
    for o in found["outliers"]:
        picked.setdefault(o["rank"], "slow")
    bars = {r for r, why in picked.items() if why in ("slowest", "median")}
    named = ", ".join(f"rank {r} ({why})" for r, why in picked.items())
    note = (f'<p class="note">{len(ranks)} ranks: the breakdown is drawn for rank(s) '
            f"{escape(scale.rank_list(bars))}, the lines per rank for {escape(named)}; the heatmap "
            "further down shows every rank.</p>")
    return bars, set(picked), note


def render(model: dict[str, Any], generated: str | None = None, view: dict[str, Any] | None = None) -> str:
    """The report of one summary model (``jobprof.analysis.summary.summarize``) as a complete HTML
    page; ``view``: one iteration's operators to draw (:func:`.trace.one_iteration`)."""
    generated = generated or _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    sections = model["sections"]
    nav = [("findings", "Findings"), ("ranks", "Ranks"), ("charts", "Charts")]
    body = [_header(model, generated), _findings(model), _ranks(model)]
    if model["iterations"]:
        bars, lines, why = _drawn(model)
        body += ['<h2 id="charts">Iteration breakdown per iteration</h2>', why,
                 charts.breakdown(model, bars),
                 '<h2 id="rank-times">Iteration time per rank</h2>', charts.rank_times(model, lines)]
        nav.append(("rank-times", "Per rank"))
        heat = scaled.heatmaps(model)
        if heat:
            body += ['<h2 id="heatmap">Ranks by iteration</h2>', heat]
            nav.append(("heatmap", "Heatmap"))
    if view is not None:
        body.append(trace.section(view))
        nav.append(("iteration-view", "One iteration"))
    if model["cross_rank"]:
        body.append(_cross(model))
        nav.append(("cross-rank", "Across ranks"))
    if "top_operators" in sections:
        body.append(f'<h2 id="s-top_operators">{escape(sections["top_operators"]["title"])}</h2>')
        top = sections["top_operators"]
        kept, _ = scale.section_rows(model, top)
        body.append(charts.top_operators({**top, "rows": [top["rows"][i] for i in kept]}))
        body.append(_section(model, "top_operators", top, anchor=False))
        if "operator_shapes" in sections:
            body.append(_drill_down(model, sections["operator_shapes"]))
    body += [_section(model, k, sections[k]) for k in ("communication",) if k in sections]
    body += [_section(model, k, s) for k, s in sections.items() if k not in PLACED]
    nav += [(f"s-{k}", s["title"].split("(")[0].split(":")[0].strip()) for k, s in sections.items()]
    body.append(_missing(model))
    nav.append(("missing", "Missing"))
    links = "".join(f'<a href="#{escape(a)}">{escape(t)}</a>' for a, t in nav)
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; img-src data:\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>jobprof report: {escape(model['prof_dir'])}</title><style>{CSS}</style></head>"
            f"<body><main><nav>{links}</nav>{''.join(body)}</main></body></html>")
    # names the job controls (record_function, NVTX) may hold control characters: shown as
    # \xNN in the page (and never acting on a terminal that `cat`s the file); the page's own
    # markup has only line breaks
    return "\n".join(map(escaped, page.split("\n"))) + "\n"

