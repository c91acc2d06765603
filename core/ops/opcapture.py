"""Operator capture: PyTorch's own profiler engine (Kineto), cut into per-iteration windows.

Several plugins need the operators of an iteration (task_trace, aicpu, the aic_metrics
groups, l2), so the capture lives in the core: plugins ask for it with
:meth:`jobprof.runtime.session.Session.request_ops` and read the ``ops`` stream at export.

How it stays cheap and bounded:

* Kineto records operators in C++ (RecordFunction callbacks); nothing of ours runs per op.
* At each iteration end the training thread only swaps profiler sessions (disable, enable):
  the same cycle ``torch.profiler`` pays per ``schedule`` step.  Kineto is told to skip the
  Python-facing event list it would build at each disable (``trace_only``, where torch has it:
  ~40% of the disable's cost; :mod:`jobprof.ops.torchapi`).  At the cut Kineto writes the
  window as its own Chrome trace (C++, no Python per event) into a scratch file; the sink
  thread compresses it and hands the iteration references (:meth:`take_windows`; files and
  references by ``jobprof.files.kinetotrace``); the records are built when the iteration is
  read.  The window is then freed, so the process holds the raw data of about one iteration.
  CPU and CUDA take the same path: the trace file holds kernels, copies, fills and their
  launches too, on every supported torch (Kineto's per-event accessors do not).
* Capture starts at the first root-module forward, not at ``import torch``: a DataLoader
  worker never runs one, and nothing before the first forward belongs to an iteration.

The swap is made safe for ``record_function`` blocks that are open across it (the optimizer's
own ``Optimizer.step#...`` block holds the iteration end, users wrap whole loops): Kineto
crashes when a block opened under one profiler session ends under the next, so open blocks
are ended in the old window at the cut and reopened under the same name in the new one.  The
op trace shows such a block as two pieces split at the iteration boundary.

Timestamps: Kineto stamps events on the wall clock (epoch ns); records hold
``time.monotonic_ns()`` values like every other stream (offset measured at each cut).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from jobprof.ops import atfork, memwarn, torchapi
from jobprof.plugin.blocks import Blocks
from jobprof.plugin.blocks import watch as watch_blocks
from jobprof.plugin.clock import wall_minus_monotonic_ns
from jobprof.plugin.frames import hide_frame

# the record layout is the contract's declaration (jobprof.plugin.records, "core streams")
from jobprof.plugin.records import OPS_STREAM

#: the core's stream of operator records (one JSON list per event, its fields declared in
#: jobprof.plugin.records)
STREAM = OPS_STREAM
#: how many finished windows may wait for the sink thread before the oldest is dropped (the
#: sink takes them at least every 0.1 s; a starved one falls this far behind only under heavy
#: load); a drop is reported at exit
MAX_WINDOWS = 256


def _strs(values: Iterable[str]) -> tuple[str, ...]:
    """Detail's converter, typed (attrs' mypy plugin takes the init parameter's type from it)."""
    return tuple(values)


@attrs.frozen
class Detail:
    """What the plugins asked for: the most any of them needs."""

    shapes: bool = False  # input shapes, dtypes, strides, scalar values (task_trace l1, metric groups)
    cuda: bool = False  # also record CUDA kernels, memcpy and memset (CUPTI)
    #: CUPTI metric names measured per kernel (e.g. ``lts__t_sector_hit_rate.pct``); CUDA only.
    #: UNVERIFIED on a GPU so far: Kineto's range-profiler mode, values land in the extra field
    cupti_metrics: tuple[str, ...] = attrs.field(converter=_strs, default=())
    #: the allocators' allocations and frees (Kineto's memory profiling: task_memory)
    memory: bool = False

    def merge(self, other: Detail) -> Detail:
        metrics = tuple(dict.fromkeys(self.cupti_metrics + other.cupti_metrics))
        return Detail(self.shapes or other.shapes, self.cuda or other.cuda, metrics,
                      self.memory or other.memory)


