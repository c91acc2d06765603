"""Counter deltas per operator on the training thread, read by a TorchDispatchMode.

A perf counter group counts the thread that opened it, so the reads must happen on the training
thread at operator boundaries.  The only per-operator Python hook PyTorch offers there is a
``TorchDispatchMode``: its ``__torch_dispatch__`` sees every operator that reaches the Python
dispatch key (below autograd; composite operators such as ``aten::linear`` arrive decomposed,
as ``aten::t`` and ``aten::addmm``).  It reads the group before and after running the operator
and keeps one record per outermost call::

    [start_ns, end_ns, thread_id, "aten::mm", delta_0, delta_1, ...]   (deltas in CounterSpec order)

Cost, stated: every operator then makes a Python call and two ``read`` syscalls (measured on
this project's KVM guest: ~20 us per operator in all, on top of a ~2-4 us small operator; more
with the operator capture running, see the plugin's docstring).  The ``l2`` switch is an
opt-in, costly measurement; the operator durations recorded in the same run include it.

Bounded: at most :data:`MAX_PENDING` records wait for their iteration's hand-over; later ones
are counted as dropped.  A forked child (a DataLoader worker) inherits the mode but its reads
would count the parent's thread: the mode is switched off in the child.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any

from jobprof.ops import perfcounters

#: records waiting for the hand-over (about 100 bytes each)
MAX_PENDING = 200_000


class OpCounter:
    """One process's per-operator counter collector (installed once, on the training thread)."""

    def __init__(self, specs: tuple[perfcounters.CounterSpec, ...], source: str) -> None:
        self.specs = specs
        self.source = source
        self.events = [s.name for s in specs]
        self.pending: deque[list[Any]] = deque()
        self.dropped = 0  # over MAX_PENDING
        self.unread = 0  # the group had not run (multiplexed out): counts unknown, not kept
        self.active = False
        self.installed = False
        self.owner = 0  # native id of the training thread
        self.group: perfcounters.CounterGroup | None = None
        self._mode: Any = None
        self._pid = os.getpid()
        os.register_at_fork(after_in_child=self._forked)

    def install(self) -> str | None:
        """Open the group and enter the mode on the calling (training) thread, once.
        Returns why not, or None."""
        if self.installed:
            return None
        self.installed = True
        group = perfcounters.open_group(self.specs)
        if isinstance(group, perfcounters.Unavailable):
            return group.reason
        try:
            mode = _mode_class()(self)
            mode.__enter__()
        except Exception as exc:
            group.close()
            return f"cannot install the per-operator hook: {type(exc).__name__}: {exc}"
        self.group, self._mode = group, mode
        self.owner = threading.get_native_id()
        self.active = True
        return None

    def remove(self) -> None:
        """Stop counting; leave the mode stack when called on the training thread (elsewhere the
        mode stays but passes every operator straight through)."""
        self.active = False
        mode, self._mode = self._mode, None
        if mode is not None and threading.get_native_id() == self.owner:
            try:
                from torch.utils._python_dispatch import _get_current_dispatch_mode

                if _get_current_dispatch_mode() is mode:
                    mode.__exit__(None, None, None)
            except Exception:
                pass
        if self.group is not None:
            self.group.close()

    def take(self, start_ns: int, end_ns: int) -> list[list[Any]]:
        """Records of operators that started in ``[start_ns, end_ns)`` (sink thread, in
        iteration order; earlier ones belong to no iteration)."""
        pending, taken = self.pending, []
        while pending and pending[0][0] < end_ns:
            record = pending.popleft()
            if record[0] >= start_ns:
                taken.append(record)
        return taken

    def _forked(self) -> None:
        self.active = False
        self.pending = deque()


def _mode_class() -> type:
    """The TorchDispatchMode subclass (built once torch is loaded: never imported at module load)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    monotonic_ns, native_id = time.monotonic_ns, threading.get_native_id

    class CounterMode(TorchDispatchMode):
        def __init__(self, counter: OpCounter) -> None:
            super().__init__()
            self.counter = counter
            self.depth = 0
            self.names: dict[Any, str] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            counter = self.counter
            if self.depth or not counter.active or native_id() != counter.owner:
                return func(*args, **(kwargs or {}))
            group = counter.group
            assert group is not None  # active only once install() set it
            read = group.read
            self.depth = 1
            try:
                start, before = monotonic_ns(), read()
            except OSError:  # closed under us by a session end on another thread
                before = None
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                self.depth = 0
            try:
                after, end = read(), monotonic_ns()
            except OSError:
                return out
            if before is None or after is None:
                counter.unread += 1
                return out
            pending = counter.pending
            if len(pending) >= MAX_PENDING:
                counter.dropped += 1
                return out
            name = self.names.get(func)
            if name is None:
                name = self.names[func] = _op_name(func)
            deltas = [b - a for a, b in zip(before, after, strict=True)]
            pending.append([start, end, counter.owner, name, *deltas])
            return out

    return CounterMode


def _op_name(func: Any) -> str:
    try:
        return func._schema.name  # "aten::mm", as Kineto names it
    except AttributeError:
        return str(func)
