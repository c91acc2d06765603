"""Views of many ranks (``jobprof.analysis.scale``): findings grouped across ranks, distributions
instead of per-rank tables above RANK_TABLE_LIMIT ranks, the report's heatmap and straggler view.

Most tests build summary models synthetically (the views are pure functions of the model); one
slow test replicates the ranks of a real 2-rank profile's ``summary --json`` to 40 ranks and
opens its report in headless Chromium (as tests/test_report.py does).
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
from test_report import (
    assert_clean_load,
    assert_findings_in_order,
    assert_numbers_match,
    browser,
    open_report,
)

from conftest import REPO, Runner, jobprof_cli, torchrun
from jobprof.analysis import findings, scale
from jobprof.analysis.breakdown import PARTS
from jobprof.analysis.report import render as report
from jobprof.analysis.stats import describe
from jobprof.analysis.summary import cross_rank
from jobprof.cli.summary import render
from jobprof.plugin.results import Finding, Section

__all__ = ["browser"]  # the module-scoped Chromium fixture of test_report

MB = 1024 * 1024


# -- synthetic models ---------------------------------------------------------------------------

def _row(rank: int, it: int, ms: float, comm: float | None) -> dict[str, Any]:
    parts = {"profiler": 0.1 * ms, "data_wait": None, "communication_not_overlapped": comm,
             "forward_backward": 0.6 * ms - (comm or 0.0), "refresh": 0.1 * ms, "free": 0.2 * ms}
    return {"rank": rank, "device": rank, "iteration": it, "start_ns": it * 10**8, "skipped": False,
            "iteration_ms": ms, **{f"{p}_ms": v for p, v in parts.items()}}


def _entry(rank: int, rows: list[dict[str, Any]], finished: bool = True) -> dict[str, Any]:
    index = [r["iteration"] for r in rows]
    series = {"iteration": [r["iteration_ms"] for r in rows],
              **{p: [r[f"{p}_ms"] for r in rows] for p in PARTS}}
    total = sum(series["iteration"])
    return {"rank": rank, "device": rank, "hostname": f"node{rank // 8}", "pid": "1", "finished": finished,
            "iteration_method": "optimizer_step", "world_size": None,
            "iterations": {"count": len(rows), "first": index[0] if index else None,
                           "last": index[-1] if index else None, "gaps": []},
            "breakdown_ms": {k: describe(v, index) for k, v in series.items()},
            "share": {p: (sum(v for v in series[p] if v is not None) / total
                          if total and any(v is not None for v in series[p]) else None) for p in PARTS},
            "basis": {"communication_not_overlapped": "compute spans (task_trace)"}}


def make_model(ranks: int, iterations: int, straggler: int | None = None, seed: int = 1,
               unfinished: tuple[int, ...] = (), missing_comm: tuple[int, ...] = ()) -> dict[str, Any]:
    """A summary model: every rank ~100 ms per iteration (noise), the straggler 40% more compute,
    the others waiting for it in collectives; iteration 1 a warm-up."""
    rng = random.Random(seed)
    rows_by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in range(ranks):
        rows = []
        for it in range(1, iterations + 1):
            ms = (400.0 if it == 1 else 100.0) * rng.uniform(0.97, 1.03)
            comm = None if r in missing_comm else (5.0 if r == straggler else 30.0) * rng.uniform(0.9, 1.1)
            rows.append(_row(r, it, ms, comm))
        rows_by_rank[r] = rows
    model: dict[str, Any] = {
        "schema": "jobprof.summary/test", "prof_dir": "/tmp/PROF_synthetic",
        "selection": {"iterations": None, "ranks": None},
        "ranks": [_entry(r, rows, r not in unfinished) for r, rows in rows_by_rank.items()],
        "iterations": [row for rows in rows_by_rank.values() for row in rows],
        "cross_rank": cross_rank(rows_by_rank),
        "sections": {"top_operators": {
            "title": "Top operators (top 2 per device)", "columns": ["device", "op_type", "total_ms"],
            "headers": ["device", "OP Type", "total ms"],
            "rows": [[r, op, 10.0 + r] for r in range(ranks) for op in ("mm", "add_")],
            "notes": [f"device {r}: 3 more operator types" for r in range(ranks)] + ["a general note"],
            "findings": []}},
        "missing": [],
    }
    model["findings"] = [attrs.asdict(f) for f in findings.rank(findings.core(model), [])]
    return model


def concentration(rank: int, share: float, ops: str = "mm, linear") -> Finding:
    """task_trace's per-rank finding, as it words it."""
    return Finding("operator_concentration",
                   f"rank {rank}: {100 * share:.0f}% of compute task time is in 2 operator type(s) ({ops}) "
                   "of 20: speeding those up is what moves the iteration time",
                   {"rank": rank, "share": share, "types": ops.split(", "), "type_count": 20,
                    "total_ms": 5.0})


