"""Takes finished iterations off the training thread: raw data first, then export.

The training thread only queues the iteration's records (:meth:`Sink.submit`, no encoding,
no I/O).  A background thread wakes every ``FLUSH_S`` (or as soon as ``FLUSH_ITERATIONS``
are waiting), encodes the queued iterations in one warm loop and appends them to the raw
segments with one ``write()``: on this class of machine the same encode + write costs ~20x
more when done cold, once per step, right after the model's compute.  The price is a window:
after SIGKILL the iterations of the last ``FLUSH_S`` may be missing; normal exit, SIGTERM,
uncaught exceptions, ``os._exit`` and ``exec`` (:mod:`jobprof.runtime.exits`) flush everything.

Rendering the per-iteration timeline/summary files costs far more (a file per writer).  When a
detached exporter renders after the job (option ``export`` "background", the default) nothing
is rendered here while the job trains: this thread's Python would hold the GIL the training
thread needs between its operators.  Otherwise (``inline``) the same thread renders under a
CPU-duty budget (``EXPORT_DUTY`` of wall time: it sleeps in proportion to the time it worked)
and reads each iteration back from disk, so memory stays bounded however far it lags.
``close()`` renders whatever is left, at exit / SIGTERM, until its deadline (a SIGTERM gives
``SIGTERM_RENDER_S``: the scheduler's grace period is short and the raw data is complete); what
it did not render is listed in :attr:`Sink.unrendered` for end_info and the ``jobprof export``
hint.  The first OSError (disk full, output removed or
unwritable) stops collection with one message that says which iterations were saved.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from jobprof.analysis.selection import ranges
from jobprof.files import export, fsio, jsonread, kinetotrace, rawstore
from jobprof.plugin.records import OPS_STREAM
from jobprof.plugin.values import WriterSpec
from jobprof.runtime.storage import StorageBudget

#: how often queued iterations are written to the raw segments (the SIGKILL window)
FLUSH_S = 0.1
FLUSH_ITERATIONS = 64
#: share of wall time the background exporter may spend rendering while the job trains
EXPORT_DUTY = 0.01
#: iterations waiting for export that the process remembers (about 100 bytes each); older
#: ones stay on disk as raw data for `jobprof export` (counted in info.json)
MAX_BACKLOG = 50_000
#: room kept on the output's disk (a file of zeros, ``data/.reserve``) and given back when a
#: write fails or the job ends, so that end_info and info.json can still say how the job ended
#: when the disk is full (without them the profile reads as killed)
RESERVE_NAME = ".reserve"
RESERVE_BYTES = 64 * 1024
#: errors that mean the output's disk has no room (a window that cannot be stored then stops
#: collection; any other error stops only the operator capture)
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: how long rendering may go on after a SIGTERM (the rest is left to `jobprof export`)
SIGTERM_RENDER_S = 1.0
#: seconds per compressed window byte an iteration's rendering is predicted to take before this
#: process has rendered one (measured: 200k operators with shapes, 23 MB in 27 s), doubled
PRIOR_S_PER_WINDOW_BYTE = 2.4e-6



@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while the exit-time export runs (only ever at the
    process's end, after the program's code): decoding and rendering an iteration of 200k
    operators builds millions of containers, and each full collection meanwhile traversed
    them all again (40% of that export's time).  They hold no cycles; whatever the program
    leaves is collected as it would be, once the collector is back on."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _importing(frame: Any) -> bool:
    """Is this stack inside Python's import machinery (an import not yet finished)?"""
    return _import_site(frame) is not None


def _import_site(frame: Any) -> str | None:
    """Where this stack's outermost unfinished import was made (``file:line in function``),
    or None when it is in no import."""
    site = None
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            caller = frame.f_back
            while caller is not None and caller.f_code.co_filename.startswith("<frozen importlib"):
                caller = caller.f_back
            if caller is not None:
                site = f"{caller.f_code.co_filename}:{caller.f_lineno} in {caller.f_code.co_name}"
            else:
                site = site or "the import system"
        frame = frame.f_back
    return site


def _window_bytes(streams: Mapping[str, Any]) -> int:
    """The compressed bytes of the operator windows an iteration's ``ops`` stream names."""
    refs = streams.get(OPS_STREAM) or []
    if not kinetotrace.is_reference(refs):
        return 0
    return sum(r["bytes"] for r in refs if isinstance(r, dict) and type(r.get("bytes")) is int)


