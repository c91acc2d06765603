"""Inside whichever process runs a dataset fetcher: time the sample fetch and the collate.

Every DataLoader batch is produced by ``_MapDatasetFetcher.fetch`` or
``_IterableDatasetFetcher.fetch`` (``dataset[i]`` for each index, then ``collate_fn``), in the
main process for ``num_workers=0`` and in each worker otherwise.  The wrapper stamps the fetch
start, a wrapped ``collate_fn`` stamps the collate start, and the return stamps the end.  In
a worker the three stamps go to the owning process through :mod:`channel` (a few µs per
batch); in the main process they stay on the fetcher for the ``__next__`` wrapper to pick up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import attrs

from jobprof.plugin import hide_frame
from jobprof.plugins.dp.channel import Sender

_now = time.monotonic_ns


class TimedCollate:
    """Wraps a fetcher's ``collate_fn``; keeps the stamps of the last batch it collated."""

    __slots__ = ("collate_start", "end", "fetch_start", "fn", "size")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.fetch_start = self.collate_start = self.end = self.size = 0

    def __call__(self, data: Any) -> Any:
        self.collate_start = _now()
        try:
            return self.fn(data)
        except BaseException as exc:
            hide_frame(exc)
            raise

    def stamps(self) -> tuple[int, int, int, int]:
        return self.fetch_start, self.collate_start, self.end, self.size


class WorkerLink:
    """Sends worker stamps to the parent; one per process, created on first use."""

    def __init__(self) -> None:
        self._pid = 0
        self._sender: Sender | None = None

    def send(self, info: Any, stamps: tuple[int, int, int, int]) -> None:
        pid = os.getpid()
        if pid != self._pid:  # first batch in this worker (or a fork of a fork)
            self._pid, self._sender = pid, Sender.for_this_worker()
        sender = self._sender
        if sender is not None:
            # base seed identifies the iterator (hence the loader) in the parent
            message = (f"{info.seed - info.id},{info.id},{pid},{stamps[3]},{stamps[0]},{stamps[1]},"
                       f"{stamps[2]},{sender.dropped}")
            sender.send(message.encode())


#: torch has no limit on ``num_workers``; past this a worker id is not a real one
MAX_WORKERS = 1 << 16
#: Linux's PID_MAX_LIMIT (pids are below it everywhere else too)
MAX_PID = 1 << 22
_FIELDS = 8
_DIGITS = 20  # 2**64 has 20 digits


@attrs.frozen
class WorkerFetch:
    """One batch a worker produced, as its record arrived (validated by :func:`parse`)."""

    base_seed: int  # the iterator's base seed: identifies the loader in the owner
    worker: int  # worker id within the loader
    pid: int
    size: int  # samples in the batch
    fetch_start: int  # monotonic ns
    collate_start: int
    end: int
    dropped: int  # records this worker could not send so far


def parse(message: bytes, *, peer_pid: int | None = None, not_before: int = 0,
          not_after: int | None = None) -> WorkerFetch:
    """The record in ``message``, or ValueError: exactly 8 unsigned decimal integers, each in
    range; the pid that of the connected peer (when known); the three stamps in order inside
    [``not_before``, ``not_after``] (the channel's lifetime: the same monotonic clock)."""
    fields = message.split(b",")
    if len(fields) != _FIELDS:
        raise ValueError(f"{len(fields)} fields, not {_FIELDS}")
    # bytes.isdigit is ASCII only: no sign, space, underscore, exponent, nan or inf gets through
    if not all(f.isdigit() and len(f) <= _DIGITS for f in fields):
        raise ValueError("a field is not an unsigned decimal integer")
    record = WorkerFetch(*(int(f) for f in fields))
    if record.base_seed >= 1 << 64 or record.worker >= MAX_WORKERS or record.size >= 1 << 31 \
            or record.dropped >= 1 << 32 or not 0 < record.pid < MAX_PID:
        raise ValueError("a field is out of range")
    if peer_pid is not None and record.pid != peer_pid:
        raise ValueError(f"pid {record.pid} sent by pid {peer_pid}")
    upper = _now() if not_after is None else not_after
    if not not_before <= record.fetch_start <= record.collate_start <= record.end <= upper:
        raise ValueError("stamps out of order or outside the channel's lifetime")
    return record


def timed_fetch(original: Callable[[Any, Any], Any], link: WorkerLink,
                worker_info: Callable[[], Any]) -> Callable[[Any, Any], Any]:
    def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
        start = _now()
        collate = fetcher.collate_fn
        if type(collate) is not TimedCollate:
            collate = fetcher.collate_fn = TimedCollate(collate)
        collate.collate_start = 0
        try:
            batch = original(fetcher, possibly_batched_index)  # StopIteration: no batch, no record
        except BaseException as exc:
            hide_frame(exc)
            raise
        end = _now()
        collate.fetch_start, collate.end = start, end
        if not collate.collate_start:
            collate.collate_start = end
        try:
            collate.size = len(possibly_batched_index) if fetcher.auto_collation else 1
        except TypeError:
            collate.size = 1
        info = worker_info()
        if info is not None:
            link.send(info, collate.stamps())
        return batch

    fetch.__wrapped__ = original  # type: ignore[attr-defined]
    return fetch
