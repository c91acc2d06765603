"""``jobprof report``: the HTML page of real profiles, opened in a real headless Chromium.

One 2-rank DDP job (torchrun, gloo; training_trace, task_trace, hccl and dp on) is shared by
the module; a test-local third-party plugin adds its own report section.  The page must load
with no console message, no page error and no request but the file itself; its charts must
render with the expected bars and series; every number it shows must equal the value at its
``data-key`` in ``jobprof summary --json`` (same selection) to the precision shown.

The browser is Debian's ``chromium`` (``.ci/run`` installs it), driven by Playwright.  Without
it these tests fail; ``JOBPROF_NO_BROWSER=1`` skips them explicitly.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from test_hccl import KILLED

from conftest import REPO, Runner, jobprof_cli, torchrun
from distributions import make_dist

STEPS = 12
MAX_BARS = 300
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]

# a third-party plugin: only a report section, from the profile's own API
ACME = """
from jobprof.plugin.hookspec import hookimpl
from jobprof.plugin import Finding, Section


@hookimpl
def jobprof_report_sections(profile):
    rows = []
    for device in profile.devices:
        its = profile.iterations(device)
        rows.append([profile.rank(device), len(its), round(sum(i.end_ns - i.start_ns for i in its) / 1e6, 3)])
    steps = sum(r[1] for r in rows)
    return [Section("Acme steps (third party)", ["rank", "steps", "total ms"], rows, key="acme_steps",
                    notes=["counted by acme_report from Profile.iterations"],
                    findings=[Finding("acme", f"acme saw {steps} steps", {"steps": steps})])]
"""

# one rank, many short iterations: the charts must bin them
LONG = """
import torch
from torch import nn
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range({n}):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


# -- the browser ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if os.environ.get("JOBPROF_NO_BROWSER") == "1":
        pytest.skip("JOBPROF_NO_BROWSER=1: the browser checks of the HTML report are off")
    chromium = os.environ.get("JOBPROF_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.fail(f"no Chromium at {chromium}: install Debian's chromium (.ci/run does), or set "
                    "JOBPROF_NO_BROWSER=1 to skip the report's browser tests")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_report(browser: Any, html: Path, screenshot: Path | None = None) -> tuple[Any, dict[str, list]]:
    """The loaded page and what it said or asked for: console messages, page errors, requests."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    seen: dict[str, list] = {"console": [], "errors": [], "requests": []}
    page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.goto(html.as_uri(), wait_until="load")
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
    return page, seen


def assert_clean_load(seen: dict[str, list], html: Path) -> None:
    assert seen["console"] == [], seen["console"]
    assert seen["errors"] == [], seen["errors"]
    assert seen["requests"] == [html.as_uri()], seen["requests"]


# -- the model and the page ---------------------------------------------------------------------

def at(model: dict[str, Any], path: str) -> Any:
    value: Any = model
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def decimals_tolerance(text: str) -> float:
    """Half a unit of the last digit shown (``12.35`` -> 0.005, ``1.5e-05`` -> 5e-07)."""
    return 0.5 * 10.0 ** Decimal(text).as_tuple().exponent + 1e-12


def assert_numbers_match(page: Any, model: dict[str, Any]) -> int:
    """Every tagged number equals the model's value at its key, as shown; returns how many."""
    cells = page.eval_on_selector_all(
        "[data-key]", "els => els.map(e => [e.dataset.key, e.dataset.value, e.dataset.kind, e.textContent])")
    assert cells, "no number tagged with data-key"
    for path, raw, kind, text in cells:
        expected = at(model, path)
        assert json.loads(raw) == expected, (path, raw, expected)
        if expected is None:
            assert text == "N/A", (path, text)
        elif kind == "pct":
            assert text.endswith("%"), (path, text)
            shown = text[:-1]
            assert abs(100 * expected - float(shown)) <= decimals_tolerance(shown), (path, text, expected)
        else:
            assert abs(expected - float(text)) <= decimals_tolerance(text), (path, text, expected)
            if kind == "ms":
                assert text == f"{expected:.3f}", (path, text)
    # no number cell escapes the check: every numeric-looking table cell is tagged
    untagged = page.eval_on_selector_all(
        "td:not([data-key]):not(.fixed)", "els => els.map(e => e.textContent.trim())")
    numeric = [t for t in untagged if t.rstrip("%").replace(".", "", 1).lstrip("-").isdigit()]
    assert numeric == [], numeric
    return len(cells)


