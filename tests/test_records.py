"""The declared records of shared streams (jobprof.plugin.records): a real 2-rank gloo job with
hccl, training_trace (fp_point / bp_point), msproftx, dp (inline and worker batches) and kineto
writes raw records every declaration accepts and reproduces byte for byte; a record not shaped
right reads as None, and the readers of other plugins' streams (kineto, step_trace) skip it."""

from __future__ import annotations

import json
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import Runner, free_port, jobprof_cli
from jobprof.analysis.profile import Profile
from jobprof.plugin.records import (
    BatchRecord,
    CollectiveRecord,
    StepPointsRecord,
    TxRecord,
    WorkerFetchRecord,
    records_of,
)
from jobprof.plugins.dp.records import LoaderRecord

#: every declared record type, by the stream it belongs to
DECLARED: dict[str, tuple[type, ...]] = {
    "hccl": (CollectiveRecord,), "training_trace": (StepPointsRecord,), "msproftx": (TxRecord,),
    "dp": (BatchRecord, WorkerFetchRecord, LoaderRecord)}

JOB = """
import os, sys, threading, time, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, Dataset
from jobprof import mstx


class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.randn(8), torch.randn(1)


def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inline = iter(DataLoader(Slow(), batch_size=4))
    workers = iter(DataLoader(Slow(), batch_size=4, num_workers=1, multiprocessing_context="fork"))
    io = mstx.domain("io")
    long = None
    for step in range(1, 5):
        mstx.mark(f"step {step}")
        x, y = next(inline) if step % 2 else next(workers)
        with mstx.range("compute"):
            mstx.push("forward")
            loss = nn.functional.mse_loss(model(x), y)
            mstx.pop()
            loss.backward()
        io.mark("io marker")
        if step == 1:
            long = mstx.range_start("across iterations")
        if step == 3:
            mstx.range_end(long)
            handoff = mstx.range_start("handoff")
            t = threading.Thread(target=mstx.range_end, args=(handoff,))
            t.start()
            t.join()
        dist.all_reduce(torch.ones(100))
        dist.all_reduce(torch.ones(50, dtype=torch.float64), async_op=True).wait()
        dist.broadcast(torch.ones(10), src=1)
        dist.barrier()
        if rank == 0:
            dist.send(torch.ones(6, dtype=torch.int64), 1)
        else:
            dist.recv(torch.empty(6, dtype=torch.int64), 0)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
"""
OPTIONS = {"training_trace": "on", "fp_point": "0", "bp_point": "Linear", "task_trace": "on", "hccl": "on",
           "msproftx": "on", "dp": "on", "kineto_trace": "on"}


@pytest.fixture(scope="module")
def prof(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("records"))
    runner.run(JOB, OPTIONS, args=[str(free_port())], timeout=300)
    [found] = runner.prof_dirs()
    assert sorted(p.name for p in found.iterdir()) == ["device_0", "device_1"]
    return found


def _lines(device: Path) -> list[bytes]:
    return [line for seg in sorted((device / "data").glob("raw.*.jsonl"))
            for line in seg.read_bytes().splitlines(keepends=True)]


def _encode(index: int, streams: dict[str, list[Any]]) -> bytes:
    """An iteration line as jobprof.files.rawstore.RawWriter encodes it (orjson)."""
    import orjson

    return b'{"index":%d,"streams":%b}\n' % (index, orjson.dumps(streams))


def _typed(stream: str, raw: Any) -> Any:
    """The one declared record that accepts ``raw`` (asserting no other does)."""
    accepted = [r for r in (kind.from_raw(raw) for kind in DECLARED[stream]) if r is not None]
    assert len(accepted) == 1, (stream, raw, accepted)
    return accepted[0]


