"""The dp worker channel under attack: strangers (another uid, or the same uid but not a worker
of the job) connecting to the abstract socket, and malformed records from a worker itself.

A stranger can neither inject a record nor disable dp; a malformed record is dropped and
counted, and the records after it still arrive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Runner, raw

BATCHES = 12

JOB = f"""
import os, sys, time
from pathlib import Path
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 4 * {BATCHES}
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(4)

if __name__ == "__main__":
    sync = Path(sys.argv[2])
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(Slow(), batch_size=4, num_workers=2, multiprocessing_context=sys.argv[1]))
    # workers started, channel open; renamed into place: the test reads it once it exists
    (sync / "ready.tmp").write_text(str(os.getpid()))
    os.replace(sync / "ready.tmp", sync / "ready")
    deadline = time.monotonic() + 60
    while not (sync / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    for x in batches:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
"""

#: a marker seed no iterator has, so an injected record is easy to find
FAKE_SEED = 777


def fake_records(pid: int) -> list[bytes]:
    """What a stranger sends: a short packet (the IndexError of old), then records that were
    well-formed enough to be stored before the channel checked its peers."""
    now = time.monotonic_ns()
    good = [f"{FAKE_SEED},{w},{pid},4,{now - 3000},{now - 2000},{now - 1000},0".encode() for w in (0, 1)]
    return [b"1,2", *good, *good]


def channel_address(pid: int) -> str:
    """The dp socket of process ``pid`` as any local user sees it in /proc/net/unix."""
    prefix = f"@jobprof-dp-{pid}-"
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        path = line.split()[-1] if len(line.split()) > 7 else ""
        if path.startswith(prefix):
            return "\0" + path[1:]
    raise AssertionError(f"no {prefix}* socket in /proc/net/unix")


def attack_as_nobody(address: str) -> int:
    """From a forked child with uid/gid 65534: connect and send; exit status 0 if it connected."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 1
        try:
            import socket

            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(address)
            code = 0
            for message in fake_records(os.getpid()):
                try:
                    sock.send(message)
                except OSError:
                    break  # refused: the owner closed the connection
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


SIBLING = """
import os, socket, sys, time
sys.path.insert(0, sys.argv[2])
from test_dp_channel import fake_records
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.connect("\\0" + sys.argv[1])
print("connected", flush=True)
for message in fake_records(os.getpid()):
    try:
        sock.send(message)
    except OSError:
        break
"""


@pytest.fixture(scope="module")
def attacked(tmp_path_factory) -> dict:
    """One profiled run with a fork-worker DataLoader, attacked by a uid-65534 child and by a
    same-uid process that is not the job's (a sibling the test starts) before the loop runs."""
    if os.geteuid() != 0:
        pytest.skip("dropping to uid 65534 needs root (CI runs as root)")
    tmp = tmp_path_factory.mktemp("attacked")
    sync = tmp / "sync"
    sync.mkdir()
    runner = Runner(tmp)
    done: dict = {}
    job = threading.Thread(target=lambda: done.update(proc=runner.run(
        JOB, {"training_trace": "on", "task_trace": "off", "dp": "on"}, args=["fork", str(sync)],
        timeout=180)))
    job.start()
    try:
        deadline = time.monotonic() + 120
        while not (sync / "ready").exists() and job.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int((sync / "ready").read_text())
        address = channel_address(pid)
        nobody = attack_as_nobody(address)
        sibling = subprocess.run([sys.executable, "-c", SIBLING, address[1:], str(Path(__file__).parent)],
                                 capture_output=True, text=True, timeout=60)
    finally:
        (sync / "go").write_text("")
        job.join(200)
    assert "proc" in done, "the profiled job failed"
    device = runner.device_dir()
    return {"nobody": nobody, "sibling": sibling, "stderr": done["proc"].stderr, "device": device,
            "info": json.loads((device / "info.json.0").read_text())["jobprof"],
            "dp": [r for streams in raw(device).values() for r in streams.get("dp", [])]}


def test_a_foreign_uid_can_neither_inject_nor_disable(attacked):
    assert attacked["nobody"] == 0, "the uid-65534 child could not even connect: the attack did not run"
    assert "dp" in attacked["info"]["plugins"]
    assert not any("collection stopped" in m or "internal error" in m for m in attacked["info"]["messages"])
    fetches = [r for r in attacked["dp"] if r["k"] == "fetch"]
    assert sorted(r["w"] for r in fetches) == sorted([0, 1] * (BATCHES // 2))  # every real batch
    assert {r["l"] for r in fetches} == {0}  # no record of an unknown loader (the fake seed)
    assert len({r["pid"] for r in fetches}) == 2  # the two workers and nobody else
    assert len([r for r in attacked["dp"] if r["k"] == "next"]) == BATCHES
    # reported once, with who it was, and kept in info.json
    lines = [line for line in attacked["stderr"].splitlines() if "refused" in line]
    assert len(lines) == 1 and "uid 65534" in lines[0], attacked["stderr"]
    assert any("refused 2 connection(s)" in m for m in attacked["info"]["messages"])


def test_the_same_uid_outside_the_job_is_refused_too(attacked):
    sibling = attacked["sibling"]
    assert sibling.returncode == 0 and "connected" in sibling.stdout, sibling.stderr
    fetches = [r for r in attacked["dp"] if r["k"] == "fetch"]
    assert len(fetches) == BATCHES and all(r["l"] == 0 for r in fetches)
    assert "refused 2 connection(s)" in attacked["stderr"]  # the sibling is the second


# -- malformed records from a legitimate worker -------------------------------------------------

SEED = 4242


def record(pid: int, *, worker: int = 0, seed: int = SEED, size: int = 4) -> bytes:
    now = time.monotonic_ns()
    return f"{seed},{worker},{pid},{size},{now - 3000},{now - 2000},{now - 1000},0".encode()


def fields(sender: int, **replace: str) -> bytes:
    """A valid record from pid ``sender`` with some fields replaced by text (by name)."""
    now = time.monotonic_ns()
    values = {"seed": str(SEED), "worker": "0", "pid": str(sender), "size": "4", "t0": str(now - 3000),
              "t1": str(now - 2000), "t2": str(now - 1000), "dropped": "0"}
    values.update(replace)
    return ",".join(values.values()).encode()


MALFORMED = {
    "empty": lambda pid: b"",
    "two fields": lambda pid: b"1,2",
    "one field": lambda pid: b"12345",
    "nine fields": lambda pid: fields(pid) + b",0",
    "seven fields": lambda pid: fields(pid).rsplit(b",", 1)[0],
    "trailing comma": lambda pid: fields(pid) + b",",
    "all text": lambda pid: b"a,b,c,d,e,f,g,h",
    "NaN stamp": lambda pid: fields(pid, t0="nan"),
    "inf stamp": lambda pid: fields(pid, t2="inf"),
    "float size": lambda pid: fields(pid, size="4.0"),
    "exponent": lambda pid: fields(pid, t1="1e18"),
    "negative worker": lambda pid: fields(pid, worker="-1"),
    "negative stamp": lambda pid: fields(pid, t0="-5"),
    "plus sign": lambda pid: fields(pid, size="+4"),
    "spaces": lambda pid: fields(pid, worker=" 0"),
    "underscore": lambda pid: fields(pid, dropped="1_0"),
    "unicode digits": lambda pid: fields(pid, worker="\u0661").decode().encode("utf-8"),
    "NUL byte": lambda pid: fields(pid) + b"\0",
    "huge size": lambda pid: fields(pid, size=str(10 ** 30)),
    "seed 2**64": lambda pid: fields(pid, seed=str(2 ** 64)),
    "huge worker id": lambda pid: fields(pid, worker=str(10 ** 9)),
    "huge dropped": lambda pid: fields(pid, dropped=str(2 ** 40)),
    "512+ bytes": lambda pid: fields(pid, seed="0" * 600),
    "4 KiB": lambda pid: b"9" * 4096,
    "pid 0": lambda pid: fields(pid, pid="0"),
    "another pid": lambda pid: fields(pid, pid=str(pid + 1)),
    "stamps out of order": lambda pid: fields(pid, t0=str(time.monotonic_ns()),
                                              t2=str(time.monotonic_ns() - 10 ** 6)),
    "before the channel opened": lambda pid: fields(pid, t0="1", t1="2", t2="3"),
    "in the future": lambda pid: fields(pid, t2=str(time.monotonic_ns() + 10 ** 12)),
    "worker id past num_workers": lambda pid: record(pid, worker=7),
}


def _worker(messages: list[bytes], done_fd: int) -> None:  # pragma: no cover - child
    """A DataLoader worker's part, in a forked child: its first batch opens the sender."""
    from jobprof.plugins.dp.channel import Sender

    sender = Sender.for_this_worker()
    if sender is None:
        os._exit(3)
    for message in messages:
        sender.send(message)
    os.read(done_fd, 1)  # stay connected until the owner has read everything
    os._exit(0 if sender.dropped == 0 else 4)


def run_worker(collector, build: list) -> int:
    """Fork a worker-like child that sends ``build(pid)`` messages; return its exit status once
    the owner drained what it sent."""
    read_fd, write_fd = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.close(write_fd)
            os.read(go_r, 1)
            _worker([b(os.getpid()) for b in build], read_fd)
        finally:
            os._exit(5)  # never back into pytest
    os.close(read_fd)
    os.close(go_r)
    os.write(go_w, b"x")
    receiver = collector._receiver
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # every packet is either taken or counted by the receiver
        receiver.drain()
        with collector._lock:
            taken = len(collector._fetches)
        if taken + getattr(receiver, "malformed", 0) >= len(build):
            break
        time.sleep(0.01)
    os.write(write_fd, b"x")
    os.close(write_fd)
    os.close(go_w)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def collector():
    from jobprof.plugins.dp.loader import LoaderCollector

    collector = LoaderCollector()
    collector._open_channel()
    assert collector._receiver is not None
    # the loader the worker belongs to: two workers, registered as the iterator would
    collector._seeds[SEED] = 0
    collector.names[0] = {"dataset": "Fake", "workers": 2}
    collector._workers[0] = 2
    yield collector
    collector.uninstall()


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_record_is_dropped_and_counted(collector, case):
    status = run_worker(collector, [record, MALFORMED[case], record])
    assert status == 0
    receiver = collector._receiver
    records = collector.take(time.monotonic_ns())
    fetches = [r for r in records if r["k"] == "fetch"]
    # both valid records arrived, the one after the bad one included; the bad one was counted
    assert len(fetches) == 2 and {r["l"] for r in fetches} == {0}
    assert receiver.malformed + collector.invalid == 1
    assert receiver.refused == 0
    assert receiver._thread.is_alive()


def test_a_burst_of_malformed_records_leaves_the_channel_working(collector):
    bad = [MALFORMED[case] for case in sorted(MALFORMED) if case != "worker id past num_workers"]
    status = run_worker(collector, [*bad, record, *bad, record])
    assert status == 0
    receiver = collector._receiver
    fetches = [r for r in collector.take(time.monotonic_ns()) if r["k"] == "fetch"]
    assert len(fetches) == 2
    assert receiver.malformed == 2 * len(bad)
    assert receiver._thread.is_alive()


# -- who counts as a worker -------------------------------------------------------------------

def test_a_grandchild_is_a_worker_too(collector):
    """forkserver: the worker's parent is the fork server, itself a child of the owner."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the fork server
        try:
            grandchild = os.fork()
            if grandchild == 0:
                try:
                    _worker([record(os.getpid()), record(os.getpid(), worker=1)], read_fd)
                finally:
                    os._exit(5)
            _, status = os.waitpid(grandchild, 0)
            os._exit(os.waitstatus_to_exitcode(status))
        finally:
            os._exit(6)
    os.close(read_fd)
    receiver = collector._receiver
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(collector._fetches) < 2 and not receiver.refused:
        receiver.drain()
        time.sleep(0.01)
    os.write(write_fd, b"x")
    os.close(write_fd)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fetches = [r for r in collector.take(time.monotonic_ns()) if r["k"] == "fetch"]
    assert sorted(r["w"] for r in fetches) == [0, 1] and receiver.refused == 0


@pytest.mark.parametrize("vouched", [True, False])
def test_a_worker_reaped_before_its_connection_is_accepted(vouched):
    """A worker that connected, sent and was reaped before the receiver looked cannot be traced
    in /proc: only the owner's list of the workers it started lets its records in."""
    from jobprof.plugins.dp.channel import Receiver, Sender

    got: list[bytes] = []
    started: set[int] = set()
    receiver = Receiver(got.append, known_pids=lambda: started)
    try:
        with receiver._poll_lock:  # the receiver cannot accept meanwhile
            child = os.fork()
            if child == 0:  # pragma: no cover - the worker
                try:
                    sender = Sender.for_this_worker()
                    sender.send(b"sent before exit")
                    os._exit(0 if sender.dropped == 0 else 4)
                finally:
                    os._exit(5)
            if vouched:
                started.add(child)
            _, status = os.waitpid(child, 0)  # reaped: /proc/<pid> is gone
            assert os.waitstatus_to_exitcode(status) == 0
            assert not Path(f"/proc/{child}").exists()
        receiver.drain()
    finally:
        receiver.close()
    assert (got, receiver.refused) == (([b"sent before exit"], 0) if vouched else ([], 1))