def assert_findings_in_order(page: Any, model: dict[str, Any]) -> None:
    items = page.eval_on_selector_all(
        "ol.findings > li",
        "els => els.map(e => [e.dataset.findingKey, e.querySelector('.text').textContent])")
    # the job's findings in order; jobprof's own cost apart, after the list
    assert items == [[f["key"], f["text"]] for f in model["findings"] if f["key"] != "profiler"]
    own = page.eval_on_selector_all(".own-cost", "els => els.map(e => e.querySelector('.text').textContent)")
    assert own == [f["text"] for f in model["findings"] if f["key"] == "profiler"]
    if items:  # an ordered list: the browser numbers them 1..n in that order
        shown = page.eval_on_selector("ol.findings", "e => getComputedStyle(e.children[0]).display")
        assert shown == "list-item"


def svg_sizes(page: Any, selector: str) -> list[dict[str, float]]:
    return [el.bounding_box() for el in page.query_selector_all(selector)]


def assert_charts(page: Any, model: dict[str, Any]) -> None:
    per_rank: dict[int, int] = {}
    for row in model["iterations"]:
        per_rank[row["rank"]] = per_rank.get(row["rank"], 0) + 1
    charts = page.query_selector_all("svg.breakdown")
    assert [int(c.get_attribute("data-rank")) for c in charts] == sorted(per_rank)
    for chart in charts:
        n = per_rank[int(chart.get_attribute("data-rank"))]
        rank = int(chart.get_attribute("data-rank"))
        bars = chart.eval_on_selector_all(
            "g.bar",
            "els => els.map(e => [e.querySelector('title').textContent, e.querySelectorAll('rect').length])")
        assert len(bars) == math.ceil(n / math.ceil(n / MAX_BARS)) <= MAX_BARS, (n, len(bars))
        assert all(rects >= 1 for _, rects in bars)
        if n <= MAX_BARS:  # one bar per iteration: its tooltip quotes that iteration's time
            rows = [r for r in model["iterations"] if r["rank"] == rank]
            assert [t.split(";")[0] for t, _ in bars] == [
                f"iteration {r['iteration']}: {r['iteration_ms']:.3f} ms" for r in rows]
    lines = page.query_selector_all("svg.rank-times polyline.series")
    assert sorted(int(s.get_attribute("data-rank")) for s in lines) == sorted(per_rank)
    if model["cross_rank"] and model["cross_rank"]["measure"] == "busy":
        busy = page.query_selector_all("svg.rank-busy polyline.series")
        assert len(busy) == len(model["cross_rank"]["slowest_count"])
        counts = model["cross_rank"]["slowest_count"]
        slowest = max(counts, key=lambda r: (counts[r], -int(r)))
        widths = {s.get_attribute("data-rank"): float(s.get_attribute("stroke-width")) for s in busy}
        assert widths[slowest] == max(widths.values()) > min(widths.values()), widths
    section = model["sections"].get("top_operators")
    if section:
        device = section["columns"].index("device")
        expected: dict[str, int] = {}
        for row in section["rows"]:
            expected[str(row[device])] = expected.get(str(row[device]), 0) + 1
        found = {c.get_attribute("data-device"): len(c.query_selector_all("g.bar"))
                 for c in page.query_selector_all("svg.top-operators")}
        assert found == expected
    for box in svg_sizes(page, "svg.chart"):
        assert box and box["width"] > 300 and box["height"] > 100, box