#: slack around a window's [first, last] when matching it to iterations: Kineto's wall clock is
#: mapped to the monotonic one with an offset taken at each cut (a reference too many costs a
#: lookup; one too few would lose operators)
WINDOW_MARGIN_NS = 1_000_000


@attrs.define
class SavedWindow:
    """A finished window, written to its file by the sink thread."""

    name: str
    offset_ns: int
    size: int
    first_ns: int
    last_ns: int
    referenced: bool = False


@attrs.frozen
class WindowRef:
    """What an iteration's ``ops`` stream says about one window it overlaps
    (``jobprof.files.kinetotrace.reference`` makes the raw record of it)."""

    name: str
    offset_ns: int
    size: int
    first: bool
    shapes: bool
    clip_ns: int | None


class OpCapture:
    """One process's Kineto capture, cut at iteration ends (training thread) and read per
    iteration (sink thread)."""

    def __init__(self, torch: Any, detail: Detail, warn: Callable[[str], None]) -> None:
        from torch.autograd import ProfilerActivity

        # Kineto logs every session start/stop on stderr; the job's output is not ours to fill
        # (a level the user set wins)
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self._torch = torch
        self.detail = detail
        self._warn = warn
        self._autograd = torch.autograd
        self._ops = torch.ops.profiler
        experimental = torchapi.experimental_config(list(detail.cupti_metrics) if detail.cuda else [])
        self._config = torchapi.profiler_config(detail.shapes, experimental, detail.memory)
        self._activities = {ProfilerActivity.CPU}
        if detail.cuda:
            self._activities.add(ProfilerActivity.CUDA)
        self.state = "idle"  # idle -> capturing -> stopped
        #: Kineto was set up in this process (its config thread runs): a forked child must not
        #: run the C++ exit handlers (:mod:`jobprof.ops.atfork`)
        self.kineto_started = False
        self.error = ""
        # reentrant: SIGTERM's handler ends the session on the training thread, which it may
        # have interrupted inside cut() (a capture of dynamic mode hung there, holding it)
        self._lock = threading.RLock()
        self._restore_yield: Callable[[], None] | None = None
        # tracked from the session's start: a block opened before the capture starts is
        # still open at its first cut
        self._blocks: Blocks | None
        self._blocks, self._unwatch = watch_blocks(torch.autograd.profiler.record_function)
        self._pid = os.getpid()
        self._cut_ns = 0
        self._window_ns = 0  # when the open window began (monotonic ns)
        #: when the capture started, until the first take_windows(): operators begun after it
        #: and still running at the first iteration's start are that iteration's (clip_ns)
        self._started_ns: int | None = None
        #: finished windows: (Kineto result, wall-minus-monotonic offset in ns, first ns, last ns)
        self._windows: deque[tuple[Any, int, int, int]] = deque()
        #: windows written to files and still needed by a later iteration
        self._saved: deque[SavedWindow] = deque()
        self._numbered = 0
        #: set by the session once the device folder exists: a new scratch file for a window
        #: Kineto writes at the cut (None: the sink thread has Kineto write it)
        self.scratch: Callable[[], Path] | None = None
        self.dropped_windows = 0
        self.outside = 0  # records that fell in no iteration (before the first one)
        #: the thread that started the capture: Kineto's session lives in its thread-local state,
        #: so only that thread may cut or stop it (another thread's disable crashed the process)
        self.owner: int | None = None
        self._owner_local = threading.local()
        #: the session ended on another thread: the capturing thread stops at its next iteration
        #: end (:meth:`stop_on_owner`), and says so here
        self.stop_requested = False
        self._owner_stopped = threading.Event()
        #: the capturing thread ended (and the capture with it) while the session went on
        self.owner_ended = False
        #: capture the operators of every ``every``-th iteration only (1, 1 + every, ...):
        #: between them Kineto is off (option task_trace_every)
        self.every = 1
        #: Kineto is off until the cut before the next sampled iteration
        self.paused = False
        #: when the window of the sampled iteration now running began (after a pause), else None
        self.resumed_ns: int | None = None
        #: blocks :mod:`jobprof.ops.memwarn` keeps until memory profiling is off
        self._probes: list[Any] = []

    def warm_up(self) -> None:
        """Start and stop one empty Kineto session on this thread: the one that imported torch.

        torch registers its Kineto client when it is loaded, and Kineto initialises that client
        at its first session, printing ``ERROR: External init callback must run in same thread
        as registerClient`` on the job's stderr when that session starts on another thread (a
        job that trains in a thread).  A few ms, once, at torch's import."""
        if os.getpid() != self._pid or self._autograd._profiler_enabled():
            return
        self.kineto_started = True
        cpu = {self._autograd.ProfilerActivity.CPU}
        try:
            self._autograd._prepare_profiler(self._config, cpu)
            self._autograd._enable_profiler(self._config, cpu)
        finally:
            self._autograd._disable_profiler()

    # -- training thread -------------------------------------------------------------------
    def start(self) -> None:
        """Enable Kineto (idempotent).  Called at the first root forward."""
        with self._lock:
            if self.state != "idle" or os.getpid() != self._pid:
                return
            try:
                if self._autograd._profiler_enabled():
                    # the user runs torch.profiler themselves: two sessions cannot coexist
                    self._fail("torch.profiler is already running in this process; jobprof's "
                               "operator capture stays off (the other plugins carry on)")
                    return
                self._install_yield()
                blocks = memwarn.probes(self._torch) if self.detail.memory else []
                self._window_ns = time.monotonic_ns()
                self.kineto_started = True
                self._enable_first()
                # c10 warns on stderr as memory profiling meets blocks allocated before it
                self._probes = memwarn.absorb(blocks)
                self.owner = threading.get_ident()
                # stopped on this thread as it ends (a training thread that returns), or its
                # Kineto state dies with it and the process crashes at exit
                self._owner_local.guard = _OwnerExit(self)
                # blocks the program opened before the capture started (a loop-wide block)
                # are recorded from here on, like the ones carried across a cut
                self._started_ns = time.monotonic_ns()
                self._reopen(self._open_blocks())
                self._cut_ns = time.monotonic_ns()
                self.state = "capturing"
            except Exception as exc:
                self._fail(f"cannot start PyTorch's profiler: {type(exc).__name__}: {exc}")

    def sampled(self, index: int) -> bool:
        """Is iteration ``index`` one whose operators are captured?"""
        return (index - 1) % self.every == 0

    def cut(self, until_ns: int, index: int | None = None) -> None:
        """Close the window holding everything up to ``until_ns`` (the end of iteration
        ``index``).  Sampling (:attr:`every`): Kineto pauses here when the next iteration is not
        sampled, and resumes at the cut before the next one that is.

        Iterations confirmed in a burst share one cut: a window already closed after
        ``until_ns`` covers them.
        """
        if self.state != "capturing" or until_ns <= self._cut_ns or os.getpid() != self._pid \
                or threading.get_ident() != self.owner:
            return
        with self._lock:
            if self.state != "capturing":
                return
            take_next = index is None or self.sampled(index + 1)
            try:
                if self.paused:
                    if take_next:
                        self._resume()
                elif take_next:
                    self._swap()
                else:
                    self._swap(pause=True)
            except Exception as exc:
                self._fail(f"PyTorch's profiler failed at an iteration end: {type(exc).__name__}: "
                           f"{exc}")

    def exit_notes(self) -> list[str]:
        """What the user should hear at exit about lost operator data."""
        if not self.dropped_windows:
            return []
        return [f"operator capture: {self.dropped_windows} iteration window(s) were dropped because the "
                f"background exporter fell more than {MAX_WINDOWS} iterations behind (machine "
                "overloaded?); those iterations have no operator files"]

    def stop(self) -> None:
        """Disable Kineto for good (session end; the unfinished window is dropped).  From a
        thread other than the capturing one, only asks (that thread stops it at its next
        iteration end, or as it ends): Kineto's session lives in that thread's state."""
        if self.state == "capturing" and not self.owns_thread() and os.getpid() == self._pid:
            self.stop_requested = True
            return
        with self._lock:
            self._shut()
            mine = os.getpid() == self._pid  # a forked child's copy names the parent's files
            while self._windows:  # windows no iteration took (the capture failed): no file left behind
                result = self._windows.popleft()[0]
                if mine and isinstance(result, Path):
                    result.unlink(missing_ok=True)

    def _install_yield(self) -> None:
        """Give way when the program starts ``torch.profiler`` itself (say, for steps 10-20):
        Kineto allows one session, and the program's must not fail because of ours.  Our
        capture ends there (the operator files stop at that iteration) with one warning."""
        module = self._autograd.profiler
        capture = self
        originals = {name: getattr(module, name) for name in ("_prepare_profiler", "_enable_profiler")
                     if callable(getattr(module, name, None))}

        pending: list[Any] = []  # blocks ended in our window, waiting for the program's session

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                pending.extend(capture._yield())
                try:
                    result = original(*args, **kwargs)
                except BaseException as exc:
                    hide_frame(exc)
                    raise
                if original.__name__ == "_enable_profiler":
                    # continue the program's open blocks under its own session, once it records
                    # (reopened after _prepare_profiler, they began before it and were lost)
                    blocks, pending[:] = pending[:], []
                    capture._reopen(blocks)
                    if capture.state == "stopped":
                        capture._remove_wrappers()
                return result

            call.__wrapped__ = original  # type: ignore[attr-defined]
            return call

        for name, original in originals.items():
            setattr(module, name, wrap(original))

        def restore() -> None:
            for name, original in originals.items():
                if getattr(getattr(module, name, None), "__wrapped__", None) is original:
                    setattr(module, name, original)

        self._restore_yield = restore

    def _yield(self) -> list[Any]:
        """Stop capturing because the program starts its own profiler; returns the blocks
        that were open (ended in our window, to be reopened under the program's session)."""
        with self._lock:
            if self.state != "capturing":
                return []
            blocks = self._open_blocks()
            try:
                self._end(blocks)
                if self.paused:  # Kineto is off (sampling): no window is open
                    raise LookupError
                offset = wall_minus_monotonic_ns()
                result = self._autograd._disable_profiler()
                self._python_flag(False)  # the program's profiler sets it again
                # kept: iterations handed over before the program's profiler took over get
                # their operators (their windows are read later)
                self._windows.append((result, offset, self._window_ns, time.monotonic_ns()))
            except Exception:
                pass
            self.state = "stopped"
            # the wrappers of _prepare/_enable_profiler stay until the program's session is
            # enabled: the blocks are reopened then (:meth:`_install_yield`)
            self._untrack_blocks()
            self.error = ("the program started torch.profiler itself: jobprof's operator capture "
                          "gave way (operator files end at the last iteration before it)")
        self._warn(self.error)
        return blocks

    def _untrack_blocks(self) -> None:
        if self._blocks is not None:
            self._unwatch()
            self._blocks = None

    def _remove_wrappers(self) -> None:
        self._untrack_blocks()
        restore, self._restore_yield = self._restore_yield, None
        if restore is not None:
            restore()

    def forked_child(self) -> None:
        """In a forked child (a DataLoader worker): stop recording there, or the child's copy
        of the session would grow for as long as it lives; and let it exit (Kineto's exit-time
        destructor hangs in a forked child: :mod:`jobprof.ops.atfork`).  Nothing is read or
        written."""
        if self.kineto_started:
            atfork.exit_without_static_destructors()
        if self.state == "capturing":
            self.state = "stopped"
            if self.owns_thread():  # fork copied only the calling thread
                try:
                    self._autograd._disable_profiler()
                except Exception:
                    pass
            self._python_flag(False)

    def _enable_first(self) -> None:
        """Enable Kineto for the first window; if CUPTI metrics were asked for and Kineto
        refuses them (no counter access, an unsupported GPU), capture without them: the
        operators matter more than the metric columns that need them (N/A, said once)."""
        try:
            self._enable()
        except Exception as exc:
            if not (self.detail.cuda and self.detail.cupti_metrics):
                raise
            try:
                self._autograd._disable_profiler()
            except Exception:
                pass
            self._python_flag(False)
            self._config = torchapi.profiler_config(self.detail.shapes, torchapi.experimental_config([]),
                                                   self.detail.memory)
            self._enable()
            self._warn(f"CUPTI metrics unavailable ({type(exc).__name__}: {exc}); operators are "
                       "captured without them, the metric columns that need them are N/A")

    def _enable(self) -> None:
        self._autograd._prepare_profiler(self._config, self._activities)
        self._autograd._enable_profiler(self._config, self._activities)
        self._python_flag(True)

    def _python_flag(self, on: bool) -> None:
        torchapi.set_python_flag(self._autograd.profiler, on)

    def _open_blocks(self) -> list[Any]:
        return list(self._blocks.open.values()) if self._blocks else []

    def _end(self, blocks: list[Any]) -> None:
        """End ``record_function`` blocks in the current Kineto session."""
        exit_op = self._ops._record_function_exit._RecordFunction
        for block in blocks:
            exit_op(block.__dict__["record"])  # not block.record: reading it means "ended"

    def _reopen(self, blocks: list[Any]) -> None:
        """Continue ``record_function`` blocks, same name, under the session now active."""
        enter_op = self._ops._record_function_enter_new
        tracked = self._blocks
        for block in blocks:
            # not one another thread's __exit__ took meanwhile (untracked after a yield: all);
            # a continuation, not an entry (msproftx's ranges go on unbroken)
            if tracked is None:
                block.__dict__["record"] = enter_op(block.name, block.args)
            elif id(block) in tracked.open:
                tracked.reopen(block, enter_op(block.name, block.args))

    def _swap(self, pause: bool = False) -> None:
        """End the window; open the next one (``pause``: not yet, see :meth:`_resume`)."""
        blocks = self._open_blocks()
        self._end(blocks)  # end them in the old window: Kineto cannot carry them across
        offset = wall_minus_monotonic_ns()
        result = self._autograd._disable_profiler()
        self._cut_ns = time.monotonic_ns()
        began, self._window_ns = self._window_ns, self._cut_ns
        self.resumed_ns = None
        if pause:
            self._python_flag(False)
            self.paused = True
            if self.detail.memory:  # blocks for the resume to free (memory profiling off now)
                self._probes = []
                self._probes = memwarn.probes(self._torch)
        else:
            self._enable()
        self._reopen(blocks)  # ... and continue them in the new one (paused: unrecorded)
        if self.scratch is not None:
            # Kineto writes the window here, on the training thread, at the cut: its save holds
            # the GIL, and done later on the sink thread it stalls the training thread at a
            # random point (inside an operator that needs the GIL: measured as that
            # operator's time); the sink thread then only compresses (zlib, outside the GIL)
            try:
                path = self.scratch()
                result.save(str(path))
                result = path
            except Exception:
                pass  # the sink thread saves it instead
        if len(self._windows) >= MAX_WINDOWS:
            dropped = self._windows.popleft()[0]
            if isinstance(dropped, Path):
                dropped.unlink(missing_ok=True)
            self.dropped_windows += 1
        self._windows.append((result, offset, began, self._cut_ns))

    def _resume(self) -> None:
        """Kineto on again for a sampled iteration (no window ends here: none was open)."""
        blocks = self._open_blocks()
        self._end(blocks)  # the unrecorded continuations opened at the pause
        self._enable()
        self.paused = False
        if self._probes:  # what the pause left unseen is freed now: c10 would warn (memwarn)
            self._probes = memwarn.absorb(self._probes)
        self._cut_ns = self._window_ns = self.resumed_ns = time.monotonic_ns()
        self._reopen(blocks)

    def owns_thread(self) -> bool:
        """Is this the thread whose operators the capture records (the one that started it)?"""
        return self.owner is None or threading.get_ident() == self.owner

    def halt(self) -> None:
        """Disable Kineto now, on the capturing thread (a capture of a job in dynamic mode
        ends at this boundary): the finished windows stay for the sink; :meth:`stop` drops
        what no iteration took."""
        with self._lock:
            self._shut()

    def stop_on_owner(self, timeout: float) -> bool:
        """At the session's end on another thread while the capturing thread still runs (a
        daemon thread training at exit): ask it to stop Kineto at its next iteration end and
        wait up to ``timeout`` s.  False if it did not (its iterations are longer, or it is
        blocked): Kineto's session stays open on it as the process ends, which is what a
        daemon thread still computing at exit meets unprofiled too (torch aborts)."""
        owner = self.owner
        if self.state != "capturing" or self.owns_thread() or os.getpid() != self._pid \
                or owner is None or not any(t.ident == owner for t in threading.enumerate()):
            return True
        self.stop_requested = True
        return self._owner_stopped.wait(timeout) or self.state != "capturing"

    def owner_exits(self) -> None:
        """The capturing thread is ending (called on it): stop Kineto while its state lives."""
        with self._lock:
            if self.state == "capturing":
                self.owner_ended = True
                self._shut()

    def _shut(self) -> None:
        """Disable Kineto if this process enabled it, on the thread that did (from any other
        the session is not found, or worse); remove the wrappers (lock held)."""
        if self.state == "capturing" and os.getpid() == self._pid and self.owns_thread():
            if not self.paused:  # paused: Kineto is off already
                try:
                    self._autograd._disable_profiler()
                except Exception:
                    pass
                self._python_flag(False)
            self._probes = []  # freed with memory profiling off: silent
            self._owner_stopped.set()
        self.state = "stopped"
        self._remove_wrappers()

    def _fail(self, message: str) -> None:
        self._shut()
        self.error = message
        self._warn(message)

    # -- sink thread -----------------------------------------------------------------------
    def take_windows(self, start_ns: int, end_ns: int, save: Callable[[Any, int], tuple[str, int]],
                     forget: Callable[[str], None]) -> list[WindowRef]:
        """The windows holding operators that started in ``[start_ns, end_ns)``, saved first.

        ``save(result, number)`` writes one finished window (Kineto's own trace) and returns its
        file name and size.  Called in iteration order; a window no later iteration can need is
        dropped, and ``forget(name)`` deletes its file when no iteration referred to it.
        """
        while self._windows:
            result, offset, began, ended = self._windows.popleft()
            self._numbered += 1
            name, size = save(result, self._numbered)
            del result  # freed here, not when the deque slot is reused
            self._saved.append(SavedWindow(name, offset, size, began, ended))
        started, self._started_ns = self._started_ns, None
        saved = self._saved
        while saved and saved[0].last_ns + WINDOW_MARGIN_NS <= start_ns:
            gone = saved.popleft()
            if not gone.referenced:
                self.outside += 1
                forget(gone.name)
        refs = []
        for window in saved:
            if window.first_ns - WINDOW_MARGIN_NS >= end_ns:
                break
            refs.append(WindowRef(window.name, window.offset_ns, window.size, not window.referenced,
                                  self.detail.shapes, started))
            window.referenced = True
        return refs


class _OwnerExit:
    """Kept in the capturing thread's ``threading.local``: CPython drops it on that thread as
    the thread ends, while its C++ thread-local state (Kineto's session) still exists."""

    def __init__(self, capture: OpCapture) -> None:
        self._capture = weakref.ref(capture)

    def __del__(self) -> None:
        capture = self._capture()
        if capture is not None:
            try:
                capture.owner_exits()
            except Exception:
                pass
