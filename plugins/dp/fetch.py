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
        return self.fn(data)

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


def parse(message: bytes) -> tuple[int, ...]:
    """(base_seed, worker_id, pid, size, fetch_start, collate_start, end, dropped_so_far)."""
    return tuple(int(v) for v in message.split(b","))


def timed_fetch(original: Callable[[Any, Any], Any], link: WorkerLink,
                worker_info: Callable[[], Any]) -> Callable[[Any, Any], Any]:
    def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
        start = _now()
        collate = fetcher.collate_fn
        if type(collate) is not TimedCollate:
            collate = fetcher.collate_fn = TimedCollate(collate)
        collate.collate_start = 0
        batch = original(fetcher, possibly_batched_index)  # StopIteration: no batch, no record
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