# -- the pure functions -------------------------------------------------------------------------

def test_rank_list_is_compact() -> None:
    assert scale.rank_list([0, 1]) == "0, 1"  # as 1- and 2-rank texts always read
    assert scale.rank_list([1, 0, 2, 3, 5, 7, 8]) == "0-3, 5, 7, 8"
    assert scale.rank_list(range(1, 32, 2)) == "1, 3, 5, 7, 9, 11, … 31"
    assert scale.rank_list([]) == ""


def test_distribution_is_nearest_rank() -> None:
    assert scale.distribution([4.0, None, 1.0, 3.0, 2.0]) == {"min": 1.0, "p50": 2.0, "p95": 4.0, "max": 4.0}
    assert scale.distribution([None]) is None
    values = [float(v) for v in range(1, 101)]
    assert scale.distribution(values) == {"min": 1.0, "p50": 50.0, "p95": 95.0, "max": 100.0}
    picked = scale.picks({7: 5.0, 3: 5.0, 9: 1.0})
    assert picked is not None and picked["min"] == (1.0, 9) and picked["max"] == (5.0, 7)


def test_outliers_are_the_slowest_and_those_past_p50() -> None:
    values = {r: 100.0 for r in range(40)} | {5: 130.0, 9: 115.0, 11: 104.0, 12: None}
    assert scale.outliers(values) == [5, 9, 11]  # the 3 slowest (11 is only within 10%)
    values |= {20: 120.0, 21: 112.0}
    assert scale.outliers(values) == [5, 20, 9, 21]  # past p50 x 1.1, beyond the 3 slowest
    assert scale.outliers({}) == []


def test_rank_distribution_of_a_model() -> None:
    model = make_model(40, 12, straggler=7, unfinished=(3,))
    found = scale.rank_distribution(model)
    assert found["ranks"] == found["measured"] == 40
    means = sorted(r["breakdown_ms"]["iteration"]["mean"] for r in model["ranks"])
    it = found["stats"]["iteration"]
    assert it is not None
    assert [it[s]["value"] for s in scale.STATS] == [means[0], means[19], means[37], means[39]]
    for s in scale.STATS:  # every value is the named rank's own
        assert model["ranks"][it[s]["index"]]["breakdown_ms"]["iteration"]["mean"] == it[s]["value"]
    assert found["stats"]["data_wait"] is None
    assert len(found["outliers"]) == scale.SLOWEST_SHOWN
    assert found["unfinished"] == [3] and found["no_iterations"] == []
    assert model["ranks"][found["slowest_index"]]["rank"] == 7  # slowest most often (busy time)
    assert scale.stragglers(model["cross_rank"])[0] == "7"
    assert len(scale.stragglers(model["cross_rank"], top=2)) <= 2


def test_heat_grid_downsamples_into_buckets() -> None:
    rows = [{"rank": r, "iteration": i, "iteration_ms": float(r * 1000 + i),
             "communication_not_overlapped_ms": None if r == 0 else 1.0}
            for r in range(300) for i in range(1, 451) if not (r == 5 and i > 10)]
    grid = scale.heat_grid({"iterations": rows}, scale.iteration_time)
    assert len(grid["rows"]) == 150 and len(grid["columns"]) == 150  # 2 ranks, 3 iterations a cell
    assert grid["rows"][0] == (0, 1) and grid["columns"][-1] == (448, 450)
    assert grid["cells"][0][0] == pytest.approx((1 + 2 + 3 + 1001 + 1002 + 1003) / 6)
    assert grid["cells"][2][10] == pytest.approx(4000 + 32)  # rank 5 has no iteration past 10
    busy = scale.heat_grid({"iterations": [r for r in rows if r["rank"] < 2]}, scale.outside_collectives,
                           columns=500, rows=500)
    assert busy["cells"][0][0] is None and busy["cells"][1][0] == 1000.0
    assert len(scale.heat_grid({"iterations": rows}, scale.iteration_time, 200, 256)["rows"]) <= 256


# -- findings grouped across ranks --------------------------------------------------------------

