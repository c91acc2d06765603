"""dp against ground truth: datasets whose ``__getitem__`` sleeps a known time, loops whose
compute takes a known time, with 0 and 2 workers (fork and spawn), read back from the dp CSV
files, the raw records and the master timeline."""

from __future__ import annotations

import json
import statistics
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import Runner, check_timeline, raw, read_csv

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

MODEL = 4294967295
# Stated tolerance: every measured fetch is at least the injected sleeps minus 1 ms, and their
# median at most the injected sleeps plus TOLERANCE_MS (sleep overshoot and Python around it on
# a noisy VM).  The median, not each: a fetch the 2-core CI machine preempted is really that
# long (one of 8 took 38 ms against 12 ms of sleeps in CI run 80, with another job running).
TOLERANCE_MS = 12


def assert_sleeps(durations_ms: list[float], sleeps_ms: float) -> None:
    assert min(durations_ms) >= sleeps_ms - 1, durations_ms
    assert statistics.median(durations_ms) <= sleeps_ms + TOLERANCE_MS, durations_ms

JOB = """
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

class Slow(Dataset):
    def __init__(self, n, delay_ms):
        self.n, self.delay = n, delay_ms / 1000
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.randn(16), torch.randn(1)

class Stream(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(8):
            if info is None or i % info.num_workers == info.id:
                yield torch.randn(16), torch.randn(1)

def train(batches, model, opt, compute_ms):
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        time.sleep(compute_ms / 1000)
        opt.step()

if __name__ == "__main__":
    scenario = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if scenario == "inline":  # num_workers=0, then a second loader: persistent fork workers
        train(DataLoader(Slow(32, 3), batch_size=4), model, opt, 1)
        second = DataLoader(Slow(16, 1), batch_size=4, num_workers=2, persistent_workers=True,
                            pin_memory=True, multiprocessing_context="fork")
        for epoch in range(2):
            train(second, model, opt, 1)
        train(DataLoader(Stream(), batch_size=2, num_workers=2), model, opt, 1)
    elif scenario == "data_bound":  # 2 fork workers, 40 ms per batch each, ~1 ms of compute
        train(DataLoader(Slow(48, 10), batch_size=4, num_workers=2, multiprocessing_context="fork"),
              model, opt, 1)
    elif scenario == "compute_bound":  # 2 spawn workers, 4 ms per batch, 60 ms of compute (the hand-over of a
        # ready batch still costs a few ms here: kept well under the 10% data-bound line)
        loader = DataLoader(Slow(48, 1), batch_size=4, num_workers=2, multiprocessing_context="spawn")
        batches = iter(loader)  # the iterator, and its workers, exist before the first step
        train(batches, model, opt, 60)
"""

# the step tier alone: the operator capture (task_trace, on by default) would shift these timings
ON = {"training_trace": "on", "task_trace": "off", "dp": "on"}


def run(tmp_path_factory, scenario: str, options: dict | None = None) -> Path:
    runner = Runner(tmp_path_factory.mktemp(scenario))
    runner.run(JOB, options or ON, args=[scenario], timeout=240)
    return runner.device_dir()


@pytest.fixture(scope="module")
def inline(tmp_path_factory) -> Path:
    return run(tmp_path_factory, "inline")


@pytest.fixture(scope="module")
def data_bound(tmp_path_factory) -> Path:
    return run(tmp_path_factory, "data_bound")


@pytest.fixture(scope="module")
def compute_bound(tmp_path_factory) -> Path:
    return run(tmp_path_factory, "compute_bound")


def records(device: Path, kind: str) -> list[dict]:
    return [{**r, "_it": i} for i, streams in raw(device).items() for r in streams.get("dp", [])
            if r["k"] == kind]


def ms(ns: int) -> float:
    return ns / 1e6


def csv_files(device: Path) -> list[Path]:
    return sorted((device / "summary").glob(f"dp_0_{MODEL}_*.csv"),
                  key=lambda p: int(p.stem.rsplit("_", 1)[1]))


