"""The step trace against ground truth: a loop whose forward, backward, optimizer step and
data loading take known, injected times (sleeps), checked in the files a user reads."""

from __future__ import annotations

import itertools
import json
import statistics
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import check_timeline, raw, read_csv
from jobprof.plugins.training_trace.writer import step_trace_tid

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

# Injected durations (ms) and the stated tolerance: a measured phase is at least the injected
# time minus 1 ms (clock granularity) and at most the injected time plus TOLERANCE_MS (sleep
# overshoot, Python overhead and the real work around the sleeps, on a noisy 2-core VM).
FWD, BWD, OPT, ITEM, BATCH = 30, 20, 15, 5, 4
TOLERANCE_MS = 12
STEPS = 8

GROUND_TRUTH = f"""
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep({BWD} / 1000)
        return grad

class SlowForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        time.sleep({FWD} / 1000)
        return SlowBackward.apply(self.lin(x))

class SlowSGD(torch.optim.SGD):
    def step(self, closure=None):
        out = super().step(closure)
        time.sleep({OPT} / 1000)
        return out

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return {STEPS * BATCH}

    def __getitem__(self, i):
        time.sleep({ITEM} / 1000)
        return torch.randn(8), torch.randn(1)

if __name__ == "__main__":
    model = nn.Sequential(SlowForward(), nn.Linear(8, 1))
    opt = SlowSGD(model.parameters(), lr=0.01)
    loader = DataLoader(Items(), batch_size={BATCH}, num_workers=int(sys.argv[1]))
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""

STAMPS = ["FP Start(us)", "BP End(us)", "Iteration End(us)", "Reduce Start(us)"]
HEADER = ["Device_id", "Iteration ID", "FP Start(us)", "BP End(us)", "Iteration End(us)",
          "Iteration Time(us)", "FP to BP Time(us)", "Iteration Refresh(us)", "Data Aug Bound(us)",
          "Model ID", "Reduce Start(us)", "Reduce Duration(us)"]


def rows(device_dir: Path) -> list[dict[str, str]]:
    files = sorted((device_dir / "summary").glob("step_trace_0_4294967295_*.csv"),
                   key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    return [read_csv(f)[0] for f in files]


def ms(value: str) -> float:
    return float(value) / 1000


def within(measured: float, injected: float) -> bool:
    return injected - 1 <= measured <= injected + TOLERANCE_MS


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    from conftest import Runner

    runner = Runner(tmp_path_factory.mktemp("gt0"))
    runner.run(GROUND_TRUTH, {"training_trace": "on", "task_trace": "off"}, args=["0"])
    return runner


def test_phases_match_injected_times(single_process):
    table = rows(single_process.device_dir())
    assert [int(r["Iteration ID"]) for r in table] == list(range(1, STEPS + 1))
    # medians over iterations 2.. (iteration 1 pays one-time costs such as lazy init)
    later = table[1:]
    fp_bp = statistics.median(ms(r["FP to BP Time(us)"]) for r in later)
    refresh = statistics.median(ms(r["Iteration Refresh(us)"]) for r in later)
    bound = statistics.median(ms(r["Data Aug Bound(us)"]) for r in later)
    total = statistics.median(ms(r["Iteration Time(us)"]) for r in later)
    assert within(fp_bp, FWD + BWD), fp_bp
    assert within(refresh, OPT), refresh
    assert within(bound, ITEM * BATCH), bound
    assert within(total, FWD + BWD + OPT + ITEM * BATCH), total


def test_csv_follows_the_contract(single_process):
    device_dir = single_process.device_dir()
    first = (device_dir / "summary" / "step_trace_0_4294967295_1.csv").read_text()
    assert first.splitlines()[0].split(",") == HEADER
    table = rows(device_dir)
    assert table[0]["Data Aug Bound(us)"] == "N/A"  # no previous iteration
    lines = raw(device_dir)
    for prev, row in itertools.pairwise(table):
        assert row["Model ID"] == "4294967295" and row["Device_id"] == "0"
        for key in STAMPS[:3]:
            assert row[key].endswith("\t"), key  # spreadsheets keep every digit
            assert len(row[key].strip().split(".")[1]) == 3
        # exact: durations are differences of the printed stamps, to the nanosecond
        end, prev_end = Decimal(row["Iteration End(us)"]), Decimal(prev["Iteration End(us)"])
        fp, bp = Decimal(row["FP Start(us)"]), Decimal(row["BP End(us)"])
        assert Decimal(row["Iteration Time(us)"]) == end - prev_end
        assert Decimal(row["FP to BP Time(us)"]) == bp - fp
        assert Decimal(row["Iteration Refresh(us)"]) == end - bp
        # less jobprof's own hand-over at the previous iteration's end, which lies in that gap
        line = lines[int(row["Iteration ID"])]
        it = line["iteration"][0]
        gap = (it["start_ns"], line.get("training_trace", [{}])[0].get("fp_start", it["fp_start_ns"]))
        own = sum(max(0, min(b, gap[1]) - max(a, gap[0])) for a, b in line["profiler"])
        assert own > 0
        assert Decimal(row["Data Aug Bound(us)"]) == fp - prev_end - Decimal(own) / 1000
        assert row["Reduce Start(us)"] == "N/A" and row["Reduce Duration(us)"] == "N/A"


SPAN_ARGS = {"Iteration Time": "Iteration Time(ns)", "FP_BP Time": "FP_BP Time(ns)",
             "Iteration Refresh": "Iteration Refresh(ns)"}


def test_timeline_json_events_nest(single_process):
    device_dir = single_process.device_dir()
    for path in (device_dir / "timeline").glob("step_trace_*.json"):
        events = json.loads(path.read_text())
        assert isinstance(events, list)
        meta = {e["name"] for e in events if e["ph"] == "M"}
        assert {"process_name", "thread_name", "thread_sort_index"} <= meta
        spans = sorted(((e["pid"], e["tid"]), e["ts"], e["ts"] + e["dur"], e["name"])
                       for e in events if e["ph"] == "X")
        names = {s[3].rsplit(" ", 1)[0] for s in spans}
        assert "Iteration" in names
        # the spans in args are in ns, as CANN writes them (msprof-cann6.3 sample: Iteration
        # Time(ns)), equal to the slice's duration (µs)
        for event in (e for e in events if e["ph"] == "X" and e.get("cat") in SPAN_ARGS):
            value = event["args"][SPAN_ARGS[event["cat"]]]
            assert abs(value / 1000 - event["dur"]) < 0.002, event
        by_track: dict = {}
        for track, start, end, name in spans:
            by_track.setdefault(track, []).append((start, end, name))
        for track_spans in by_track.values():
            outer = max(track_spans, key=lambda s: s[1] - s[0])
            for start, end, _ in track_spans:  # everything inside the iteration
                assert outer[0] - 0.002 <= start and end <= outer[1] + 0.002
            inner = sorted(s for s in track_spans if s is not outer)
            for a, b in itertools.pairwise(inner):  # siblings do not overlap
                assert a[1] <= b[0] + 0.002


def test_master_timeline_holds_the_step_trace_track(single_process):
    device_dir = single_process.device_dir()
    masters = sorted((device_dir / "timeline").glob("msprof_*.json"))
    assert len(masters) == len(list((device_dir / "timeline").glob("step_trace_*.json"))) > 0
    for path in masters:
        events = check_timeline(path)
        meta = {(e["name"], json.dumps(e["args"])) for e in events if e["ph"] == "M"}
        assert ("process_name", json.dumps({"name": "Ascend Hardware"})) in meta
        assert ("process_labels", json.dumps({"labels": "NPU 0"})) in meta
        assert ("thread_name", json.dumps({"name": "Step Trace(Model ID:4294967295)"})) in meta
        step = json.loads(path.with_name(path.name.replace("msprof_", "step_trace_")).read_text())
        x = lambda evs: sorted((e["name"], e["ts"], e["dur"]) for e in evs if e["ph"] == "X")  # noqa: E731
        assert x(events) == x(step)  # the same slices, in the device process
        assert {e["tid"] for e in events if e["ph"] == "X"} == {step_trace_tid(4294967295)}


def test_workers_prefetch_hides_the_data_wait(tmp_path):
    from conftest import Runner

    runner = Runner(tmp_path)
    runner.run(GROUND_TRUTH, {"training_trace": "on", "task_trace": "off"}, args=["2"])
    later = rows(runner.device_dir())[2:]
    bound = statistics.median(ms(r["Data Aug Bound(us)"]) for r in later)
    # 2 workers make a 20 ms batch while the loop computes for ~65 ms: little or no wait
    assert bound < ITEM * BATCH / 2, bound


def test_fp_and_bp_points_name_modules(tmp_path):
    from conftest import Runner

    runner = Runner(tmp_path)
    # module "1" (the Linear after the slow module) starts the forward: FP Start moves
    # past the 30 ms forward sleep; BP End at "0.lin" is where the backward really ends
    runner.run(GROUND_TRUTH, {"training_trace": "on", "task_trace": "off", "fp_point": "1",
                              "bp_point": "0.lin"}, args=["0"])
    later = rows(runner.device_dir())[1:]
    fp_bp = statistics.median(ms(r["FP to BP Time(us)"]) for r in later)
    bound = statistics.median(ms(r["Data Aug Bound(us)"]) for r in later)
    assert within(fp_bp, BWD), fp_bp
    assert within(bound, ITEM * BATCH + FWD), bound
    records = raw(runner.device_dir())[3]["training_trace"]
    assert records[0]["fp_source"] == "fp_point" and records[0]["bp_source"] == "bp_point"


def test_unmatched_point_falls_back_and_says_so(tmp_path):
    from conftest import Runner

    runner = Runner(tmp_path)
    proc = runner.run(GROUND_TRUTH, {"training_trace": "on", "task_trace": "off", "fp_point": "encoder.nope"},
                      args=["0"])
    assert "fp_point 'encoder.nope' matched no module" in proc.stderr
    later = rows(runner.device_dir())[1:]
    assert within(statistics.median(ms(r["FP to BP Time(us)"]) for r in later), FWD + BWD)