def test_per_rank_findings_are_grouped() -> None:
    shares = {r: 0.80 for r in range(32)} | {3: 0.95, 4: 0.81, 9: 0.60}
    per_rank = [concentration(r, s) for r, s in shares.items()]
    ranked = findings.rank([Finding("unfinished", "rank(s) 2 did not finish", {"ranks": [2]}, weight=2)],
                           [Section("t", ["a"], [], findings=per_rank)])
    assert [f.key for f in ranked] == ["unfinished", "operator_concentration"]
    group = ranked[1]
    assert group.text.startswith("ranks 0-31 (32 ranks): 80% of compute task time is in 2 operator type(s) "
                                 "(mm, linear) of 20")
    assert "the median by share" in group.text
    assert "share differs by over 10% on rank 9 60%, rank 3 95%" in group.text
    assert group.evidence["ranks"] == list(range(32)) and group.evidence["count"] == 32
    assert group.evidence["outliers"] == [3, 9]
    assert group.evidence["share"] == 0.80 and group.evidence["types"] == ["mm", "linear"]


def test_grouping_leaves_few_and_different_findings() -> None:
    two = [concentration(0, 0.8), concentration(1, 0.7)]
    assert findings.grouped(two) == two  # 1- and 2-rank profiles: one finding per rank, as before
    mixed = [concentration(r, 0.8) for r in range(3)]
    mixed += [concentration(r, 0.8, "conv, relu") for r in range(3, 5)]
    out = findings.grouped(mixed)
    assert len(out) == 3 and out[0].evidence["ranks"] == [0, 1, 2] and out[1:] == mixed[3:]
    other = Finding("acme", "rank 1: acme", {"steps": 3})  # no rank evidence: never grouped
    assert findings.grouped([other] * 4) == [other] * 4


def test_two_findings_of_one_rank_form_two_groups() -> None:
    def bound(rank: int, loader: int, share: float) -> Finding:
        return Finding("data_bound", f"data-bound: rank {rank} loader{loader} (ds): the loop waited for the "
                       f"DataLoader in {100 * share:.0f}% of iteration time",
                       {"rank": rank, "loader": loader, "share": share}, weight=2)
    found = [bound(r, loader, 0.3 + loader / 10) for r in range(4) for loader in (0, 1)]
    out = findings.grouped(found)
    assert [f.evidence["loader"] for f in out] == [0, 1]
    assert [f.evidence["ranks"] for f in out] == [[0, 1, 2, 3]] * 2
    assert out[0].text.startswith("data-bound: ranks 0-3 (4 ranks) loader0 (ds)")


def test_core_findings_of_many_ranks() -> None:
    model = make_model(40, 12, straggler=7)
    keys = [f["key"] for f in model["findings"]]
    assert len(keys) == len(set(keys)), keys  # one finding per key: warm-ups grouped
    [warmup] = [f for f in model["findings"] if f["key"] == "warmup"]
    assert warmup["text"].startswith("ranks 0-39 (40 ranks): iteration 1 took ")
    assert warmup["evidence"]["count"] == 40
    [late] = [f for f in model["findings"] if f["key"] == "straggler"]
    assert late["text"].startswith("rank 7 is ")  # one straggler: as it was
    # three stragglers read as one finding
    model = make_model(40, 12)
    for r in (4, 5, 6):
        for row in model["cross_rank"]["per_iteration"]:
            row["per_rank_ms"][str(r)] = row["median_ms"] * 1.5
        model["cross_rank"]["median_excess"][str(r)] = 0.5
    [late] = [f for f in findings.rank(findings.core(model), []) if f.key == "straggler"]
    assert late.text.startswith("ranks 4-6 (3 ranks) are 50% slower than the ranks' median")
    assert late.evidence["ranks"] == [4, 5, 6]


# -- the terminal -------------------------------------------------------------------------------