def test_csv_follows_the_contract(inline):
    files = csv_files(inline)
    assert files, "no dp files"
    actions = set()
    for path in files:
        text = path.read_text()
        assert text.splitlines()[0] == "Device_id,Timestamp(us),Action,Source,Cached Buffer Size"
        rows = read_csv(path)
        stamps = [Decimal(r["Timestamp(us)"].rstrip("\t")) for r in rows]
        assert all(r["Timestamp(us)"].endswith("\t") for r in rows)
        assert stamps == sorted(stamps)
        for r in rows:
            actions.add(r["Action"])
            assert r["Device_id"] == "0"
            if r["Action"] in ("request", "dequeue"):
                assert r["Cached Buffer Size"].isdigit()
            else:
                assert r["Cached Buffer Size"] == "N/A"
    assert actions == {"request", "dequeue", "fetch start", "collate start", "collate end"}


def test_inline_loader_fetch_time_matches_the_sleeps(inline):
    nexts = [r for r in records(inline, "next") if r["l"] == 0]
    assert len(nexts) == 8  # 32 samples / batch 4
    for r in nexts:
        fetch_start, collate_start, collate_end, size = r["f"]
        assert size == 4 and r["w"] == -1
        assert r["t0"] <= fetch_start <= collate_start <= collate_end <= r["t1"]
        assert r["q0"] == 0 and r["q1"] == 0  # nothing is ever prefetched without workers
    assert_sleeps([ms(r["f"][1] - r["f"][0]) for r in nexts], 4 * 3)


def test_every_loader_and_epoch_is_seen(inline):
    # the workers' records went to the loop's process: no second PROF_ or device folder
    assert sorted(p.name for p in inline.parent.iterdir()) == ["device_0"]
    assert sorted(p.name for p in inline.parent.parent.iterdir()) == [inline.parent.name]
    nexts = records(inline, "next")
    by_loader: dict[int, int] = {}
    for r in nexts:
        by_loader[r["l"]] = by_loader.get(r["l"], 0) + 1
    # loader0: 8 batches; loader1: 2 epochs x 4 batches (persistent workers); loader2: 4 batches
    assert by_loader == {0: 8, 1: 8, 2: 4}
    names = {r["l"]: (r["dataset"], r["workers"]) for r in records(inline, "loader")}
    assert names == {0: ("Slow", 0), 1: ("Slow", 2), 2: ("Stream", 2)}
    # worker-side: one fetch record per batch a worker produced, none lost on the way
    fetches = records(inline, "fetch")
    assert sorted((r["l"], r["w"]) for r in fetches) == sorted(
        [(1, w) for w in (0, 1) for _ in range(4)] + [(2, w) for w in (0, 1) for _ in range(2)])
    assert {r["w"] for r in nexts if r["l"] in (1, 2)} == {0, 1}
    assert len({r["pid"] for r in fetches if r["l"] == 1}) == 2  # the same two persistent workers


def test_data_bound_loop(data_bound):
    nexts = records(data_bound, "next")[2:]  # skip the workers' start-up
    fetches = records(data_bound, "fetch")
    assert len(records(data_bound, "next")) == 12 and len(fetches) == 12
    assert_sleeps([ms(r["t1"] - r["t0"]) for r in fetches], 4 * 10)
    for r in fetches:
        assert r["n"] == 4 and r["t0"] <= r["t1"] <= r["t2"]
    # two workers, 40 ms each: a batch every ~20 ms, the loop needs ~1 ms; it waits on every
    # other batch (the two workers finish together) and nothing is ready when it does
    waits = [ms(r["t1"] - r["t0"]) for r in nexts]
    long_waits = [r for r in nexts if ms(r["t1"] - r["t0"]) > 10]
    assert len(long_waits) >= len(nexts) // 2 - 1
    assert statistics.median(r["q0"] for r in long_waits) == 0
    # never longer than one batch takes to fetch, as its worker measured it (both stretch
    # alike when the 2-vCPU machine is loaded; 53.5 ms against a fixed 52 ms bound failed once)
    assert max(waits) <= max(ms(r["t1"] - r["t0"]) for r in fetches) + TOLERANCE_MS


def test_compute_bound_loop_has_batches_buffered(compute_bound):
    nexts = records(compute_bound, "next")
    assert len(nexts) == 12
    steady = nexts[3:]
    # prefetch_factor 2 x 2 workers: the queue is full whenever the loop asks
    assert statistics.median(r["q0"] for r in steady) >= 2
    assert statistics.median(ms(r["t1"] - r["t0"]) for r in steady) < 60 / 4
    fetches = records(compute_bound, "fetch")  # spawned workers report through their own session
    assert len(fetches) == 12
    assert_sleeps([ms(r["t1"] - r["t0"]) for r in fetches], 4 * 1)