@pytest.mark.slow
def test_real_records_are_declared_and_rewritten_byte_for_byte(prof: Path) -> None:
    """Every raw record of a shared stream is accepted by exactly one declaration, and each
    iteration line, with its records replaced by ``to_raw()`` of what ``from_raw`` read, encodes
    to the very bytes on disk (same keys, same order, same values)."""
    seen: Counter[str] = Counter()
    variants: set[str] = set()
    for device in sorted(prof.glob("device_*")):
        lines = _lines(device)
        assert len(lines) == 4
        for line in lines:
            parsed = json.loads(line)
            streams = parsed["streams"]
            assert set(DECLARED) <= set(streams), sorted(streams)
            rebuilt = {}
            for stream, records in streams.items():
                if stream not in DECLARED:
                    rebuilt[stream] = records
                    continue
                typed = [_typed(stream, r) for r in records]
                rebuilt[stream] = [t.to_raw() for t in typed]
                for t in typed:
                    seen[type(t).__name__] += 1
                    if isinstance(t, CollectiveRecord):
                        variants |= {f"op {t.op}", f"async {t.is_async}", f"dtype {t.dtype is None}",
                                     f"peer {t.peer is not None}"}
                    elif isinstance(t, TxRecord):
                        variants |= {f"tx {t.kind}", f"et {t.end_thread is not None}",
                                     f"si {t.start_iteration is not None}"}
                    elif isinstance(t, BatchRecord):
                        variants.add(f"produced {t.produced is not None}")
                    elif isinstance(t, StepPointsRecord):
                        variants |= {t.fp_source, t.bp_source}
            assert _encode(parsed["index"], rebuilt) == line
    assert set(seen) == {"CollectiveRecord", "StepPointsRecord", "TxRecord", "BatchRecord",
                         "WorkerFetchRecord", "LoaderRecord"}, seen
    assert seen["CollectiveRecord"] == 2 * 4 * 5 and seen["StepPointsRecord"] == 2 * 4
    # the job made every variant of the shapes: optional keys present and absent, nulls
    assert {"op all_reduce", "op broadcast", "op barrier", "op send", "op recv", "async True", "async False",
            "async None", "dtype True", "dtype False", "peer True", "peer False", "tx m", "tx r", "tx p",
            "et True", "et False", "si True", "si False", "produced True", "produced False", "fp_point",
            "bp_point"} <= variants, variants


@pytest.mark.slow
def test_profile_typed_and_records_of_read_the_declarations(prof: Path) -> None:
    profile = Profile(prof)
    for kind in (CollectiveRecord, StepPointsRecord, TxRecord, BatchRecord, WorkerFetchRecord):
        typed = list(profile.typed(kind))
        raw = [r for r in profile.records(kind.STREAM) if kind.from_raw(r) is not None]
        assert len(typed) == len(raw) > 0, kind
        assert [(d, i) for d, i, _ in typed] == [(r["_device"], r["_iteration"]) for r in raw]
        assert all(isinstance(r, kind) for _, _, r in typed)
    ops = [(d, r.op) for d, _, r in profile.typed(CollectiveRecord, 1)]
    assert {d for d, _ in ops} == {1} and ("recv" in {op for _, op in ops}), ops
    for index, streams in profile.streams(0):
        batches = records_of(streams, BatchRecord)
        assert batches and all(b.loader == (0 if index % 2 else 1) for b in batches), (index, batches)
        assert records_of(streams, StepPointsRecord)[0].fp_source == "fp_point"


def _inject(device: Path) -> None:
    """Add records not shaped as their owners write them to every shared stream of each line
    (after the real ones: training_trace's first record is the iteration's)."""
    bad = {
        "hccl": [{"op": "all_reduce", "start_ns": 5, "end_ns": "late"}, {"start_ns": 1, "end_ns": 2},
                 {"op": 7, "start_ns": 1, "end_ns": 2}, {"op": "all_reduce", "start_ns": 9, "end_ns": 5},
                 {"op": "all_reduce", "start_ns": True, "end_ns": 2}, [1, 2],
                 {"op": "all_reduce", "start_ns": 1, "end_ns": 2, "ranks": "0,1"}],
        "msproftx": [{"k": "m", "m": "x", "s": "1", "e": 2, "t": 1},
                     {"k": "r", "m": 5, "s": 1, "e": 2, "t": 1}, {},
                     {"k": "r", "m": "x", "s": 3, "e": 2, "t": 1}, {"m": "x", "s": 1, "e": 2}],
        "dp": [{"k": "next", "t0": 1}, {"k": "next", "t0": 1, "t1": 2, "f": [1, 2]},
               {"k": "fetch", "pid": 3, "t0": 5, "t1": 4, "t2": 6}, {"k": "fetch", "pid": 3, "t0": 1},
               {"k": "next", "t0": 1, "t1": 2, "l": "loader0"}],
        "training_trace": [{"fp_start": "x"}],
    }
    for seg in sorted((device / "data").glob("raw.*.jsonl")):
        out = []
        for line in seg.read_bytes().splitlines():
            parsed = json.loads(line)
            for stream, records in bad.items():
                parsed["streams"][stream] = parsed["streams"][stream] + records
            out.append(_encode(parsed["index"], parsed["streams"]))
        seg.write_bytes(b"".join(out))