def assert_sections(page: Any, model: dict[str, Any]) -> None:
    shown = page.eval_on_selector_all("section[data-section]", "els => els.map(e => e.dataset.section)")
    assert sorted(shown) == sorted(model["sections"])
    for key, section in model["sections"].items():
        rows = page.query_selector_all(f"section[data-section='{key}'] tbody tr")
        assert len(rows) == len(section["rows"]), key
        heads = page.eval_on_selector_all(f"section[data-section='{key}'] thead th",
                                          "els => els.map(e => e.textContent)")
        if key == "operator_shapes":  # the drill-down: one collapsed block per operator type
            assert_drill_down(page, section, heads)
            continue
        assert heads == section["headers"], key


def assert_drill_down(page: Any, section: dict[str, Any], heads: list[str]) -> None:
    columns = section["columns"]
    device, op_type = columns.index("device"), columns.index("op_type")
    types = list(dict.fromkeys((r[device], r[op_type]) for r in section["rows"]))
    blocks = page.query_selector_all("section[data-section='operator_shapes'] details")
    assert len(blocks) == len(types)
    own = [h for h, c in zip(section["headers"], columns, strict=True)
           if c not in ("device", "op_type", "core_type")]
    assert heads == own * len(types)
    for block, (device, op) in zip(blocks, types, strict=True):
        assert block.get_attribute("open") is None  # collapsed until clicked
        summary = block.query_selector("summary").text_content()
        assert summary.startswith(f"{op} (") and f"device {device})" in summary
        assert not block.query_selector("table").is_visible()
        block.query_selector("summary").click()
        assert block.query_selector("table").is_visible()
        cells = block.eval_on_selector_all("tbody td", "els => els.map(e => e.textContent)")
        assert any(c.endswith(".json") and "/timeline/msprof_" in c for c in cells), cells


def assert_iteration_view(page: Any, model: dict[str, Any], prof: Path) -> None:
    """The page draws one iteration itself: the median one of the slowest rank (highest median
    iteration time), each bar an operator that the iteration's own timeline file holds with the
    same name and duration, drawn where that file places it."""
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for row in model["iterations"]:
        per_rank.setdefault(row["rank"], []).append(row)
    rank = max(per_rank, key=lambda r: statistics.median(x["iteration_ms"] for x in per_rank[r]))
    rows = sorted(per_rank[rank], key=lambda x: (x["iteration_ms"], x["iteration"]))
    median = rows[(len(rows) - 1) // 2]
    svg = page.query_selector("section[data-view=iteration] svg.iteration-view")
    assert (svg.get_attribute("data-rank"), svg.get_attribute("data-iteration")) == \
        (str(rank), str(median["iteration"]))
    device = median["device"]
    name = f"msprof_{device}_4294967295_{median['iteration']}.json"
    timeline = prof / f"device_{device}" / "timeline" / name
    note = page.query_selector("section[data-view=iteration]").text_content()
    assert str(timeline.relative_to(prof)) in note
    events = [e for e in json.loads(timeline.read_text()) if e.get("ph") == "X"]
    tips = page.eval_on_selector_all("svg.iteration-view g.span title", "els => els.map(e => e.textContent)")
    assert len(tips) > 20
    bars = []  # (name, dur µs, µs after the iteration's start) as the tooltips give them
    for tip in tips:
        head = tip.split("; shapes")[0]
        name, rest = head.rsplit(": ", 1)
        dur, offset = rest.split(" µs at +")
        bars.append((name, float(dur), float(offset.removesuffix(" ms")) * 1000))
    # the timeline's ts counts µs from the job's time base, the model's start_ns the monotonic
    # clock: one constant apart, found from the longest bar (one event of its name and duration)
    name, dur, offset = max(bars, key=lambda bar: bar[1])
    [anchor] = [e for e in events if e["name"] == name and abs(float(e["dur"]) - dur) <= 0.06]
    shift = float(anchor["ts"]) - offset
    for name, dur, offset in bars:
        assert any(e["name"] == name and abs(float(e["dur"]) - dur) <= 0.06
                   and abs(float(e["ts"]) - shift - offset) <= 1.5 for e in events), (name, dur, offset)


def assert_missing(page: Any, model: dict[str, Any]) -> None:
    items = page.eval_on_selector_all("ul.missing li", "els => els.map(e => e.textContent)")
    assert items == model["missing"]


def report_and_model(prof: Path, out: Path, *selection: str, env: dict[str, str] | None = None
                     ) -> dict[str, Any]:
    made = jobprof_cli("report", str(prof), "-o", str(out), *selection, env=env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(out.resolve())
    summary = jobprof_cli("summary", "--json", str(prof), *selection, env=env)
    assert summary.returncode == 0, summary.stderr
    html = out.read_text()
    assert "http://" not in html and "https://" not in html and "src=" not in html  # nothing to fetch
    return json.loads(summary.stdout)


# -- the jobs -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = make_dist(tmp_path_factory.mktemp("acme") / "site", "acme-report",
                     {"acme_report": ACME}, {"acme_steps": "acme_report"})
    return {"PYTHONPATH": str(root)}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("report_ddp"))
    launcher = torchrun(runner, REPO / "examples" / "train_ddp.py", 2, "--steps", str(STEPS))
    runner.run(launcher, {"training_trace": "on", "task_trace": "on", "hccl": "on", "dp": "on"}, timeout=300)
    [prof] = runner.prof_dirs()
    return prof


