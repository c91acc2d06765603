"""The process that iterates DataLoaders: every batch it asks for, waits for and receives.

Patches, at class level so iterators and loaders that already exist are covered too:

- ``_BaseDataLoaderIter.__init__``: names the loader (``loader0``, ``loader1``, ... in order
  of first use) and, before a multi-worker iterator starts its workers, opens the channel
  they report through;
- ``_BaseDataLoaderIter.__next__`` (single- and multi-process): request and ready stamps,
  the batches already buffered before and after, the worker that produced the batch;
- ``_MultiProcessingDataLoaderIter._process_data``: which worker that was;
- the dataset fetchers (see :mod:`fetch`), also run by forked workers; spawned workers
  install them through their own (inert) jobprof session.

The training thread only appends one tuple per batch; records are built in
:meth:`LoaderCollector.take`, which the core runs on its sink thread shortly after the iteration
ends (a deferred hand-over), so it selects by time and pops from thread-safe deques.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from jobprof.plugin import BatchRecord, WorkerFetchRecord, hide_frame
from jobprof.plugins.dp import fetch
from jobprof.plugins.dp.channel import Receiver
from jobprof.plugins.dp.records import LoaderRecord

_now = time.monotonic_ns
#: batches remembered while no iteration takes them (a loop that never ends an iteration, or a
#: stopped session); beyond it batches are counted, not kept
MAX_PENDING = 100_000


def buffered(it: Any) -> int | None:
    """Batches produced by workers and not yet handed to the loop (None: cannot tell)."""
    if not it._num_workers:
        return 0  # a single-process loader produces on demand: nothing is ever prefetched
    try:
        ready = sum(1 for info in it._task_info.values() if len(info) == 2)  # arrived out of order
        ready += it._data_queue.qsize()
        if getattr(it, "_pin_memory_thread", None) is not None:  # not yet pinned
            ready += it._worker_result_queue.qsize()
        return ready
    except (AttributeError, NotImplementedError, OSError):  # qsize() is not on every platform
        return None


class LoaderCollector:
    def __init__(self) -> None:
        self._loaders: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._by_id: dict[int, int] = {}  # samplers that cannot be weakly referenced
        self.names: dict[int, dict[str, Any]] = {}  # loader index -> description
        self._seeds: dict[int, int] = {}  # iterator base seed -> loader index
        self._batches: deque[tuple] = deque()  # appended by the loop's thread(s)
        self._fetches: list[fetch.WorkerFetch] = []  # appended by the receiver thread
        self._worker_pids: set[int] = set()  # every worker our iterators started
        self._workers: dict[int, int] = {}  # loader index -> most workers any of its iterators had
        self._receiver: Receiver | None = None
        self._lock = threading.RLock()  # reentrant: a SIGTERM handler may end the session in here
        self._restore: list[tuple[Any, str, Any]] = []
        self.dropped: dict[int, int] = {}  # worker pid -> records lost on the way
        self.overflow = 0  # batches not kept: MAX_PENDING were waiting
        self.invalid = 0  # worker records dropped at take(): a worker id the loader does not have
        self.link = fetch.WorkerLink()
        self.channel: Receiver | None = None  # the receiver once closed

    # -- install ---------------------------------------------------------------------------
    def install(self, torch: Any) -> None:
        from torch.utils.data import _utils, dataloader

        base, multi = dataloader._BaseDataLoaderIter, dataloader._MultiProcessingDataLoaderIter
        worker_info = torch.utils.data.get_worker_info
        self._patch(base, "__init__", self._wrap_init(base.__init__))
        self._patch(base, "__next__", self._wrap_next(base.__next__))
        self._patch(multi, "_process_data", _wrap_process(multi._process_data))
        for cls in (_utils.fetch._MapDatasetFetcher, _utils.fetch._IterableDatasetFetcher):
            self._patch(cls, "fetch", fetch.timed_fetch(cls.fetch, self.link, worker_info))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()
        if self._receiver is not None:
            self._receiver.close()
            self.channel = self._receiver  # its counts stay readable for session_end's report
            self._receiver = None

    def _patch(self, owner: Any, name: str, replacement: Callable) -> None:
        self._restore.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    # -- hot path (training thread) ----------------------------------------------------------
    def _wrap_init(self, original: Callable) -> Callable:
        def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            if getattr(loader, "num_workers", 0) and self._receiver is None:
                self._open_channel()  # before the workers start: they inherit its address
            try:
                original(it, loader, *args, **kwargs)
            except BaseException as exc:
                hide_frame(exc)
                raise
            self._register(it)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        return __init__

    def _wrap_next(self, original: Callable) -> Callable:
        native_id = threading.get_native_id

        def __next__(it: Any) -> Any:
            loader = it.__dict__.get("_jobprof_loader")
            if loader is None:
                loader = self._register(it)
            before = buffered(it)
            start = _now()
            try:
                data = original(it)
            except BaseException as exc:
                hide_frame(exc)
                raise
            end = _now()
            after = buffered(it)
            worker = it.__dict__.pop("_jobprof_worker", -1)
            produced = None
            if not it._num_workers:
                collate = getattr(getattr(it, "_dataset_fetcher", None), "collate_fn", None)
                if type(collate) is fetch.TimedCollate and collate.end >= start:
                    produced = collate.stamps()
            if len(self._batches) < MAX_PENDING:
                self._batches.append((loader, it._num_yielded, start, end, before, after, worker,
                                      native_id(), produced))
            else:
                self.overflow += 1
            return data

        __next__.__wrapped__ = original  # type: ignore[attr-defined]
        return __next__

    def _register(self, it: Any) -> int:
        sampler = getattr(it, "_index_sampler", None)
        with self._lock:
            try:
                index = self._loaders.get(sampler)
            except TypeError:  # not weakly referenceable / not hashable
                index = self._by_id.get(id(sampler))
            if index is None:
                index = len(self.names)
                try:
                    self._loaders[sampler] = index
                except TypeError:
                    self._by_id[id(sampler)] = index
                self.names[index] = {"dataset": type(getattr(it, "_dataset", None)).__name__,
                                     "workers": int(getattr(it, "_num_workers", 0) or 0)}
            seed = getattr(it, "_base_seed", None)
            if seed is not None:
                self._seeds[seed] = index
            workers = getattr(it, "_num_workers", 0)
            if isinstance(workers, int) and workers > self._workers.get(index, 0):
                self._workers[index] = workers  # num_workers may be changed between epochs
            for worker in getattr(it, "_workers", None) or ():  # started by the original __init__
                pid = getattr(worker, "pid", None)
                if isinstance(pid, int) and len(self._worker_pids) < MAX_PENDING:
                    self._worker_pids.add(pid)
        it.__dict__["_jobprof_loader"] = index
        return index

    def _open_channel(self) -> None:
        with self._lock:
            if self._receiver is None:
                try:
                    self._receiver = Receiver(self._received, with_peer=True,
                                              known_pids=lambda: self._worker_pids)
                except Exception:  # no Unix sockets here: the loop-side records still work
                    pass

    def _received(self, message: bytes, peer: Any) -> None:  # receiver thread (or drain)
        # ValueError for anything but a well-formed record from that very worker: the receiver
        # counts it in its ``malformed`` and goes on
        receiver = self._receiver
        record = fetch.parse(message, peer_pid=peer.pid,
                             not_before=receiver.opened_ns if receiver is not None else 0)
        with self._lock:
            if len(self._fetches) < MAX_PENDING:
                self._fetches.append(record)
            else:
                self.overflow += 1

    # -- iteration end ---------------------------------------------------------------------
    def take(self, end_ns: int) -> list[dict[str, Any]]:
        """The records of everything that happened up to ``end_ns``, oldest first."""
        receiver = self._receiver
        if receiver is not None:  # a batch dequeued by end_ns was sent before it was queued
            receiver.drain()
        elif not self._batches and not self._fetches:
            return []  # no DataLoader ran (or none since the last iteration): nothing to build
        pending, batches = self._batches, []
        # one consumer (in order), producers only append: peek-then-pop is safe; later batches
        # (a burst of iterations confirmed together) stay for the next call
        while pending and pending[0][2] <= end_ns:
            batches.append(pending.popleft())
        with self._lock:
            fetches, self._fetches = self._fetches, []
            mine = [f for f in fetches if f.end <= end_ns]
            if len(mine) < len(fetches):
                self._fetches[:0] = [f for f in fetches if f.end > end_ns]
        records: list[dict[str, Any]] = []
        used: Counter[int] = Counter()
        # the stream's declared records (jobprof.plugin.records), built here off the training thread
        for loader, number, start, end, before, after, worker, tid, produced in batches:
            used[loader] += 1
            records.append(BatchRecord(start, end, loader, number, before, after, worker, tid,
                                       None if produced is None else tuple(produced)).to_raw())
        for f in mine:
            loader = self._seeds.get(f.base_seed, -1)
            if f.worker >= self._workers.get(loader, fetch.MAX_WORKERS):  # the loader has no such worker
                self.invalid += 1
                continue
            used[loader] += 1
            if f.dropped:
                self.dropped[f.pid] = max(self.dropped.get(f.pid, 0), f.dropped)
            records.append(WorkerFetchRecord(f.fetch_start, f.collate_start, f.end, loader, f.worker,
                                             f.pid, f.size).to_raw())
        for loader in sorted(used):
            if loader in self.names:
                about = self.names[loader]
                records.append(LoaderRecord(loader, about["dataset"], about["workers"]).to_raw())
        return records


def _wrap_process(original: Callable) -> Callable:
    def _process_data(it: Any, data: Any, worker_idx: int, *args: Any, **kwargs: Any) -> Any:
        it.__dict__["_jobprof_worker"] = worker_idx
        try:
            return original(it, data, worker_idx, *args, **kwargs)
        except BaseException as exc:  # a worker's error, re-raised here
            hide_frame(exc)
            raise

    _process_data.__wrapped__ = original  # type: ignore[attr-defined]
    return _process_data
