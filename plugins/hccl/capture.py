"""Capture every torch.distributed operation at its ``c10d`` dispatcher operator.

Why there: ``dist.all_reduce`` and friends, and DistributedDataParallel's bucket all-reduces
issued from C++, all reach the backend through ``c10d::allreduce_`` & co.  jobprof registers a
kernel for those operators at the ``Autograd`` dispatch key (they have none of their own): it
stamps the call, re-dispatches below autograd to the real backend kernel (gloo, NCCL, ...), and
records the operation.  No other operator is touched, so the rest of the job runs at full speed.

When an operation ends (every end is an upper bound of the true one; ``end_from`` says which):

* ``completion``: the work's future completion callback, run by the backend's thread (gloo),
  for ``async_op=True`` calls and the operations DDP issues from C++.  It needs Python's GIL, so
  it can come late while another thread runs Python (up to the 5 ms switch interval, more on an
  oversubscribed CPU); each is a GIL hand-over, which is most of what hccl costs a DDP step.
* ``wait``: ``Work.wait()`` returned.  Synchronous Python calls wait at once and end only so
  (no callback: cheaper, as exact); for the others the first of this and the callback wins.
  Works without a future (gloo send/recv, reduce_scatter_tensor) end so too, or
  ``observed``: the hand-over found them completed (so too a future whose callback did not
  get the GIL within ``GRACE_S`` of the hand-over).
* ``backward end``: DistributedDataParallel's reducer waits for every bucket all-reduce before
  ``backward()`` returns, so BP End bounds those issued by the autograd engine.
* ``cuda events``: CUDA tensors (NCCL): the backend times the collective with CUDA events
  (``_enable_collectives_timing``); the record keeps the host start and the measured device
  duration.  Written, not verified on a GPU here.

An operation belongs to the iteration in which it started (what step_trace's Reduce pairs
need); one still running when that iteration is handed over goes to the first iteration handed
over after it ended, with its true start.  Whatever started before the first iteration ended
goes into iteration 1.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from jobprof.plugin import CollectiveRecord, Iteration, hide_frame
from jobprof.plugins.hccl.collectives import OPERATORS, Collective, chunks

#: records waiting for their iteration (about 1 KB each); beyond this the oldest are dropped
#: and counted (a job whose iterations stopped ending, a stopped session)
MAX_RECORDS = 20_000
#: how long a hand-over waits for completion callbacks that wait for the GIL
GRACE_S = 0.5
#: how a work's end is learnt: its future's callback, wait() (no future), CUDA events (polled)
_FUTURE, _WAIT, _DEVICE = "future", "wait", "device"


def _tensors(value: Any) -> list[Any]:
    """The tensors of an argument: a tensor, a list of them, or a list of lists."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for item in value:
            out.extend(_tensors(item))
        return out
    return [value] if hasattr(value, "element_size") else []