def test_terminal_of_many_ranks_shows_distributions() -> None:
    model = make_model(40, 12, straggler=7, unfinished=(3, 30))
    for entry in model["ranks"]:  # rank 21 started last: 9 s before its first forward
        entry["startup"] = {"ms": 9000.0 if entry["rank"] == 21 else 2000.0 + entry["rank"], "own_ms": 300.0,
                            "own": {"calibration": 300.0}}
    model["ranks"][0]["startup"] = None  # one rank with iteration 1 unknown: left out
    text = render(model)
    assert ("before iteration 1, in no iteration (profiling start to the first forward): p50 2.02 s, "
            "the longest 9.00 s (rank 21), over 39 ranks") in text
    assert "Iteration time (ms): where it went, per rank" not in text
    assert "Ranks (40, grouped where they read the same)" in text
    assert re.search(r"^0-2, 4-29, 31-39 +38 +5 +12 +1-12 +optimizer_step +yes$", text, re.M), text
    assert re.search(r"^3, 30 +2 +2 +12 +1-12 +optimizer_step +no \(killed\?\)$", text, re.M), text
    assert "Iteration time (ms): each rank's mean, distributed across 40 ranks" in text
    for stat in scale.STATS:
        assert re.search(rf"^{stat} +\d+\.\d{{3}} +\d+\.\d{{3}} +N/A ", text, re.M), stat
    assert "unfinished rank(s) (no end_info): 3, 30" in text
    assert "slowest ranks by mean iteration time" in text
    across = text.split("Across ranks")[1].split("spread")[0]
    assert ": the 1 rank(s) slowest most often" in across and "39 rank(s) were never the slowest" in across
    assert len(re.findall(r"^ +\d+ +\d+ of 12 ", across, re.M)) <= scale.TOP_STRAGGLERS
    assert re.search(r"^ +7 +12 of 12", across, re.M)
    ops = text.split("Top operators")[1].split("Findings")[0]
    devices = {int(m) for m in re.findall(r"^ +(\d+) +(?:mm|add_) ", ops, re.M)}
    assert 7 in devices and len(devices) == 2, devices
    assert "device 7: 3 more operator types" in ops and "device 8: 3 more" not in ops
    assert "a general note" in ops and "40 devices: only the rows of device 7, rank 7 (slowest)" in ops


def test_terminal_of_few_ranks_is_per_rank() -> None:
    model = make_model(scale.RANK_TABLE_LIMIT, 6, straggler=2)
    text = render(model)
    assert "Iteration time (ms): where it went, per rank" in text and "distributed across" not in text
    assert all(f"device {r}: 3 more operator types" in text for r in range(scale.RANK_TABLE_LIMIT))


# -- the report ---------------------------------------------------------------------------------

def test_report_of_256_ranks_stays_small() -> None:
    model = make_model(256, 200, straggler=100, missing_comm=(5,))
    page = report(model, generated="now")
    assert len(page.encode()) <= 2 * MB, len(page.encode())
    assert 'class="chart heatmap heat-iteration" data-rows="256" data-columns="200"' in page
    assert 'class="chart heatmap heat-busy" data-rows="256" data-columns="200"' in page
    assert page.count('class="chart breakdown"') == 2  # the slowest and the median rank
    assert 'class="chart stragglers"' in page and 'data-rank="100"' in page
    # far more iterations and ranks: still binned to at most 200 x 256 cells
    big = make_model(600, 500, straggler=3)
    page = report(big, generated="now")
    assert len(page.encode()) <= 2 * MB, len(page.encode())
    assert 'data-rows="200" data-columns="167"' in page  # 3 ranks, 3 iterations a cell


def test_report_of_few_ranks_has_no_scale_views() -> None:
    page = report(make_model(2, 5), generated="now")
    assert "heatmap" not in page and "stragglers" not in page and "distributed across" not in page
    page = report(make_model(4, 5), generated="now")  # from 3 ranks: heatmap and straggler view
    assert 'data-rows="4"' in page and 'class="chart stragglers"' in page and "distributed across" not in page


def test_report_of_40_ranks_in_chromium(browser: Any, tmp_path: Path) -> None:
    model = make_model(40, 30, straggler=7, unfinished=(9,))
    out = tmp_path / "r40.html"
    out.write_text(report(model, generated="now"))
    page, seen = open_report(browser, out)
    assert_clean_load(seen, out)
    assert_findings_in_order(page, model)
    assert assert_numbers_match(page, model) > 30  # the distribution's values are ranks' own
    for cls in ("heat-iteration", "heat-busy"):
        box = page.query_selector(f"svg.{cls}").bounding_box()
        assert box and box["width"] > 300 and box["height"] > 200, box
    assert page.eval_on_selector("svg.heat-iteration", "e => e.querySelectorAll('rect.row').length") == 40
    bars = page.eval_on_selector_all("svg.stragglers g.bar", "els => els.map(e => e.dataset.rank)")
    assert bars[0] == "7" and len(bars) <= scale.TOP_STRAGGLERS
    assert "rank 7 (slowest)" in page.text_content("#charts + p.note")
    assert len(page.query_selector_all("table.cross tbody tr")) == len(bars)
    assert len(page.query_selector_all("table.distribution tbody tr")) == 4
    assert "unfinished rank(s) (no end_info): 9" in page.text_content("main")
    rows = page.query_selector_all("section[data-section='top_operators'] tbody tr")
    assert len(rows) == 4  # two ranks' two rows
    page.close()