@pytest.mark.slow
def test_report_in_chromium(ddp: Path, acme: dict[str, str], browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    model = report_and_model(ddp, out, env=acme)
    assert len(model["ranks"]) == 2 and all(r["iterations"]["count"] == STEPS for r in model["ranks"])
    assert "acme_steps" in model["sections"] and model["cross_rank"]
    shot = tmp_path / "report.png"
    page, seen = open_report(browser, out, shot)
    assert_clean_load(seen, out)
    assert shot.stat().st_size > 50_000  # a full page of charts and tables, not a blank one
    assert_findings_in_order(page, model)
    assert {f["key"] for f in model["findings"]} >= {"acme"}
    assert_charts(page, model)
    assert_sections(page, model)
    assert_missing(page, model)
    assert_iteration_view(page, model, ddp)
    tagged = assert_numbers_match(page, model)
    assert tagged > 100  # per-rank breakdown, cross-rank, findings' evidence and every section
    # the third party's numbers are the profile's: its steps are the ranks' iteration counts
    acme_rows = model["sections"]["acme_steps"]["rows"]
    assert [r[1] for r in acme_rows] == [r["iterations"]["count"] for r in model["ranks"]]
    page.close()


@pytest.mark.slow
def test_selection_and_default_output(ddp: Path, browser: Any, tmp_path: Path) -> None:
    made = jobprof_cli("report", str(ddp), "--rank", "1", "--iterations", "3-8", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    out = tmp_path / "report.html"  # the default: report.html in the current directory
    assert made.stdout.strip() == str(out)
    summary = jobprof_cli("summary", "--json", str(ddp), "--rank", "1", "--iterations", "3-8")
    model = json.loads(summary.stdout)
    assert [r["rank"] for r in model["ranks"]] == [1]
    assert sorted({r["iteration"] for r in model["iterations"]}) == list(range(3, 9))
    page, seen = open_report(browser, out)
    assert_clean_load(seen, out)
    assert "iterations 3-8; ranks 1" in page.text_content("p.meta:nth-of-type(2)")
    assert_charts(page, model)
    assert len(page.query_selector_all("svg.breakdown g.bar")) == 6
    assert page.query_selector("svg.rank-busy") is None  # one rank: nothing to compare
    assert_numbers_match(page, model)
    assert_findings_in_order(page, model)
    assert_sections(page, model)
    page.close()


def test_bad_input_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    made = jobprof_cli("report", str(missing), "-o", str(tmp_path / "r.html"))
    assert made.returncode != 0 and str(missing) in made.stderr
    assert not (tmp_path / "r.html").exists()
    made = jobprof_cli("report", str(tmp_path), "-o", str(tmp_path / "no" / "r.html"))
    assert made.returncode == 2 and str(tmp_path / "no") in made.stderr
    made = jobprof_cli("report", str(tmp_path), "-o", str(tmp_path))
    assert made.returncode == 2 and "is a directory" in made.stderr


@pytest.mark.slow
def test_partial_profile_lists_what_is_missing(browser: Any, runner: Runner, tmp_path: Path) -> None:
    launcher = torchrun(runner, runner.script(KILLED, "killed.py"), 2)
    proc = runner.run(launcher, {"training_trace": "on", "hccl": "on"}, timeout=300, check=False)
    assert proc.returncode != 0  # torchrun reports the killed rank
    [prof] = runner.prof_dirs()
    out = tmp_path / "partial.html"
    model = report_and_model(prof, out)
    assert any("rank 1: no end_info" in m for m in model["missing"]), model["missing"]
    assert "unfinished" in [f["key"] for f in model["findings"]]
    page, seen = open_report(browser, out)
    assert_clean_load(seen, out)
    assert_missing(page, model)
    assert_findings_in_order(page, model)
    assert_charts(page, model)
    assert_numbers_match(page, model)
    page.close()


@pytest.mark.slow
def test_long_run_is_binned(browser: Any, runner: Runner, tmp_path: Path) -> None:
    n = 700
    runner.run(LONG.replace("{n}", str(n)), {"training_trace": "on", "task_trace": "off"}, timeout=300)
    [prof] = runner.prof_dirs()
    out = tmp_path / "long.html"
    model = report_and_model(prof, out)
    assert model["ranks"][0]["iterations"]["count"] == n
    page, seen = open_report(browser, out)
    assert_clean_load(seen, out)
    [chart] = page.query_selector_all("svg.breakdown")
    assert len(chart.query_selector_all("g.bar")) == math.ceil(n / math.ceil(n / MAX_BARS)) == 234
    assert "one bar per 3 consecutive iterations" in page.text_content("figure figcaption")
    points = page.get_attribute("svg.rank-times polyline.series", "points").split()
    assert len(points) == 234
    assert_numbers_match(page, model)
    page.close()



SPIKE = """
import time
import torch
from torch import nn
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(12):
    model(torch.randn(2, 4)).sum().backward()
    time.sleep(0.4 if i == 6 else 0.01)  # one iteration 40x the others
    opt.step()
    opt.zero_grad()
"""


def test_one_outlier_iteration_does_not_flatten_the_chart(browser: Any, runner: Runner,
                                                          tmp_path: Path) -> None:
    """The breakdown chart's scale stops at 3x the median bar: the 400 ms iteration is cut and
    marked with its time, the 10 ms ones keep a readable height."""
    runner.run(SPIKE, {"training_trace": "on", "task_trace": "off"})
    [prof] = runner.prof_dirs()
    out = tmp_path / "spike.html"
    model = report_and_model(prof, out)
    times = [r["iteration_ms"] for r in model["iterations"]]
    slowest = max(times)
    page, seen = open_report(browser, out)
    assert_clean_load(seen, out)
    [chart] = page.query_selector_all("svg.breakdown")
    cut = chart.query_selector_all("g.bar.cut")
    values = [c.query_selector("text.cut-value").text_content() for c in cut]
    # the spike, and only bars above 3x the median one (on a loaded machine the first
    # iteration's warm-up can be one too: CI run 87)
    median = sorted(times)[len(times) // 2]
    assert f"{slowest:.0f}" in values and all(float(v) > 3 * median - 1 for v in values), (values, times)
    spike = cut[values.index(f"{slowest:.0f}")]
    tip = spike.query_selector("title").text_content()
    assert f"{slowest:.3f} ms" in tip
    # where to look next: the iteration's timeline file, which exists
    where = tip.split("timeline ", 1)[1].split(";")[0]
    assert (prof / where).is_file(), where
    assert "taller bars are cut" in page.text_content("figure figcaption")
    # a typical bar fills a fair part of the plot (it was under 3% of it, scaled to the outlier)
    heights = [sum(float(r.get_attribute("height")) for r in bar.query_selector_all("rect"))
               for bar in chart.query_selector_all("g.bar:not(.cut)")]
    tallest_cut = sum(float(r.get_attribute("height")) for r in spike.query_selector_all("rect"))
    assert sorted(heights)[len(heights) // 2] > tallest_cut / 6, (heights, tallest_cut)
    assert_numbers_match(page, model)
    page.close()
