"""``jobprof summary``: the per-rank breakdown, the cross-rank comparison and the findings, checked
against a real 2-rank DDP job (gloo, torchrun) whose costs are known because the job sleeps on
purpose: its dataset sleeps in ``__getitem__`` (data wait), the loop sleeps after each step as if
logging (free time), and rank 1 sleeps before every backward from iteration 2 on (a straggler that
rank 0 waits for in DDP's all-reduce).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli, read_csv, torchrun
from jobprof.analysis import breakdown
from jobprof.analysis.profile import Profile
from jobprof.analysis.selection import Selection
from jobprof.analysis.stats import p95
from jobprof.analysis.summary import summarize
from jobprof.engine.manager import PluginManager
from jobprof.plugin.hookspec import hookimpl
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.results import Finding, Section
from jobprof.plugin.values import Iteration

STEPS = 10
SAMPLE_S, BATCH = 0.01, 4  # data wait per iteration >= 40 ms
LOG_S = 0.03  # free time per iteration >= 30 ms
LATE_S = 0.06  # rank 1, before backward, from step 2 on

JOB = f"""
import time, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return {STEPS * BATCH}
    def __getitem__(self, i):
        time.sleep({SAMPLE_S})
        return torch.randn(16), torch.randn(1)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size={BATCH}), 1):
    loss = (model(x) - y).pow(2).mean()
    if rank == 1 and step >= 2:
        time.sleep({LATE_S})
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep({LOG_S})  # "logging"
dist.destroy_process_group()
"""


def profile_of(tmp: Path, task_trace: str) -> Path:
    runner = Runner(tmp)
    launcher = torchrun(runner, runner.script(JOB, "job.py"), 2)
    runner.run(launcher, {"training_trace": "on", "task_trace": task_trace, "hccl": "on", "dp": "on"},
               timeout=400)
    [prof] = runner.prof_dirs()
    return prof


@pytest.fixture(scope="module", params=["on", "off"], ids=["task_trace", "no_task_trace"])
def prof(request, tmp_path_factory) -> Path:
    return profile_of(tmp_path_factory.mktemp(f"summary-{request.param}"), request.param)


def summary(prof: Path, *args: str) -> dict:
    proc = jobprof_cli("summary", "--json", str(prof), *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_parts_add_up_and_show_the_known_costs(prof: Path) -> None:
    model = summary(prof)
    assert [r["rank"] for r in model["ranks"]] == [0, 1]
    rows = model["iterations"]
    assert len(rows) == 2 * STEPS
    for row in rows:
        parts = [row[f"{p}_ms"] for p in breakdown.PARTS]
        assert None not in parts, row  # dp, hccl and training_trace were all on
        assert sum(parts) == pytest.approx(row["iteration_ms"], abs=1e-6), row
        assert min(parts) >= 0, row
        # jobprof's own hand-over at the previous iteration's end: none before iteration 1
        assert (row["profiler_ms"] == 0) == (row["iteration"] == 1), row
        if row["iteration"] >= 3:  # past warm-up
            assert row["data_wait_ms"] >= 1000 * SAMPLE_S * BATCH * 0.95, row
            assert row["free_ms"] >= 1000 * LOG_S * 0.9, row
            if row["rank"] == 0:  # waits for rank 1 in the all-reduce with nothing to compute
                assert row["communication_not_overlapped_ms"] >= 1000 * LATE_S * 0.7, row
    basis = model["ranks"][0]["basis"]["communication_not_overlapped"]
    has_ops = any((prof / "device_0" / "summary").glob("op_statistic_*.csv"))
    assert basis.startswith("compute spans" if has_ops else "blocking collectives")


def test_statistics_match_the_rows(prof: Path) -> None:
    model = summary(prof)
    for rank in model["ranks"]:
        rows = [r for r in model["iterations"] if r["rank"] == rank["rank"]]
        for part in ("iteration", *breakdown.PARTS):
            values = [r[f"{part}_ms"] for r in rows]
            stats = rank["breakdown_ms"][part]
            assert stats["mean"] == pytest.approx(statistics.fmean(values))
            assert stats["median"] == pytest.approx(statistics.median(values))
            assert stats["p95"] == pytest.approx(p95(values))
            assert stats["worst"] == max(values)
            assert rows[values.index(max(values))]["iteration"] == stats["worst_iteration"]
        total = sum(r["iteration_ms"] for r in rows)
        assert sum(rank["share"].values()) == pytest.approx(1.0)
        assert rank["share"]["free"] == pytest.approx(sum(r["free_ms"] for r in rows) / total)
        assert rank["iterations"] == {"count": STEPS, "first": 1, "last": STEPS, "gaps": []}
        assert rank["finished"] and rank["world_size"] == 2 and isinstance(rank["pid"], int)
        # before iteration 1, in none: at least the first batch (the dataset sleeps), and
        # jobprof's own startup a part of it
        startup = rank["startup"]
        assert startup["ms"] >= 1000 * SAMPLE_S * BATCH, startup
        assert 0 <= startup["own_ms"] <= startup["ms"], startup
        assert startup["own_ms"] == pytest.approx(sum(startup["own"].values()), abs=0.01)


def test_the_late_rank_is_named(prof: Path) -> None:
    model = summary(prof)
    cross = model["cross_rank"]
    assert cross["measure"] == "busy" and cross["iterations_compared"] == STEPS
    assert cross["slowest_count"]["1"] >= STEPS - 2, cross["slowest_count"]
    for entry in cross["per_iteration"]:
        assert entry["spread_ms"] == pytest.approx(entry["max_ms"] - entry["min_ms"])
        assert entry["max_ms"] == max(entry["per_rank_ms"].values())
    [straggler] = [f for f in model["findings"] if f["key"] == "straggler"]
    assert straggler["evidence"]["rank"] == 1
    assert straggler["evidence"]["iterations_slower"] >= STEPS - 2
    assert straggler["text"].startswith("rank 1 is ")
    # the data wait is dp's finding, with the share it measured
    bound = {f["evidence"]["rank"]: f for f in model["findings"] if f["key"] == "data_bound"}
    assert sorted(bound) == [0, 1]
    assert all(f["evidence"]["workers"] == 0 and f["evidence"]["share"] > 0.1 for f in bound.values())
    [waiting] = [f for f in model["findings"] if f["key"] == "communication_not_overlapped"]
    assert waiting["evidence"]["rank"] == 0 and "waiting for rank 1" in waiting["text"]
    assert [f["weight"] for f in model["findings"]] == sorted((f["weight"] for f in model["findings"]),
                                                             reverse=True)


def test_terminal_tables_and_numbered_findings(prof: Path) -> None:
    model = summary(prof)
    out = jobprof_cli("summary", str(prof))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for title in ("Ranks", "Iteration time (ms): where it went, per rank", "Across ranks",
                  "Communication (hccl)", "DataLoader", "Findings"):
        assert title in text, title
    # the job's findings numbered; jobprof's own cost apart, after them, never a numbered finding
    job = [f for f in model["findings"] if f["key"] != "profiler"]
    for number, finding in enumerate(job, 1):
        assert f"  {number}. {finding['text']}" in text
    for finding in (f for f in model["findings"] if f["key"] == "profiler"):
        before, after = text.split("\njobprof's own cost\n", 1)
        assert after.startswith(f"  {finding['text']}") and finding["text"] not in before
    mean = model["ranks"][1]["breakdown_ms"]["iteration"]["mean"]
    assert f"{mean:.3f}" in text
    startup = model["ranks"][1]["startup"]["ms"]
    assert "before iteration 1, in no iteration" in text and f"rank 1: {startup / 1e3:,.2f} s" in text


def test_iterations_and_rank_narrow_every_section(prof: Path) -> None:
    model = summary(prof, "--iterations", "3-5")
    assert model["selection"] == {"iterations": "3-5", "ranks": None}
    for rank in model["ranks"]:
        assert rank["iterations"] == {"count": 3, "first": 3, "last": 5, "gaps": []}
        assert rank["startup"] is None  # iteration 1 not selected: nothing said of before it
    assert sorted({r["iteration"] for r in model["iterations"]}) == [3, 4, 5]
    loaders = model["sections"]["dataloader"]
    assert [row[loaders["columns"].index("batches")] for row in loaders["rows"]] == [3, 3]
    if "top_operators" in model["sections"]:  # task_trace on: op_statistic of 3 iterations only
        top = model["sections"]["top_operators"]
        device, op, core, count = top["rows"][0][:4]
        expected = sum(int(r["Count"]) for i in (3, 4, 5) for r in read_csv(
            prof / f"device_{device}" / "summary" / f"op_statistic_{device}_4294967295_{i}.csv")
            if (r["OP Type"], r["Core Type"]) == (op, core))
        assert count == expected
    one = summary(prof, "--rank", "1")
    assert [r["rank"] for r in one["ranks"]] == [1] and one["cross_rank"] is None
    assert {r["rank"] for r in one["iterations"]} == {1}
    for section in one["sections"].values():
        if "device" in section["columns"]:
            assert {row[section["columns"].index("device")] for row in section["rows"]} == {1}


def test_bad_selection_is_refused_clearly(prof: Path) -> None:
    proc = jobprof_cli("summary", str(prof), "--iterations", "9-3")
    assert proc.returncode == 2 and "--iterations '9-3': the range is empty" in proc.stderr
    proc = jobprof_cli("summary", str(prof), "--iterations", "x")
    assert proc.returncode == 2 and "expected N, A-B" in proc.stderr
    proc = jobprof_cli("summary", "--json", str(prof), "--rank", "7")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["missing"] == ["--rank 7: no such rank in this profile (ranks: 0, 1)"]


KILLED = """
import os, signal, time, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 9):
    if rank == 1 and step == 5:
        time.sleep(0.5)  # the sink's last batch reaches the disk (it writes in batches)
        os.kill(os.getpid(), signal.SIGKILL)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_a_killed_rank_is_summarised_with_what_is_missing(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    launcher = torchrun(runner, runner.script(KILLED, "killed.py"), 2)
    proc = runner.run(launcher, {"training_trace": "on", "hccl": "on"}, timeout=300, check=False)
    assert proc.returncode != 0
    [prof] = runner.prof_dirs()
    model = summary(prof)
    by_rank = {r["rank"]: r for r in model["ranks"]}
    assert by_rank[1]["finished"] is False and by_rank[1]["iterations"]["last"] == 4
    assert any(m.startswith("rank 1: no end_info") for m in model["missing"])
    # rank 0 ends by torchrun's SIGTERM (end_info written) or, when that comes late, its SIGKILL
    assert any(f["key"] == "unfinished" and 1 in f["evidence"]["ranks"] for f in model["findings"])
    # rank 0 never finished iteration 5 either (it waited for rank 1); what both have is compared
    assert model["cross_rank"]["iterations_compared"] == 4


def test_paint_partitions_an_iteration() -> None:
    it = Iteration(index=2, start_ns=0, end_ns=100, method="optimizer_step", fp_start_ns=20, bp_end_ns=80)
    spans = {"data_wait": [(5, 15)], "communication": [(60, 90)], "compute": [(20, 70)],
             "forward_backward": [(20, 80)], "refresh": [(80, 100)]}
    parts, basis = breakdown.paint(it, spans)
    # comm not overlapped: 70..90; FP->BP: 20..70; refresh: 90..100; free: 0..5, 15..20
    assert parts == {"profiler": None, "data_wait": 10, "communication_not_overlapped": 20,
                     "forward_backward": 50, "refresh": 10, "free": 10}
    assert basis == {"communication_not_overlapped": "compute spans (task_trace)"}
    parts, basis = breakdown.paint(it, {"communication_blocking": [(75, 85)], "profiler": [(0, 3)]})
    assert parts == {"profiler": 3, "data_wait": None, "communication_not_overlapped": 10,
                     "forward_backward": 55, "refresh": 15, "free": 17}


class Extra:
    """A third-party plugin: a section with a finding, and spans (one shape wrong on purpose)."""

    def __init__(self, spans: object) -> None:
        self.spans = spans

    @hookimpl
    def jobprof_iteration_spans(self, iteration):
        return self.spans(iteration) if callable(self.spans) else self.spans

    @hookimpl
    def jobprof_report_sections(self, profile):
        return [Section("Extra things (ours)", ["rank", "iterations"],
                        [[profile.rank(d), len(profile.iterations(d))] for d in profile.devices],
                        findings=[Finding("extra", "an extra finding", {"n": 1}, weight=3)])]


def test_third_party_spans_and_sections_join_the_model(prof: Path) -> None:
    manager = _loaded()
    # a third-party data-wait source: the first millisecond of every iteration
    manager.register(Extra(lambda it: {"data_wait": [(it.start_ns, it.start_ns + 1_000_000)]}), "extra")
    model = summarize(Profile(prof, Selection("3-4")), manager)
    section = model["sections"]["extra_things"]
    assert section["columns"] == ["rank", "iterations"] and section["rows"] == [[0, 2], [1, 2]]
    extra = {"key": "extra", "text": "an extra finding", "evidence": {"n": 1}, "weight": 3}
    position = model["findings"].index(extra)  # numbered among the heaviest
    assert all(f["weight"] == 3 for f in model["findings"][:position])
    plain = summarize(Profile(prof, Selection("3-4")), _loaded())
    for mine, theirs in zip(model["iterations"], plain["iterations"], strict=True):
        # dp's own waits already cover the start of each iteration's fetch; ours adds what they miss
        assert mine["data_wait_ms"] >= theirs["data_wait_ms"]
        assert mine["iteration_ms"] == theirs["iteration_ms"]


def _loaded() -> PluginManager:
    manager = PluginManager(Reporter())
    manager.load_entry_points()
    return manager


def test_a_plugin_returning_bad_spans_is_disabled_not_fatal(prof: Path) -> None:
    manager = _loaded()
    manager.register(Extra({"data_wait": [(1, "soon")]}), "extra")
    model = summarize(Profile(prof, Selection("3")), manager)
    assert manager.record("extra").status == "failed"
    assert "jobprof_iteration_spans" in manager.record("extra").error
    assert len(model["iterations"]) == 2 and "extra_things" not in model["sections"]