# -- a real profile, replicated ----------------------------------------------------------------

def replicate(model: dict[str, Any], n: int, straggler: int, slower: float = 1.4) -> dict[str, Any]:
    """``model``'s ranks copied to ``n`` ranks (rank r is a copy of rank r % len), ``straggler``'s
    compute made ``slower`` than the busiest real rank's; the cross-rank comparison and the
    findings computed again."""
    base = model["ranks"]
    out = copy.deepcopy(model)
    out["ranks"], out["iterations"] = [], []
    rows_by_rank: dict[int, list[dict[str, Any]]] = {}

    def busy(row: dict[str, Any]) -> float:
        return row["iteration_ms"] - (row["communication_not_overlapped_ms"] or 0.0)

    # the straggler's busy time is ``slower`` x the busiest real rank's in every iteration: on a
    # loaded machine one real rank's iteration can outrun the other's by more than 1.4x
    peak: dict[int, float] = {}
    for row in model["iterations"]:
        peak[row["iteration"]] = max(peak.get(row["iteration"], 0.0), busy(row))
    for r in range(n):
        src = base[r % len(base)]
        rows = []
        for row in model["iterations"]:
            if row["rank"] == src["rank"]:
                extra = slower * peak[row["iteration"]] - busy(row) if r == straggler else 0.0
                rows.append(dict(row, rank=r, device=r, iteration_ms=row["iteration_ms"] + extra,
                                 forward_backward_ms=(row["forward_backward_ms"] or 0.0) + extra))
        rows_by_rank[r] = rows
        entry = copy.deepcopy(src)
        entry.update(rank=r, device=r)
        index = [row["iteration"] for row in rows]
        for k in ("iteration", "forward_backward"):
            entry["breakdown_ms"][k] = describe([row[f"{k}_ms" if k != "iteration" else "iteration_ms"]
                                                 for row in rows], index)
        out["ranks"].append(entry)
        out["iterations"] += rows
    out["cross_rank"] = cross_rank(rows_by_rank)
    for section in out["sections"].values():
        if scale.per_device(section):
            section["rows"] = [[r, *row[1:]] for r in range(n) for row in section["rows"]
                               if row[0] == base[r % len(base)]["device"]]
    own = findings.core(out)
    per_rank = [Finding(**f) for f in model["findings"] if f["key"] == "operator_concentration"]
    copies = [Finding(f.key, f.text.replace(f"rank {f.evidence['rank']}:", f"rank {r}:"),
                      {**f.evidence, "rank": r}, f.weight)
              for r in range(n) for f in per_rank if f.evidence["rank"] == r % len(base)]
    ranked = findings.rank(own, [Section("t", ["a"], [], findings=copies)])
    out["findings"] = [attrs.asdict(f) for f in ranked]
    return out


@pytest.mark.slow
def test_real_profile_replicated_to_40_ranks(browser: Any, tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    launcher = torchrun(runner, REPO / "examples" / "train_ddp.py", 2, "--steps", "12")
    runner.run(launcher, {"training_trace": "on", "task_trace": "l0", "hccl": "on"}, timeout=300)
    [prof] = runner.prof_dirs()
    made = jobprof_cli("summary", "--json", str(prof))
    assert made.returncode == 0, made.stderr
    model = replicate(json.loads(made.stdout), 40, straggler=13)
    text = render(model)
    assert "distributed across 40 ranks" in text and "per rank\n" not in text
    assert re.search(r"^ +13 +\d+ of \d+ ", text, re.M)
    grouped = [f for f in model["findings"] if f["key"] == "operator_concentration"]
    assert len(grouped) <= 2 and all(f["evidence"]["count"] >= findings.GROUP_MIN if "count" in f["evidence"]
                                     else True for f in grouped)
    out = tmp_path / "r40.html"
    out.write_text(report(model, generated="now"))
    page, seen = open_report(browser, out)
    assert_clean_load(seen, out)
    assert_findings_in_order(page, model)
    assert_numbers_match(page, model)
    assert page.query_selector("svg.heat-iteration") is not None
    assert page.eval_on_selector_all("svg.stragglers g.bar", "els => els.map(e => e.dataset.rank)")[0] == "13"
    page.close()