class Sink:
    def __init__(self, device_dir: Path, meta: export.DeviceMeta,
                 writers: Iterable[tuple[str, WriterSpec]], budget: StorageBudget,
                 on_plugin_error: Callable[[str, str], None],
                 on_fatal: Callable[[str], None],
                 stream_owner: Callable[[str], str | None] = lambda stream: None,
                 plugin_alive: Callable[[str], bool] = lambda plugin: True,
                 on_core_error: Callable[[str, int, str], None] | None = None,
                 parts_of: Callable[[Mapping[str, list[Any]]], Any] | None = None,
                 render: bool = True) -> None:
        self.device_dir, self.meta, self.writers = device_dir, meta, list(writers)
        #: False (option export "off"): raw data only, every iteration left to `jobprof export`
        self.render = render
        #: asked of each rendered iteration with operators: its summary parts, kept in
        #: :attr:`parts` (the facts written at exit then read no operator window again)
        self._parts_of = parts_of
        self.parts: dict[int, Any] = {}
        self.budget = budget
        self._on_plugin_error, self._on_fatal, self._stream_owner = on_plugin_error, on_fatal, stream_owner
        self._plugin_alive = plugin_alive
        #: a core stream (no plugin owns it: ``ops``) whose records failed to build: told once
        #: (stream, iteration, message), then it gets nothing more
        self._on_core_error = on_core_error
        self._dead_streams: set[str] = set()
        #: (iteration, message): storing that iteration's operator window failed (disk full)
        self._storage_error: tuple[int, str] | None = None
        self._raw = rawstore.RawWriter(device_dir)
        #: the exporter's reader of operator windows (consecutive iterations share them)
        self._windows = kinetotrace.Windows(device_dir / "data")
        self._unit = 0
        self._queued: deque[tuple[int, Mapping[str, list[Any]], frozenset[str]]] = deque()
        #: written, not yet rendered: (iteration, storage unit, where, active plugins, bytes of
        #: the operator windows it reads)
        self._todo: deque[tuple[int, int, rawstore.Written, frozenset[str], int]] = deque()
        self._render_failed: set[str] = set()
        self._work_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._export_after = 0.0  # the exporter's next turn (duty budget)
        self.written = self.exported = self.deferred = 0
        #: iterations whose raw line is written but which were not rendered, as [first, last]
        #: runs (deferred beyond MAX_BACKLOG, or left when close()'s deadline passed)
        self.unrendered: list[list[int]] = []
        #: what the writers noted (a timeline capped): sentence -> iterations (rendering thread)
        self.notes: dict[str, list[int]] = {}
        #: monotonic time after which close() stops rendering (None: render everything)
        self.deadline: float | None = None
        #: at the deadline, render the rest anyway if it should take less than this (s): what a
        #: background exporter's start-up would cost (0: stop at the deadline)
        self.finish_within_s = 0.0
        #: a detached exporter renders what this process leaves (option export "background"):
        #: operator windows over :data:`INPROCESS_WINDOW_BYTES` are left to it, and after the
        #: job's last step no window is decoded here at all
        self.exporter_follows = False
        self.export_seconds = 0.0
        #: rendering time and compressed window bytes of the iterations with operators rendered
        #: here (what an iteration's rendering is predicted to cost at a deadline)
        self._window_seconds = 0.0
        self._window_bytes = 0
        self.failed = False
        #: set when the process is going away (SIGTERM): if the signal interrupted the main
        #: thread inside an import while this thread, holding the work lock, is importing too
        #: (it may wait for that very import: both then waited for ever), the lock is waited
        #: for this long at most (s); otherwise, as long as the work takes
        self.lock_wait_s: float | None = None
        #: the lock was not had within lock_wait_s: what this thread held was left unsaved
        self.stuck = False
        #: where this thread was importing when it was given up on (``file:line in function``)
        self.stuck_at = ""
        self._reserve = device_dir / "data" / RESERVE_NAME
        try:
            with fsio.create(self._reserve, root=device_dir.parent, binary=True) as handle:
                handle.write(bytes(RESERVE_BYTES))
        except OSError:
            self._reserve.unlink(missing_ok=True)  # no room even now: the first write will say so
        if render:
            jsonread.preload()  # never imported on the sink thread at exit (see there)
        self._thread = threading.Thread(target=self._run, name="jobprof-sink", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------
    def submit(self, index: int, streams: Mapping[str, list[Any]], active: frozenset[str]) -> None:
        """Queue one finished iteration (never blocks, never raises).

        ``active`` names the plugins alive when the iteration ended: only their writers render
        it (a plugin that fails later still gets the iterations it finished).
        """
        if self.failed:
            return
        self._queued.append((index, streams, active))
        if len(self._queued) >= FLUSH_ITERATIONS:
            self._wake.set()

    def hurry(self, seconds: float) -> None:
        """Stop rendering ``seconds`` from now (or sooner, if already told); safe from a signal
        handler that interrupted :meth:`close` (it only sets the deadline the loop reads)."""
        deadline = time.monotonic() + seconds
        if self.deadline is None or deadline < self.deadline:
            self.deadline = deadline

    @contextlib.contextmanager
    def _working(self) -> Iterator[bool]:
        """The work lock (yields whether it was had: see :attr:`lock_wait_s`)."""
        got = self._work_lock.acquire(timeout=-1) if self.lock_wait_s is None else self._wait(
            lambda timeout: self._work_lock.acquire(timeout=timeout))
        if not got:
            self.stuck = True
        try:
            yield got
        finally:
            if got:
                self._work_lock.release()

    def _wait(self, attempt: Callable[[float], bool]) -> bool:
        """Try ``attempt(timeout)`` until it succeeds, or until both threads have been inside
        an import for :attr:`lock_wait_s` (see there)."""
        assert self.lock_wait_s is not None
        risky_since = None
        while not attempt(0.05):
            theirs = sys._current_frames().get(self._thread.ident or 0)
            if not (_importing(sys._getframe()) and _importing(theirs)):
                risky_since = None
            elif self.stuck:  # found so once already: not again for every step of the end
                return False
            elif risky_since is None:
                risky_since = time.monotonic()
            elif time.monotonic() - risky_since > self.lock_wait_s:
                self.stuck_at = _import_site(theirs) or ""
                return False
        return True

    def _joined(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread, write every queued iteration and render every one not yet rendered
        (until :attr:`deadline`; the rest goes to :attr:`unrendered`).  With an exporter to
        follow (:attr:`exporter_follows`) no operator window is decoded here: the iterations
        that read one are the exporter's, whatever their size."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            if self.lock_wait_s is None:
                self._thread.join(30)
            else:
                self._wait(self._joined)
        with self._working() as got, _collector_paused():
            if not got:  # the thread is blocked holding it: leave its files as they are
                return
            self._flush_raw()
            self._export_pending(throttle=False)
            if self._todo and self.exported and self.deadline is not None and self.finish_within_s:
                # little left: rendering it costs less than starting an exporter for it
                left = self.export_seconds / self.exported * len(self._todo)
                if left <= self.finish_within_s:
                    self.deadline = None
                    self._export_pending(throttle=False)
            if not self.failed:
                while self._todo:  # the deadline passed: raw data is there for `jobprof export`
                    self._note_unrendered(self._todo.popleft()[0])
            # the operator records freed now, by their counts: left to the interpreter's last
            # collection, it traversed them all (4 s of a 200k-operator iteration's 20)
            self._windows = kinetotrace.Windows(self.device_dir / "data")
        self._raw.close()

    def _note_unrendered(self, index: int) -> None:
        """Add ``index`` to the [first, last] runs of :attr:`unrendered` (called in iteration
        order: entries leave :attr:`_todo` from its left only)."""
        runs = self.unrendered
        if runs and runs[-1][1] + 1 == index:
            runs[-1][1] = index
        else:
            runs.append([index, index])

    @property
    def unrendered_count(self) -> int:
        return sum(last - first + 1 for first, last in self.unrendered)

    # -- background thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._work_lock:
                self._flush_raw()
                self._export_pending(throttle=True)

    def release_reserve(self) -> None:
        """Give the reserved room back to the disk (at a failed write, and at the end)."""
        try:
            self._reserve.unlink(missing_ok=True)
        except OSError:
            pass

    def settle(self) -> None:
        """Build every deferred record list now (at exit, before the plugins' session_end)."""
        with self._working() as got:
            for index, streams, _ in list(self._queued) if got else ():
                self._resolve(index, streams)

    def _resolve(self, index: int, streams: Mapping[str, Any]) -> None:
        """Replace the callables a plugin returned for a stream by the list they build."""
        for stream, records in list(streams.items()):
            if type(records) is list or not callable(records):
                continue
            owner = self._stream_owner(stream)
            if (owner is not None and not self._plugin_alive(owner)) or stream in self._dead_streams:
                del streams[stream]  # type: ignore[attr-defined]
                continue  # failed since: it gets nothing more
            if self._storage_error is not None:
                return  # nothing more is saved (see _flush_raw)
            try:
                built = records()
                if not isinstance(built, list):
                    raise TypeError(f"returned {type(built).__name__}, not a list")
                if built:
                    streams[stream] = built  # type: ignore[index]
                else:  # nothing this iteration: no empty stream in the raw line
                    del streams[stream]  # type: ignore[attr-defined]
            except OSError as exc:
                if owner is not None or exc.errno not in DISK_FULL:
                    self._drop(index, streams, stream, owner, exc)
                    continue
                # the core's operator window could not be stored for want of room: the disk,
                # not the stream; _flush_raw saves the iterations before this one and stops
                self._storage_error = (index, f"cannot write to {self.device_dir}: {exc.strerror or exc}")
                return
            except Exception as exc:
                self._drop(index, streams, stream, owner, exc)

    def _drop(self, index: int, streams: Mapping[str, Any], stream: str, owner: str | None,
              exc: Exception) -> None:
        """A stream whose deferred records failed to build: left out, said once."""
        del streams[stream]  # type: ignore[attr-defined]
        if owner is None:  # the core's own stream: one report, no plugin to disable
            self._dead_streams.add(stream)
            if self._on_core_error is not None:
                self._on_core_error(stream, index, f"{type(exc).__name__}: {exc}")
            return
        self._on_plugin_error(owner, f"deferred records of stream '{stream}' (iteration "
                                     f"{index}): {type(exc).__name__}: {exc}")

    def _flush_raw(self) -> None:
        if self.failed or not self._queued:
            return
        batch = []
        while self._queued:
            batch.append(self._queued.popleft())
        for index, streams, _ in batch:
            self._resolve(index, streams)
        unsaved: list[int] = []
        failure = ""
        if self._storage_error is not None:
            # an iteration's operator window could not be stored: the iterations before it are
            # whole and written; it and the rest are not saved
            cut, failure = self._storage_error
            unsaved = [i for i, _, _ in batch if i >= cut]
            batch = [b for b in batch if b[0] < cut]
        try:
            placed = self._raw.append_many([(i, s) for i, s, _ in batch], self._bad_stream)
            for (index, streams, active), where in zip(batch, placed, strict=True):
                if where.new_segment:
                    self._unit = index
                self.budget.account(self._unit, where.segment, where.offset + where.length)
                # operator windows (Kineto's files) age with the first iteration naming them
                for path, size in kinetotrace.new_files(where.segment.parent, streams.get(OPS_STREAM) or ()):
                    self.budget.account(self._unit, path, size)
                self._todo.append((index, self._unit, where, active, _window_bytes(streams)))
            self.budget.enforce()
            self.written += len(batch)
            while len(self._todo) > MAX_BACKLOG:
                self._note_unrendered(self._todo.popleft()[0])
                self.deferred += 1
            if unsaved:
                self._fail(failure, unsaved)
        except OSError as exc:
            self._fail(f"cannot write to {self.device_dir}: {exc.strerror or exc}",
                       [i for i, _, _ in batch])
        except Exception as exc:
            self._fail(f"internal error while writing iterations: {exc!r}", [i for i, _, _ in batch])

    def _export_pending(self, throttle: bool) -> None:
        """Render what is waiting: on the sink thread (``throttle``) within the CPU duty, the
        iterations whose windows it may decode (:attr:`exporter_follows`); at :meth:`close`,
        until the deadline, the ones whose predicted cost fits before it."""
        if throttle and self.exporter_follows:
            # nothing is rendered while the job trains when an exporter renders after it: this
            # thread's Python holds the GIL the training thread needs between its operators
            # (measured on a 37 ms transformer step: +0.6% per step at a 1% duty, issue 48)
            return
        while self._todo and not self.failed and self.render:
            if throttle and (self._stop.is_set() or time.monotonic() < self._export_after):
                return
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return
            entry = self._todo.popleft()
            if not self._renders_here(entry[4], throttle):
                self._note_unrendered(entry[0])
                continue
            started = time.perf_counter()
            try:
                self._export_one(*entry[:4], cancel=self._stop.is_set if throttle else None)
            except export.Cancelled:  # the job is ending: whoever renders next renders it whole
                self._todo.appendleft(entry)
                return
            spent = time.perf_counter() - started
            self.export_seconds += spent
            if entry[4]:
                self._window_seconds += spent
                self._window_bytes += entry[4]
            self._export_after = time.monotonic() + spent * (1 / EXPORT_DUTY - 1)

    def _renders_here(self, window_bytes: int, throttle: bool) -> bool:
        """May an iteration reading ``window_bytes`` of operator windows be rendered in this
        process now?"""
        if not window_bytes:
            return True
        if self.exporter_follows:  # the job has ended (nothing renders here before): no window
            return False
        if throttle or self.deadline is None:
            return True
        # a deadline (a SIGTERM's, an os._exit's): not one that would run past it
        rate = (self._window_seconds / self._window_bytes if self._window_bytes
                else PRIOR_S_PER_WINDOW_BYTE)
        return time.monotonic() + window_bytes * rate <= self.deadline

    def _export_one(self, index: int, unit: int, where: rawstore.Written, active: frozenset[str],
                    cancel: Callable[[], bool] | None = None) -> None:
        if not self.budget.alive(unit):
            return  # aged away before it was rendered
        try:
            streams = rawstore.read_at(where, self._windows)
            if streams is None:
                return
            if cancel is not None and cancel():
                raise export.Cancelled
            if self._parts_of is not None and streams.get(rawstore.OPS_STREAM):
                try:
                    found = self._parts_of(streams)  # the writers read the same records (tuples)
                    if found is not None:
                        self.parts[index] = found
                except Exception:
                    pass  # the facts compute it from the raw data instead
            writers = [(p, spec) for p, spec in self.writers
                       if (p in active or p == export.CORE) and p not in self._render_failed]
            for path, size in export.render_iteration(self.device_dir, self.meta, streams, writers,
                                                         self._writer_failed, self._noted, cancel):
                if not self.budget.account(unit, path, size):
                    path.unlink(missing_ok=True)  # its unit was aged while rendering
            self.budget.enforce()
            self.exported += 1
        except export.Cancelled:
            self.parts.pop(index, None)
            raise
        except OSError as exc:
            self._fail(f"cannot write to {self.device_dir}: {exc.strerror or exc}", rendering=index)
        except Exception as exc:  # never let the thread die silently
            self._fail(f"internal error while exporting iteration {index}: {exc!r}", rendering=index)

    # -- failures --------------------------------------------------------------------------
    def _fail(self, message: str, batch: list[int] | None = None, rendering: int | None = None) -> None:
        """Stop for good, saying exactly what the raw store kept (read back from the disk:
        a failed write may have landed whole, in part, or not at all)."""
        if self.failed:
            return
        self.failed = True
        self.release_reserve()
        self._on_fatal(f"{message}; {self._saved_text(batch or [], rendering)}")

    def _saved_text(self, batch: list[int], rendering: int | None) -> str:
        try:
            saved = rawstore.indices(self.device_dir)
        except OSError as exc:
            return (f"what was saved is unknown (cannot read {self.device_dir / 'data'}: "
                    f"{exc.strerror or exc})")
        lost = sorted(set(batch) - saved)
        text = (f"raw data saved for {len(saved)} iteration(s) ({', '.join(ranges(saved))}; last saved: "
                f"{max(saved)})" if saved else "no iteration's raw data was saved")
        if lost:
            text += f"; not saved: iteration(s) {', '.join(ranges(lost))}"
        unrendered = {entry[0] for entry in self._todo}
        if rendering is not None:  # None was dropped by `&= saved` below anyway
            unrendered.add(rendering)
        unrendered |= {i for first, last in self.unrendered for i in range(first, last + 1)}
        unrendered &= saved
        if unrendered:
            text += (f"; iteration(s) {', '.join(ranges(unrendered))} not rendered "
                     f"(`jobprof export {self.device_dir.parent}` renders saved ones)")
        return text

    def _noted(self, index: int, note: str) -> None:
        self.notes.setdefault(note, []).append(index)

    def _writer_failed(self, plugin: str, message: str) -> None:
        self._render_failed.add(plugin)
        self._on_plugin_error(plugin, message)

    def _bad_stream(self, stream: str, exc: Exception) -> None:
        owner = self._stream_owner(stream) or stream
        self._on_plugin_error(owner, f"stream '{stream}' is not JSON-serialisable: {exc}")