def test_data_aug_bound_agrees_with_the_measured_wait(data_bound):
    rows = {int(r["Iteration ID"]): r for f in sorted((data_bound / "summary").glob("step_trace_*.csv"))
            for r in read_csv(f)}
    waits: dict[int, float] = {}
    for r in records(data_bound, "next"):
        waits[r["_it"]] = waits.get(r["_it"], 0) + ms(r["t1"] - r["t0"])
    gaps = []
    for index, row in rows.items():
        if index < 3 or index not in waits:
            continue  # iteration 2's bound also holds jobprof's one-time start (folders, metadata)
        gaps.append(float(row["Data Aug Bound(us)"]) / 1000 - waits[index])
    # the bound is the wait plus the loop's own code between next() and the first forward
    # (unpacking, zero_grad): never less than the wait, typically well under a millisecond
    # more; a background thread taking the GIL at the wrong moment can add a few ms (VM noise)
    assert len(gaps) == 10
    assert min(gaps) >= -0.1, gaps
    assert statistics.median(gaps) <= 1.5, gaps
    assert sum(g <= 3 for g in gaps) >= 8, gaps


def test_master_timeline_has_the_dataloader_tracks(data_bound):
    masters = sorted((data_bound / "timeline").glob("msprof_*.json"))
    assert masters
    worker_pids = {r["pid"] for r in records(data_bound, "fetch")}
    seen_tracks: set[str] = set()
    for path in masters:
        events = check_timeline(path)
        procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
        labels = {e["pid"]: e["args"]["labels"] for e in events if e["name"] == "process_labels"}
        dl = [pid for pid, name in procs.items() if name == "DataLoader"]
        assert len(dl) == 1 and labels[dl[0]] == "CPU"
        seen_tracks |= {e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == dl[0]}
        waits = [e for e in events if e["ph"] == "X" and e["name"] == "next(loader0)"]
        assert len(waits) == 1 and waits[0]["args"]["produced by"] in ("loader0/worker0", "loader0/worker1")
    assert "loader0 wait (Slow)" in seen_tracks
    assert {f"loader0 worker{w} (pid {pid})" for w, pid in
            {(r["w"], r["pid"]) for r in records(data_bound, "fetch")}} <= seen_tracks
    assert len(worker_pids) == 2


def test_summary_gives_the_verdict(data_bound, compute_bound):
    from conftest import jobprof_cli

    out = jobprof_cli("summary", str(data_bound.parent)).stdout
    assert "DataLoader" in out and "data-bound" in out
    assert "waited for the DataLoader" in out
    out = jobprof_cli("summary", str(compute_bound.parent)).stdout
    assert "keeps up" in out and "data-bound" not in out


@pytest.mark.parametrize(("options", "expected"), [
    ({"training_trace": "on"}, False),
    ({"training_trace": "on", "aicpu": "on"}, True),
    ({"training_trace": "on", "aicpu": "on", "dp": "off"}, False),
])
def test_switch_follows_the_contract(tmp_path, options, expected):
    runner = Runner(tmp_path)
    runner.run(JOB, options, args=["data_bound"], timeout=240)
    device = runner.device_dir()
    assert bool(csv_files(device)) is expected
    assert bool(records(device, "next")) is expected
    info = json.loads((device / "info.json.0").read_text())
    assert ("dp" in info["jobprof"]["plugins"]) is expected


def test_channel_delivers_every_record_and_only_to_the_parent(monkeypatch):
    import os
    import time

    from jobprof.plugins.dp.channel import ENV, Receiver, Sender

    got: list[bytes] = []
    receiver = Receiver(got.append)
    try:
        owner = os.environ[ENV]
        assert owner.startswith(f"{os.getpid()}:")
        # this process is not a child of itself: a worker of another process never sends here
        assert Sender.for_this_worker() is None
        monkeypatch.setenv(ENV, f"{os.getppid()}:{owner.split(':', 1)[1]}")
        sender = Sender.for_this_worker()
        assert sender is not None
        for i in range(200):
            sender.send(f"{i}".encode())
            if i % 20 == 0:
                time.sleep(0.01)  # a worker sends one record per batch, not in a tight loop
    finally:
        receiver.close()
    assert [int(m) for m in got] == list(range(200)) and sender.dropped == 0
    assert ENV not in os.environ or not os.environ[ENV].startswith(f"{os.getpid()}:")
    sender.send(b"after close")  # the owner is gone: counted, never raised
    assert sender.dropped == 1