class Capture:
    """One process's collective recorder; ``take`` hands over an iteration's operations."""

    def __init__(self, torch: Any, warn: Callable[[str], None]) -> None:
        from torch._C import _distributed_c10d as c10d

        self._torch, self._warn = torch, warn
        #: Any, like the rest of torch: its stubs type Work.wait, which _patch_wait replaces
        self._c10d: Any = c10d
        self._done: deque[dict[str, Any]] = deque()
        #: works not ended yet: id(work) -> (record, work, how its end is learnt, its future)
        self._open: dict[int, tuple[dict[str, Any], Any, str, Any]] = {}
        self._groups: dict[str, dict[str, Any]] = {}  # by group name
        self._lib: Any = None
        self._wait_original: Any = None
        self.dropped = 0
        self.errors: list[str] = []
        self.recorded = 0

    # -- install / uninstall -------------------------------------------------------------------
    def install(self) -> None:
        torch = self._torch
        lib = torch.library.Library("c10d", "IMPL")
        try:
            for opname, collective in OPERATORS.items():
                packet = getattr(torch.ops.c10d, opname, None)
                if packet is None:  # an operator this torch does not have
                    continue
                lib.impl(opname, self._kernel(packet.default, collective), "Autograd", with_keyset=True)
        except Exception:
            lib._destroy()
            raise
        self._lib = lib
        self._patch_wait()

    def uninstall(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        if self._wait_original is not None:
            self._c10d.Work.wait = self._wait_original
            self._wait_original = None

    def _kernel(self, op: Any, collective: Collective) -> Callable[..., Any]:
        schema = op._schema.arguments
        # (position, name, default) of the arguments the record reads; the dispatcher may hand
        # trailing arguments over by keyword, or leave defaulted ones out
        def where(name: str | None) -> tuple[int, str, Any] | None:
            if name is None:  # no such argument in this collective (no schema argument is unnamed)
                return None
            for i, arg in enumerate(schema):
                if arg.name == name:
                    return i, name, arg.default_value
            return None

        wanted = (where(collective.chunk), where(collective.peer), where("async_op"),
                  where("process_group"))
        below, record = self._torch._C._after_autograd_keyset, self._record
        # the C++ call under OpOverload.redispatch: that Python frame would show in the
        # traceback of every error a collective raises (unprofiled it has none)
        handle = getattr(op, "_handle", None)
        redispatch = getattr(handle, "redispatch_boxed", None) or op.redispatch
        clock = time.monotonic_ns

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            start = clock()
            # straight to the next kernel (the backend's), not a new dispatch from the top
            try:
                out = redispatch(keyset & below, *args, **kwargs)
            except BaseException as exc:
                hide_frame(exc)
                raise
            try:
                values = [None if w is None else args[w[0]] if w[0] < len(args)
                          else kwargs.get(w[1], w[2]) for w in wanted]
                chunk, peer, is_async, process_group = values
                record(collective, chunk, peer, is_async, process_group, out, start)
            except Exception as exc:  # never into the job: counted and reported once at exit
                if len(self.errors) < 5:
                    self.errors.append(f"{collective.name}: {exc!r}")
            return out

        return kernel

    def _patch_wait(self) -> None:
        original, finished = self._c10d.Work.wait, self._finished

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(work, *args, **kwargs)
            except BaseException as exc:
                finished(id(work), "wait", failed=True)
                hide_frame(exc)
                raise
            finished(id(work), "wait")
            return result

        wait.__doc__ = original.__doc__
        self._c10d.Work.wait = wait
        self._wait_original = original

    # -- on the calling thread -----------------------------------------------------------------
    def _record(self, collective: Collective, chunk: Any, peer: Any, is_async: Any, process_group: Any,
                out: Any, start: int) -> None:
        pg = self._c10d.ProcessGroup.unbox(process_group)
        group = self._groups.get(pg.group_name) or self._group(pg)
        tensors = _tensors(chunk)
        first = tensors[0] if tensors else None
        try:  # who issued it: a Python caller, or the autograd engine (DDP's reducer, from C++)
            in_backward = sys._getframe(2).f_code.co_name == "_engine_run_backward"
        except ValueError:  # no Python frame at all: a C++ thread (CUDA autograd threads)
            in_backward = True
        record = {
            "op": collective.name,
            "group": group,  # replaced by its fields at hand-over
            "seq": group["calls"],
            "start_ns": start,
            "call_end_ns": time.monotonic_ns(),
            "end_ns": None,
            "chunk_count": sum(t.numel() for t in tensors),
            "chunk_bytes": sum(t.numel() * t.element_size() for t in tensors),
            "dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
            "peer": peer,
            "async": bool(is_async) if is_async is not None else None,
            "in_backward": in_backward,
            "tid": threading.get_native_id(),
        }
        group["calls"] += 1
        self.recorded += 1
        work = self._c10d.Work.unbox(out[-1] if isinstance(out, tuple) else out)
        key = id(work)  # unique while the work is held in _open
        if first is not None and first.is_cuda:
            self._time_on_device(pg, group)
            self._open[key] = (record, work, _DEVICE, None)
            return
        if record["async"] is False and not in_backward:
            # a synchronous Python call: it waits at once, and wait() ends it with no
            # callback (each callback costs a GIL hand-over on the backend's thread)
            self._open[key] = (record, work, _WAIT, None)
            return
        try:
            future = work.get_future()
        except RuntimeError:  # this work type has no future: wait(), or a later look, ends it
            self._open[key] = (record, work, _WAIT, None)
            return
        self._open[key] = (record, work, _FUTURE, future)
        future.add_done_callback(lambda fut: self._finished(key, "completion", fut))

    def _group(self, pg: Any) -> dict[str, Any]:
        group = {"name": pg.group_name, "desc": pg.group_desc, "size": pg.size(), "rank": pg.rank(),
                 "backend": pg.name(), "ranks": None, "calls": 0, "timed": False}
        # now, once per group: the sink may hand the records over after destroy_process_group
        # emptied torch's registry of groups (a job's last iterations, at exit)
        group["ranks"] = self._global_ranks(group)
        self._groups[group["name"]] = group
        return group

    def _time_on_device(self, pg: Any, group: dict[str, Any]) -> None:
        if not group["timed"]:
            group["timed"] = True
            try:
                pg._enable_collectives_timing()
            except Exception as exc:
                self._warn(f"hccl: cannot time collectives of group {group['name']} on the device "
                           f"({exc!r}); their durations are N/A")

    def _finished(self, key: int, source: str, future: Any = None, failed: bool = False) -> None:
        """Stamp the end of the work ``key`` (on whichever thread saw it first) and queue its
        record.  Both the completion callback and ``wait()`` returning come after the true end,
        late by the wait for Python's GIL, so the first of them is the closer bound."""
        end = time.monotonic_ns()
        entry = self._open.pop(key, None)
        if entry is None:  # the other one was first, or not a work of ours
            return
        record = entry[0]
        record["end_ns"], record["end_from"] = end, source
        if future is not None:
            try:
                future.value()
            except Exception:  # the collective failed (a peer died, a timeout)
                failed = True
        record["state"] = "failed" if failed else "completed"
        self._queue(record)

    def _queue(self, record: dict[str, Any]) -> None:
        done = self._done
        if len(done) >= MAX_RECORDS:
            done.popleft()
            self.dropped += 1
        done.append(record)

    # -- on the sink thread --------------------------------------------------------------------
    def take(self, iteration: Iteration) -> list[dict[str, Any]]:
        """The operations started by the end of ``iteration`` that have ended, as raw records.

        An operation belongs to the iteration in which it started; one still running when that
        iteration is handed over goes to the first iteration handed over after it ended.  A
        work whose future is complete but whose callback still waits for the GIL is waited for
        (at most ``GRACE_S``), then ended here, so it lands in its own iteration.  Only the
        future tells: it is marked done before its callbacks run, the work only after them
        (DDP's last bucket of a job's last iteration was lost in that window).
        """
        end_ns = iteration.end_ns
        deadline = time.monotonic() + GRACE_S
        while True:
            self._poll()
            late = [(key, future) for key, (record, _, kind, future) in list(self._open.items())
                    if kind == _FUTURE and record["start_ns"] <= end_ns and future.done()]
            if not late:
                break
            if time.monotonic() > deadline:  # the callback thread is starved: end them here
                for key, future in late:
                    self._finished(key, "observed", future)  # a no-op if the callback won
                break
            time.sleep(0.001)  # lets the callbacks take the GIL
        done = self._done
        mine: list[dict[str, Any]] = []
        later: list[dict[str, Any]] = []
        for _ in range(len(done)):
            record = done.popleft()
            (mine if record["start_ns"] <= end_ns else later).append(record)
        done.extendleft(reversed(later))
        mine.sort(key=lambda r: r["start_ns"])
        bp_end = iteration.bp_end_ns
        for record in mine:
            # DDP's reducer waits for every bucket before backward returns: BP End bounds them
            if (bp_end is not None and record["in_backward"] and record["op"] == "all_reduce"
                    and record["start_ns"] <= bp_end < record["end_ns"]):
                record["end_ns"], record["end_from"] = bp_end, "backward end"
        return [self._plain(r) for r in mine]

    def _poll(self) -> None:
        for key, (record, work, kind, _) in list(self._open.items()):
            if kind == _FUTURE or not work.is_completed():
                continue
            if kind == _WAIT:
                self._finished(key, "observed")
                continue
            if self._open.pop(key, None) is None:
                continue
            try:
                ms = work._get_duration()
                record["end_ns"] = record["start_ns"] + round(ms * 1e6)
                record["end_from"] = "cuda events"
                record["state"] = "completed" if work.is_success() else "failed"
            except Exception:
                record["end_ns"], record["end_from"] = time.monotonic_ns(), "observed"
                record["state"], record["duration_unknown"] = "completed", True
            self._queue(record)

    def _plain(self, record: dict[str, Any]) -> dict[str, Any]:
        """The raw record of a finished operation, through the stream's declaration
        (:class:`jobprof.plugin.CollectiveRecord`): on the sink thread, once per operation;
        the calling thread only built the working dict."""
        group = record["group"]
        if group["ranks"] is None:
            group["ranks"] = self._global_ranks(group)
        n = chunks(record["op"], group["size"])
        ranks = group["ranks"]
        return CollectiveRecord(
            record["op"], record["start_ns"], record["end_ns"], seq=record["seq"],
            call_end_ns=record["call_end_ns"], dtype=record["dtype"], peer=record["peer"],
            is_async=record["async"], in_backward=record["in_backward"], tid=record["tid"],
            end_from=record["end_from"], state=record["state"],
            duration_unknown=record.get("duration_unknown", False), group=group["name"],
            group_desc=group["desc"], ranks=None if ranks is None else tuple(ranks), rank_size=group["size"],
            rank=group["rank"], backend=group["backend"], count=record["chunk_count"] * n,
            bytes=record["chunk_bytes"] * n).to_raw()

    def _global_ranks(self, group: dict[str, Any]) -> list[int] | None:
        """The group's members as global ranks, from torch.distributed's registry of groups
        (the group object the operator saw may be another Python wrapper of the same group)."""
        try:
            dist = self._torch.distributed
            for pg in list(dist.distributed_c10d._world.pg_group_ranks):
                if pg.group_name == group["name"]:
                    return list(dist.get_process_group_ranks(pg))
        except Exception:
            pass
        return None

    def exit_notes(self) -> list[str]:
        """What the user must know at exit.  Operations that ended after the last finished
        iteration (the final barrier, destroy_process_group) are not written, like every
        record after that point, and need no word."""
        notes = []
        pending = len(self._open)
        if pending > 0:
            notes.append(f"hccl: {pending} collective(s) had not completed at exit and are not in "
                         "any file")
        if self.dropped:
            notes.append(f"hccl: {self.dropped} collective record(s) were dropped: more than "
                         f"{MAX_RECORDS} waited for an iteration to end")
        if self.errors:
            notes.append("hccl: some collectives could not be recorded: " + "; ".join(self.errors))
        return notes