def _rendered(root: Path) -> list[Path]:
    """Every rendered file (timeline/ and summary/ of each device)."""
    return [p for pattern in ("device_*/timeline/*.json", "device_*/summary/*.csv")
            for p in sorted(root.glob(pattern))]


@pytest.mark.slow
def test_readers_skip_malformed_records(prof: Path, tmp_path: Path) -> None:
    """Every file renders the same bytes from a raw store that also holds records no owner
    writes: kineto (all four streams), step_trace and the master timeline's overlap (hccl's),
    and the owners' own writers read through the declarations, which refuse them."""
    clean, dirty = tmp_path / "clean" / prof.name, tmp_path / "dirty" / prof.name
    shutil.copytree(prof, clean)
    shutil.copytree(prof, dirty)
    for device in dirty.glob("device_*"):
        _inject(device)
    for copy in (clean, dirty):  # rendered anew: a writer that fails leaves no file
        for path in _rendered(copy):
            path.unlink()
    out = jobprof_cli("export", str(clean))
    assert out.returncode == 0, out.stderr
    out = jobprof_cli("export", str(dirty))
    assert out.returncode == 0 and "raised" not in out.stderr, out.stderr

    before = {str(p.relative_to(clean)): p.read_bytes() for p in _rendered(clean)}
    names = {Path(p).name.split("_")[0] for p in before}
    assert {"kineto", "step", "hccl", "msprof", "dp", "communication"} <= names, names
    assert sum(Path(p).name.startswith("kineto_") for p in before) == 2 * 4
    assert {str(p.relative_to(dirty)): p.read_bytes() for p in _rendered(dirty)} == before


@pytest.mark.parametrize(("kind", "good", "required"), [
    (CollectiveRecord, {"op": "all_reduce", "seq": 0, "start_ns": 10, "call_end_ns": 11, "end_ns": 20,
                        "dtype": "float32", "peer": None, "async": False, "in_backward": False, "tid": 7,
                        "end_from": "wait", "state": "completed", "group": "0", "group_desc": "default_pg",
                        "ranks": [0, 1], "rank_size": 2, "rank": 0, "backend": "gloo", "count": 100,
                        "bytes": 400}, {"op", "start_ns", "end_ns"}),
    (StepPointsRecord, {"fp_start": 10, "bp_end": None, "fp_source": "fp_point", "bp_source": "auto"},
     {"fp_start", "bp_end"}),
    (TxRecord, {"k": "r", "m": "compute", "d": "default", "s": 10, "e": 20, "t": 7, "et": 8, "si": 1},
     {"m", "s", "e", "t"}),
    (BatchRecord, {"k": "next", "l": 0, "b": 1, "t0": 10, "t1": 20, "q0": None, "q1": 0, "w": -1, "tid": 7,
                   "f": [11, 12, 13, 4]}, {"k", "t0", "t1"}),
    (WorkerFetchRecord, {"k": "fetch", "l": 1, "w": 0, "pid": 99, "n": 4, "t0": 10, "t1": 12, "t2": 13},
     {"k", "t0", "t1", "t2"}),
    (LoaderRecord, {"k": "loader", "l": 0, "dataset": "Slow", "workers": 0},
     {"k", "l", "dataset", "workers"}),
])
def test_a_record_not_shaped_right_is_none(kind: type, good: dict[str, Any], required: set[str]) -> None:
    """Each field of a good record replaced by a value of the wrong kind, each required field
    removed, a span that ends before it starts, and a record that is no object at all: None,
    never an exception.  Optional fields may be absent."""
    assert json.dumps(kind.from_raw(good).to_raw()) == json.dumps(good)
    assert kind.VERSION == 1 and isinstance(kind.STREAM, str)
    for value in (None, [], 7, "x", [good]):
        assert kind.from_raw(value) is None
    wrong = {int: ["1", 1.5, True, [1]], str: [3, [], {"a": 1}], bool: [0, "yes"], list: ["0,1", [1, "2"], 5],
             type(None): [{"x": 1}, 2.5]}
    for key, value in good.items():
        for bad in wrong[type(value)]:
            assert kind.from_raw({**good, key: bad}) is None, (key, bad)
        without = kind.from_raw({k: v for k, v in good.items() if k != key})
        assert (without is None) == (key in required), key
    ends = {CollectiveRecord: ("start_ns", "end_ns"), TxRecord: ("s", "e"), BatchRecord: ("t0", "t1"),
            WorkerFetchRecord: ("t1", "t2")}.get(kind)
    if ends:
        assert kind.from_raw({**good, ends[0]: good[ends[1]] + 1}) is None


def test_records_of_keeps_good_records_in_order() -> None:
    raw = [{"k": "next", "t0": 1, "t1": 2}, {"k": "loader", "l": 0, "dataset": "D", "workers": 0},
           {"k": "next", "t0": "1", "t1": 2}, 5, {"k": "next", "t0": 3, "t1": 4, "l": 2}]
    batches = records_of({"dp": raw}, BatchRecord)
    assert [(b.start_ns, b.loader) for b in batches] == [(1, 0), (3, 2)]
    assert records_of({"dp": raw}, LoaderRecord) == [LoaderRecord(0, "D", 0)]
    assert records_of({}, CollectiveRecord) == []


def test_recorder_hot_path_literals_equal_to_raw() -> None:
    """msproftx keeps dict literals on the user's thread (an object per marker would cost it):
    every shape it builds is exactly ``TxRecord.to_raw`` of what ``from_raw`` reads."""
    from jobprof.plugins.msproftx.recorder import Recorder

    rec = Recorder()
    rec.mark("default", "m1")
    rid = rec.range_start("default", "r1")
    rec.push("io", "p1")
    rec.pop("io")
    other = rec.range_start("default", "ended elsewhere")
    thread = threading.Thread(target=rec.range_end, args=(other,))
    thread.start()
    thread.join()
    start = rec.clock()
    rec.span("record_function", "block", start, start + 5)
    first = rec.take(1, 0, rec.clock())
    rec.range_end(rid)
    later = rec.take(2, rec.clock(), rec.clock())
    records = first + later
    assert {r["k"] for r in records} == {"m", "r", "p"} and any("et" in r for r in records)
    assert any("si" in r for r in later)
    for r in records:
        assert json.dumps(TxRecord.from_raw(r).to_raw()) == json.dumps(r)


def test_raw_lines_hold_what_orjson_refuses_as_json_dumps_writes_it(tmp_path: Path) -> None:
    """The writer encodes with orjson (issue 48: 47 -> 14 us a line on the sink thread) and falls
    back to json.dumps for what orjson refuses: an int beyond 64 bits, a key that is not a str,
    a lone surrogate; a NaN becomes null (no value).  Every line reads back."""
    from jobprof.files import rawstore

    device = tmp_path / "device_0"
    (device / "data").mkdir(parents=True)
    writer = rawstore.RawWriter(device)
    cases = {1: {"s": [{"big": 2**70}]}, 2: {"s": [{"k": {1: "one"}}]}, 3: {"s": [{"v": "\udcff"}]},
             4: {"s": [{"v": float("nan"), "w": "é"}]}, 5: {"s": [[1, 2], {"a": None}]}}
    its = {i: {"iteration": [{"index": i, "start_ns": 10 * i, "end_ns": 10 * i + 5, "method": "optimizer"}]}
           for i in cases}
    writer.append_many([(i, {**its[i], **streams}) for i, streams in cases.items()])
    writer.close()
    back = dict(rawstore.read(device))
    assert sorted(back) == sorted(cases), back
    assert back[1]["s"] == [{"big": 2**70}] and back[2]["s"] == [{"k": {"1": "one"}}], back
    assert back[3]["s"] == [{"v": "\udcff"}] and back[4]["s"] == [{"v": None, "w": "é"}], back
    assert back[5] == {**its[5], **cases[5]}, back
