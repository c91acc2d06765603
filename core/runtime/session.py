"""The profiling session of one process: lazy start, iteration delivery, crash-safe end.

States: ``waiting`` (options valid, torch not imported yet) -> ``collecting`` (collectors
installed) -> ``finished``; or ``stopped`` (a fatal write error; the job carries on) and
``inert`` (a forked child or a DataLoader worker: writes nothing).  The PROF_ and device
folders are created only when the first iteration ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import attrs

from jobprof import __version__
from jobprof.analysis.selection import ranges, run_texts
from jobprof.engine.manager import PluginManager
from jobprof.files import export, kinetotrace, profdir
from jobprof.files.fsio import write_with_done
from jobprof.files.rawstore import ITERATION_STREAM, PROFILER_STREAM
from jobprof.ops.opcapture import STREAM as OPS_STREAM
from jobprof.ops.opcapture import Detail, OpCapture
from jobprof.plugin import clock
from jobprof.plugin.clock import ClockAnchor
from jobprof.plugin.frames import hide_frame
from jobprof.plugin.reporter import REPORTER, Reporter
from jobprof.plugin.values import Config, Iteration
from jobprof.runtime import deviceinfo
from jobprof.runtime.sink import SIGTERM_RENDER_S, Sink
from jobprof.runtime.steps import ModuleCalls, StepDetector
from jobprof.runtime.storage import RESERVE as STORAGE_RESERVE
from jobprof.runtime.storage import StorageBudget
from jobprof.runtime.torch_import import when_imported


def _import_exporter(module: Any) -> None:
    """Import what the exporting thread needs that nothing imported yet, on the job's thread:
    that thread must import nothing (a SIGTERM landing inside a main-thread import at exit
    deadlocks it; CI runs 61, 83).  Run before the first forward (start-up, shown as jobprof's),
    not at the first iteration's end (11 ms of iteration 2 on this VM, 27 under load)."""
    from jobprof.analysis import facts  # noqa: F401


class Session:
    def __init__(self, config: Config, manager: PluginManager, owners: Mapping[str, str],
                 reporter: Reporter = REPORTER, capture_of: Session | None = None,
                 capture_dir: Path | None = None) -> None:
        """``capture_of``: this session is a capture of a job in dynamic mode
        (:mod:`jobprof.runtime.dynamic`) into ``capture_dir``: it borrows that session's step
        detector and time base, and starts at :meth:`begin_capture`."""
        self.config, self.manager, self.owners, self.reporter = config, manager, owners, reporter
        self.pid = os.getpid()
        self.anchor = ClockAnchor.now()
        if capture_of is None or capture_dir is None:
            named = os.environ.get(profdir.JOB_ENV)
            #: the index claim is held while the process lives (see jobprof.files.profdir)
            self.job_dir, self._index_claim = profdir.job_dir(config.output, warn=reporter.warning)
            #: every timeline's ts is µs since this (jobprof.plugin.clock): the job's, inherited
            #: with its folder
            self.time_base_ns = clock.job_base(self.anchor, inherit=str(self.job_dir) == named)
        else:  # the ranks agreed on the folder (the request names it); the job's time axis
            self.job_dir, self._index_claim = capture_dir, None
            self.time_base_ns = capture_of.time_base_ns
        #: a capture session borrows the job's step detector (never flushes nor uninstalls it)
        self._borrowed = capture_of is not None
        #: root-module listeners this session added to a borrowed detector, removed at its end
        self._listeners: list[Callable[[Any], None]] = []
        #: dynamic mode: the controller of captures (jobprof.runtime.dynamic), told every iteration
        self.dynamic: Any = None
        #: dynamic mode without the step tier: iterations are counted, nothing is written
        self.quiet = False
        self.state = "waiting"
        self.detector: StepDetector | None = None
        self.device_id: int | None = None
        self.device_dir: Path | None = None
        self.device_source = ""
        self.sink: Sink | None = None
        self._attached: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._previous_sigterm: Any = None
        #: finish() is running on this thread (a SIGTERM handler that interrupts it must not
        #: re-enter it), and the SIGTERM it received meanwhile, delivered when it is done
        self._finishing = self._hurried = False
        #: what cut the exit-time rendering short (SIGTERM, os._exit, exec), for the message
        self._hurried_by = ""
        self._signal_during_finish: int | None = None
        self._ops_detail: Detail | None = None
        self._op_memory = False
        self._rank: dict[str, Any] = {}
        #: what plugins add to info.json's ``jobprof`` section (e.g. the calibration)
        self.info: dict[str, Any] = {}
        #: the operator capture, when some plugin asked for operators
        self.ops: OpCapture | None = None
        #: jobprof's own work in the job's time, ``[start_ns, end_ns]`` (hand-overs, calibration,
        #: starting the capture), not yet given to an iteration: each goes to the raw line of the
        #: iteration it lies in (stream ``profiler``), whichever that is
        self._own: list[list[int]] = []
        #: jobprof's work before the first iteration began (ns), shown as jobprof's in info.json
        self._own_startup: dict[str, int] = {}
        #: what stopped working mid-run, said once each and kept in info.json (``disabled``) so
        #: that ``jobprof summary`` lists it: a failed plugin, the operator capture
        self._disabled: dict[str, dict[str, Any]] = {}
        self._disabled_lock = threading.Lock()
        self._failed_at: dict[str, int | None] = {}
        self._last_index = 0
        #: the operator capture's records failed to build: stop Kineto at the next cut
        self._ops_broken = False
        #: an iteration ended on a thread the operator capture does not record: said once
        self._other_thread_said = False
        manager.on_fail = self._end_failed_plugin
        if capture_of is None:  # a capture is made inert by its job's session (dynamic.forked)
            os.register_at_fork(after_in_child=self._forked)

    # -- plugin-facing API -----------------------------------------------------------------
    def attach(self, name: str, obj: Any) -> None:
        """Keep a plugin's per-run object (its collector) on the session."""
        self._attached[name] = obj

    def attached(self, name: str) -> Any:
        found = self._attached.get(name)
        if found is None and self.dynamic is not None:  # e.g. jobprof.mstx during a capture
            return self.dynamic.attached(name)
        return found

    def set_info(self, key: str, value: Any) -> None:
        """A plugin's fact for info.json's ``jobprof`` section (see PluginSession.set_info)."""
        self.info[key] = value

    def get_info(self, key: str) -> Any:
        return self.info.get(key)

    def when_imported(self, name: str, callback: Callable[[Any], None]) -> None:
        """Call ``callback(module)`` once module ``name`` is imported (now if it already is)."""
        when_imported(name, callback)

    def on_root_module(self, listener: Callable[[Any], None], what: str = "") -> None:
        """Call ``listener(module)`` for every module first seen as a root (outermost) forward.

        The listener runs before that forward's timestamp is taken and its time is recorded as
        jobprof's own (``what`` names it in info.json's ``own_startup_ms`` when it runs before
        the first iteration), so its work is never painted into the job's phases.
        """
        timed = partial(self._timed_listener, listener, what or getattr(listener, "__qualname__", "listener"))
        if self.detector is not None:
            self.detector.root_listeners.append(timed)
            self._listeners.append(timed)
            for root in list(self.detector.roots):
                timed(root)

    def module_calls(self) -> ModuleCalls | None:
        """The recorder of module calls (see PluginSession.module_calls), or None."""
        return self.detector.module_calls if self.detector is not None else None

    def _record_module_calls(self) -> None:
        detector = self.detector
        if detector is not None and detector.module_calls is None:
            calls = ModuleCalls()
            self.on_root_module(calls.name_root, "module paths")
            detector.module_calls = calls

    def _timed_listener(self, listener: Callable[[Any], None], what: str, module: Any) -> None:
        start = time.monotonic_ns()
        try:
            listener(module)
        finally:
            self.record_own(start, time.monotonic_ns(), what)

    def record_own(self, start_ns: int, end_ns: int, what: str = "") -> None:
        """Record jobprof's own work in the job's time (monotonic ns): the summary shows it as
        the ``jobprof`` part of the iteration it falls in, never as the job's."""
        if end_ns <= start_ns:
            return
        with self._lock:
            self._own.append([start_ns, end_ns])
            if self.sink is None and what:  # before the first iteration ends: start-up
                self._own_startup[what] = self._own_startup.get(what, 0) + end_ns - start_ns

    def request_ops(self, shapes: bool = False, cupti_metrics: tuple[str, ...] = ()) -> None:
        """Ask for the operators of every iteration (stream ``ops``, see :mod:`jobprof.ops.opcapture`).

        Call from ``jobprof_session_start``; the capture serves every plugin that asked, at the
        most detail any of them needs.  ``shapes``: input shapes, dtypes, strides and scalar
        values (FLOPs and bytes are computed from them, :mod:`jobprof.plugin.opmath`);
        ``cupti_metrics``: CUPTI metrics per kernel (CUDA only).  CUDA kernels are recorded
        whenever CUDA is there.
        """
        wanted = Detail(shapes, False, cupti_metrics)
        self._ops_detail = wanted if self._ops_detail is None else self._ops_detail.merge(wanted)

    def request_op_memory(self) -> None:
        """If the operator capture runs (some plugin asked for operators), also record the
        allocators' allocations and frees with it (the core stream ``op_memory``) and every
        module call (:meth:`module_calls`); alone, asks for nothing (see
        PluginSession.request_op_memory)."""
        self._op_memory = True

    @property
    def iteration_method(self) -> str | None:
        return self.detector.mode if self.detector else None

    # -- lifecycle -------------------------------------------------------------------------
    def torch_ready(self, torch: Any) -> None:
        """torch is imported: install the step detector and every plugin's collectors."""
        if self.state != "waiting" or os.getpid() != self.pid:
            return
        try:
            self.detector = StepDetector(self.on_iteration)
            if _main_calls_step():
                self.detector.expect_explicit = True  # explicit marks win from the first iteration
            self.detector.install()
        except Exception as exc:  # e.g. a torch without the hooks we use: run unprofiled
            self.state = "stopped"
            self.reporter.error(f"cannot install the step detector on torch {torch.__version__}: "
                                f"{exc!r}; the job runs unprofiled")
            if self.detector is not None:
                self.detector.uninstall()
            return
        self.state = "collecting"
        self.manager.session_start(self)
        if self.config.get("export") != "off":
            self.on_root_module(_import_exporter, "exporter modules")
        try:
            self.detector.wrap_data_next(torch)  # outermost: after the plugins' own wrappers
        except Exception as exc:
            self.reporter.warning(f"DataLoader boundaries unavailable on torch {torch.__version__}: {exc!r}")
        if self._ops_detail is not None:
            self._install_ops(torch)
        self._install_sigterm()
        if self.dynamic is not None:
            self.dynamic.torch_ready(torch)

    def begin_capture(self, torch: Any, detector: StepDetector) -> None:
        """Dynamic mode: start this capture session at an iteration boundary, on the training
        thread, with the job's step detector: the plugins install their collectors and the
        operator capture starts now (the job's root modules are known)."""
        self.detector = detector
        self.state = "collecting"
        self.manager.session_start(self)
        if self._ops_detail is not None:
            self._install_ops(torch)

    def end_capture(self) -> None:
        """Dynamic mode, training thread, at the capture's last boundary: Kineto stops here (the
        thread that started it); :meth:`finish` then runs on another thread."""
        if self.ops is not None and self.state == "collecting":
            self.ops.halt()

    def _install_ops(self, torch: Any) -> None:
        try:
            cuda = bool(torch.cuda.is_available())
        except Exception:
            cuda = False
        assert self._ops_detail is not None  # called only when some plugin asked for operators
        detail = attrs.evolve(self._ops_detail, cuda=cuda, memory=self._op_memory)
        try:
            ops = self.ops = OpCapture(torch, detail, self.reporter.warning)
            ops.every = int(self.config.get("task_trace_every") or 1)
            ops.warm_up()
        except Exception as exc:  # a torch without the profiler API we use
            self.reporter.warning(f"operator capture unavailable on torch {torch.__version__}: {exc!r}")
            return
        if detail.memory:  # the module path of each allocation
            self._record_module_calls()
        # started at the first root forward: DataLoader workers never run one, and nothing
        # before it belongs to an iteration (self.ops is never replaced once set)
        self.on_root_module(lambda module: ops.start(), "operator capture start")

    def _ops_windows(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """The ``ops`` stream of one iteration as references to Kineto's window files (sink
        thread; see jobprof.files.kinetotrace)."""
        assert self.ops is not None and self.device_dir is not None  # only while capturing, live
        folder = self.device_dir
        # once the job ends, windows are kept as Kineto wrote them: compressing one of a huge
        # iteration would hold the exit (whoever renders it compresses it)
        refs = self.ops.take_windows(start_ns, end_ns,
                                     lambda result, number: kinetotrace.save_window(
                                         result, number, folder, hurry=self._ending),
                                     lambda name: kinetotrace.forget_window(name, folder))
        return [kinetotrace.reference(r.name, r.offset_ns, r.size, r.first, r.shapes, r.clip_ns)
                for r in refs]

    def _ending(self) -> bool:
        return self.state != "collecting"

    def explicit_step(self) -> None:
        if self.detector is not None and self.state == "collecting":
            self.detector.explicit()

    def on_iteration(self, iteration: Iteration) -> None:
        """Called by the detector on the training thread; cheap, never raises."""
        entered = time.monotonic_ns()
        if self.state != "collecting" or os.getpid() != self.pid:
            if self.state == "stopped" and self.ops is not None and os.getpid() == self.pid:
                self.ops.stop()  # on the training thread: Kineto must not be stopped under it
            return
        self._last_index = iteration.index
        if self.quiet:
            self.dynamic.on_iteration(iteration)
            return
        try:
            if self.sink is None:
                if not self._go_live():
                    return
                if self.ops is not None:
                    folder = self.device_dir
                    assert folder is not None  # _go_live claimed it
                    self.ops.scratch = lambda: kinetotrace.scratch_file(folder)
            streams: dict[str, Any] = {ITERATION_STREAM: [iteration.to_record()]}
            # jobprof's spans inside this iteration (an empty list says 0, not N/A); later ones
            # wait for theirs (a backward-found iteration is handed over inside the next one)
            with self._lock:
                own, start, end = self._own, iteration.start_ns, iteration.end_ns
                streams[PROFILER_STREAM] = [s for s in own if s[1] > start and s[0] < end]
                self._own = [s for s in own if s[1] > end]
            ops = self.ops
            if ops is not None and self._ops_broken and ops.state == "capturing":
                ops.stop_requested = True  # stopped on its own thread, as Kineto needs (below)
            if ops is not None and ops.state == "capturing" and ops.owns_thread():
                if ops.stop_requested:
                    ops.stop()  # the session is ending on another thread (see finish)
                else:
                    taken = ops.sampled(iteration.index) and self._whole_window(ops, iteration)
                    ops.cut(iteration.end_ns, iteration.index)
                    if taken:
                        streams[OPS_STREAM] = partial(self._ops_windows, iteration.start_ns, iteration.end_ns)
            elif ops is not None and not ops.owns_thread() and not self._other_thread_said \
                    and (ops.state == "capturing" or ops.owner_ended):
                # Kineto records the thread that started it: another thread's operators are not
                # captured, and its iterations get none (not the owner's, by time)
                self._other_thread_said = True
                self.reporter.warning(
                    f"iterations end on more than one thread: the operator capture records the "
                    f"thread that ran the first forward only; iterations ended on thread "
                    f"'{threading.current_thread().name}' and other threads have no operator data "
                    f"(from iteration {iteration.index})")
            # results arrive checked by the manager: {stream: [records] or a callable building
            # them on the sink thread}, streams owned
            for _, result in self.manager.iteration_end(self, iteration):
                streams.update(result)
            assert self.sink is not None  # set by _go_live above, never unset
            self.sink.submit(iteration.index, streams, self.manager.active_set())
            self.record_own(entered, time.monotonic_ns())
        except Exception as exc:
            self._stop(f"internal error at iteration {iteration.index}: {exc!r}")
        if self.dynamic is not None:
            self.dynamic.on_iteration(iteration)

    def finish(self, reason: str = "exit") -> None:
        """End the session: flush, uninstall, drain the sink, write end_info (idempotent).

        At exit, a program that died of an uncaught exception ends ``exception: <type>``
        (Python sets ``sys.last_value`` before the atexit handlers run; ``sys.exit`` does not).
        """
        if reason == "exit":
            died = getattr(sys, "last_value", None)
            if isinstance(died, BaseException):
                reason = f"exception: {type(died).__name__}"
        if self.ops is not None and os.getpid() == self.pid and self.state in ("collecting", "stopped"):
            # Kineto can be stopped only on the thread that started it; a daemon thread still
            # training stops it at its next iteration end (outside the lock: it takes it there)
            self.ops.stop_on_owner(OWNER_STOP_S)
        if self.state == "collecting" and os.getpid() == self.pid and self.detector is not None \
                and not self._borrowed:
            # the detector's lock before the session's, as on the training thread (which holds
            # the detector's while it hands an iteration over): a thread still training at
            # exit deadlocked the other way round
            try:
                self.detector.flush()
            except Exception as exc:
                self.reporter.warning(f"could not close the last iteration: {exc!r}")
        with self._lock:
            if self.state not in ("collecting", "stopped") or os.getpid() != self.pid:
                return
            self._finishing = True
            self._own_sigterm()
            try:
                self._finish(reason)
            finally:
                self._finishing = False
        signum = self._signal_during_finish
        if signum is not None:  # SIGTERM came while we wrote: the job dies of it now, as it would
            self._signal_during_finish = None
            try:
                self._deliver(signum, None)
            except BaseException as exc:
                hide_frame(exc)
                raise

    def _finish(self, reason: str) -> None:
        if self.dynamic is not None:  # the capture running now ends first, for the same reason
            self.dynamic.close(reason)
        mode = self.config.get("export") or EXPORT_DEFAULT
        if reason == "SIGTERM" or reason in _HURRIED_EXITS or reason.startswith("os._exit("):
            # the process is going away now: raw data and end_info, rendering for a second
            self._hurried_by = self._hurried_by or reason.split("(")[0]
            self._hurried = True
            if self.sink is not None:
                self.sink.hurry(SIGTERM_RENDER_S)
                # the signal may have cut into an import the sink thread waits for
                self.sink.lock_wait_s = SINK_WAIT_S
        elif self.sink is not None and mode != "inline":
            # the job ends when it ends: what EXIT_RENDER_S does not render, the exporter does
            # (unless what is left costs less than the exporter's own start-up)
            self.sink.hurry(EXIT_RENDER_S if mode == "background" else 0)
            if mode == "background":
                self.sink.finish_within_s = EXPORTER_START_S
        self.state = "finished"
        if self.detector is not None and self._borrowed:
            for listener in self._listeners:
                if listener in self.detector.root_listeners:
                    self.detector.root_listeners.remove(listener)
            if self._op_memory and self.ops is not None:
                self.detector.module_calls = None
        elif self.detector is not None:
            self.detector.uninstall()
        if self.sink is not None:
            self.sink.settle()  # deferred hand-overs read collectors that session_end stops
        if self.ops is not None:
            self.ops.stop()
            for note in self.ops.exit_notes():
                self.reporter.warning(note)
        self.manager.session_end(self)
        if self.sink is not None:
            self.sink.close()
            if self._signal_during_finish is not None and reason != "SIGTERM":
                name = signal.Signals(self._signal_during_finish).name
                reason = (f"{name} (during the exit-time export)" if reason == "exit"
                          else f"{reason}; then {name} during the exit-time export")
            sink = self.sink
            if sink.stuck:
                self.reporter.warning(
                    f"the exporting thread was waiting for an import that {reason} interrupted"
                    f"{f' (its import at {sink.stuck_at})' if sink.stuck_at else ''}; "
                    f"after {sink.lock_wait_s:g} s jobprof went on without it: iterations after the "
                    "last one on disk are lost")
            for note, iterations in sink.notes.items():  # one line per kind, not per iteration
                self.reporter.warning(f"{note}: iteration(s) {', '.join(ranges(iterations))}")
            handed = None
            if sink.unrendered and not sink.failed and mode == "background":
                handed = self._hand_over(sink)
            elif sink.unrendered and not sink.failed and mode == "off":
                self.reporter.info(f"{sink.unrendered_count} iteration(s) saved as raw data, not rendered "
                                   f"(export \"off\"): `jobprof export {self.job_dir}` renders them")
            elif sink.unrendered and not sink.failed:  # said first: end_info keeps the message
                why = [f"{sink.deferred} beyond the in-process backlog"] if sink.deferred else []
                if sink.unrendered_count > sink.deferred:
                    why.append(f"{sink.unrendered_count - sink.deferred} left when "
                               f"{self._hurried_by or 'SIGTERM'}'s {SIGTERM_RENDER_S:g} s for "
                               "rendering ran out")
                self.reporter.warning(
                    f"{sink.unrendered_count} iteration(s) were not rendered in the job "
                    f"({', '.join(why)}; iterations {', '.join(run_texts(sink.unrendered))}; raw data "
                    f"kept): run `jobprof export {self.job_dir}`")
            sink.release_reserve()  # room for end_info and info.json, even on a full disk
            try:
                self._write_metadata(reason)
            except OSError as exc:
                if not sink.failed:  # else the failure was said, once, with what was saved
                    self.reporter.error(f"cannot write end_info in {self.device_dir}: "
                                        f"{exc.strerror or exc}")
            if not sink.failed and not self._hurried and self._signal_during_finish is None \
                    and self.device_id is not None and not sink.unrendered \
                    and not (self._borrowed and reason == CAPTURE_END):  # mid-run: not in the job's time
                self._write_facts(self.device_id)  # else the exporter (or `jobprof export`) does
            if handed is not None:
                try:  # after end_info and info.json: the exporter updates them
                    self._start_exporter(handed)
                except OSError as exc:
                    self.reporter.warning(
                        f"could not start the background exporter ({exc.strerror or exc}): "
                        f"{sink.unrendered_count} iteration(s) not rendered (raw data kept): run "
                        f"`jobprof export {self.job_dir}`")

    def _whole_window(self, ops: OpCapture, iteration: Iteration) -> bool:
        """Sampling resumed Kineto at the end of the iteration before this one: true unless that
        end was found late (forward / backward detection hands an iteration over inside the
        next one: only the optimizer step and jobprof.step() end one as it ends), so that this
        one's start was not recorded.  Then sampling stops (said once): every iteration is
        captured from here on, this one has no operators."""
        if ops.resumed_ns is None or self.iteration_method in ON_TIME_METHODS:
            return True
        ops.every = 1
        self.reporter.warning(
            f"task_trace_every: iteration {iteration.index} was found after it had begun (iteration "
            f"method '{self.iteration_method}'), so sampled iterations would miss their start; the "
            f"operators of every iteration are captured from iteration {iteration.index + 1} on "
            "(sampling needs the optimizer step or jobprof.step() to end iterations)")
        return False

    def _hand_over(self, sink: Sink) -> list[list[int]]:
        """What the background exporter renders (said once, now: end_info keeps the line)."""
        self.reporter.info(
            f"{sink.unrendered_count} iteration(s) left to render ({', '.join(run_texts(sink.unrendered))}): "
            f"a background exporter renders them after the job (lowest priority; "
            f"`jobprof export --wait {self.job_dir}` waits for it)")
        return [list(r) for r in sink.unrendered]

    def _start_exporter(self, iterations: list[list[int]]) -> None:
        from jobprof.runtime import background

        assert self.sink is not None and self.device_dir is not None  # a sink had iterations
        budget = self.sink.budget
        room = max(0, budget.limit_bytes - STORAGE_RESERVE - budget.total_bytes)
        background.start(self.device_dir, iterations, room)

    def _write_facts(self, device: int) -> None:
        """Reduce this rank once, now, into its facts file: ``summary`` and ``report`` then read
        no raw data of it (a SIGTERM'd exit skips it: the commands compute the facts instead)."""
        try:
            from jobprof.analysis import facts

            known = {device: self.sink.parts} if self.sink is not None else None
            facts.write(self.job_dir, self.manager, devices=[device], known=known)
        except Exception as exc:  # a cache: the job's exit never fails for it
            self.reporter.warning(f"could not write the facts file in {self.device_dir}: {exc!r} "
                                  "(summary and report will read the raw data instead)")

    def _parts_of(self, streams: Mapping[str, list[Any]]) -> Any:
        """An iteration's summary parts and plugin digests, asked by the exporter as it renders
        one with operators (sink thread): the facts file written at exit takes them instead of
        reading its operator windows again, which cost as much as rendering them."""
        from jobprof.analysis import facts

        return facts.kept_of(self.manager, streams)

    # -- internals -------------------------------------------------------------------------
    def _go_live(self) -> bool:
        import torch

        try:
            if torch.utils.data.get_worker_info() is not None:
                self.state = "inert"  # a DataLoader worker is never a session of its own
                return False
        except Exception:
            pass
        try:
            preferred, self.device_source = profdir.preferred_device_id(torch)
            # read once, at the first iteration: by exit the process group may be destroyed
            self._rank = profdir.job_rank(torch)
            self.device_id, self.device_dir = profdir.claim_device_dir(self.job_dir, preferred)
            self._write_metadata(None)
            meta = export.with_metrics(export.DeviceMeta(
                self.device_id, self.pid, self.anchor, self.config, profdir.program_name(),
                self.info.get("calibration") or {},
                job={k: v for k, v in self._rank.items() if k != "rank_from"},
                time_base_ns=self.time_base_ns), self.manager)
            group = self.config.get("aic_metrics")
            if group and meta.metrics is None:
                self.reporter.warning(f"aic_metrics '{group}': no plugin provides this metric group, "
                                      "so op_summary gets no metric columns (`jobprof plugins` shows "
                                      "which plugin answers each group)")
            if self.config.get("export") != "off":
                _import_exporter(None)  # a job without a root forward: here, not on the sink thread
            budget = StorageBudget.for_device(self.device_dir, self.config.storage_limit_mb,
                                              on_ageing=self.reporter.warning)
            self.sink = Sink(self.device_dir, meta, export.writers_for(self.manager, self.config),
                             budget, self.manager.fail, self._stop, self.manager.stream_owner,
                             self.manager.is_active, self._core_stream_failed, self._parts_of,
                             render=self.config.get("export") != "off")
            self.sink.exporter_follows = (self.config.get("export") or EXPORT_DEFAULT) == "background"
        except OSError as exc:
            self._stop(f"cannot create {self.job_dir}: {exc.strerror or exc}")
            return False
        return True

    def _metadata(self) -> dict[str, Any]:
        import torch

        assert self.device_id is not None  # claimed (in _go_live) before metadata is written
        cuda = self.device_source == "cuda current device"
        device: dict[str, Any] = {"id": self.device_id, "type": "CUDA" if cuda else "CPU"}
        if cuda:
            device["name"] = torch.cuda.get_device_name(self.device_id)
        device.update(deviceinfo.cuda_units(torch, self.device_id) if cuda else deviceinfo.cpu_units())
        rank = dict(self._rank)
        return profdir.host_info(self.device_id, {
            "rank_id": rank.pop("rank_id", "N/A"),
            "DeviceInfo": [device],
            "jobprof": {
                "version": __version__,
                "torch": torch.__version__,
                "options": dict(self.config.values),
                "explicit": sorted(self.config.explicit),
                "options_source": self.config.source,
                "device_id_from": self.device_source,
                **rank,
                "iteration_method": self.iteration_method,
                "plugins": self.manager.active(),
                "own_startup_ms": {k: round(v / 1e6, 3) for k, v in self._own_startup.items()},
                "time_base_ns": self.time_base_ns,
                "disabled": self._disabled_list(),
                **self.info,
            },
        })

    def _write_metadata(self, end_reason: str | None) -> None:
        device_dir, dev = self.device_dir, self.device_id
        assert device_dir is not None  # claimed (in _go_live) before metadata is written
        info = self._metadata()
        if end_reason is None:
            write_with_done(device_dir / f"start_info.{dev}", json.dumps(self.anchor.info("Begin")))
        else:
            sink = self.sink
            info["jobprof"].update({
                "end_reason": end_reason,
                "iterations_written": sink.written if sink else 0,
                "iterations_exported": sink.exported if sink else 0,
                "iterations_deferred": sink.deferred if sink else 0,
                "export_seconds": round(sink.export_seconds, 3) if sink else 0,
                "segments_aged": sink.budget.aged_units if sink else 0,
                #: iterations whose data storage_limit / low free disk deleted, [first, last] runs
                "aged": [list(r) for r in sink.budget.aged] if sink else [],
                #: iterations with raw data but no rendered files (`jobprof export` renders them)
                "unrendered": [list(r) for r in sink.unrendered] if sink else [],
                #: what writers noted while rendering (a master timeline capped), with its iterations
                "export_notes": [{"note": note, "iterations": sorted(its)}
                                 for note, its in (sink.notes.items() if sink else ())],
                "messages": list(self.reporter.messages),
            })
            write_with_done(device_dir / f"end_info.{dev}", json.dumps(ClockAnchor.now().info("End")))
        write_with_done(device_dir / f"info.json.{dev}", json.dumps(info))

    def _core_stream_failed(self, stream: str, index: int, message: str) -> None:
        """The records of a core stream (the operator capture's) could not be built (sink
        thread): said once, the capture stops at the next cut, the other plugins carry on."""
        what = "operator capture" if stream == OPS_STREAM else f"core stream '{stream}'"
        # not the session's lock: the training thread holds that through finish() while it
        # waits for this thread's work (settle, close): both then waited for ever
        with self._disabled_lock:
            if what in self._disabled:
                return
            self._disabled[what] = {"what": what, "reason": message, "iteration": index}
            self._ops_broken = self._ops_broken or stream == OPS_STREAM
        self.reporter.warning(f"{what} stopped: its records of iteration {index} could not be read "
                              f"({message}); operator-tier files end before that iteration, the "
                              "other plugins carry on")

    def _disabled_list(self) -> list[dict[str, Any]]:
        """What stopped working during the run, for info.json: failed plugins (their first
        error), the operator capture."""
        found = dict(self._disabled)
        for record in self.manager.records():
            if record.status == "failed" and record.name not in found:
                found[record.name] = {"what": f"plugin '{record.name}'", "reason": record.error,
                                      "iteration": self._failed_at.get(record.name)}
        ops = self.ops
        if ops is not None and ops.error and "operator capture" not in found:
            found["operator capture"] = {"what": "operator capture", "reason": ops.error, "iteration": None}
        return list(found.values())

    def _end_failed_plugin(self, name: str) -> None:
        """A plugin failed mid-run: let it uninstall its collectors (best effort).

        Its own jobprof_session_end, called directly as pluggy holds it (with the arguments
        it declares), not through the isolation that is failing it."""
        self._failed_at.setdefault(name, self._last_index or None)
        impl = self.manager.hookimpl(name, "jobprof_session_end")
        if self.state == "collecting" and impl is not None:
            given = {"session": self}
            impl.function(*[given[a] for a in impl.argnames],
                          **{k: given[k] for k in getattr(impl, "kwargnames", ()) if k in given})

    def _stop(self, message: str) -> None:
        if self.state == "collecting":
            self.state = "stopped"
            self.reporter.error(f"collection stopped: {message}; the job continues unprofiled")
        elif self.state == "finished":  # the last flush, at exit, found the problem
            self.reporter.error(f"collection stopped at exit: {message}")

    def _forked(self) -> None:
        self.state = "inert"  # the child must never act as a second copy of this session
        if self.ops is not None:
            self.ops.forked_child()
        if self.dynamic is not None:
            self.dynamic.forked()

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            pass

    def _own_sigterm(self) -> None:
        """Handle SIGTERM ourselves while finishing, even when the program installed its own
        handler after ours (it then never calls ours): theirs runs after, as it would have."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            current = signal.getsignal(signal.SIGTERM)
            if current is not None and current != self._on_sigterm:  # None: set in C, leave it
                self._previous_sigterm = current
                signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError, TypeError):
            pass

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._finishing:
            # it interrupted finish() (the exit-time export, on this thread): bound the rendering
            # and let finish() write end_info, say what is unrendered and then deliver the signal
            self._signal_during_finish = signum
            if self.sink is not None:
                self.sink.hurry(0 if self._hurried else SIGTERM_RENDER_S)  # a second one: now
            self._hurried = True
            return
        try:
            self.finish("SIGTERM")
        except Exception:
            pass
        try:
            self._deliver(signum, frame)
        except BaseException as exc:
            hide_frame(exc)
            raise

    def _deliver(self, signum: int, frame: Any) -> None:
        """What the program's own SIGTERM disposition does (default: die of it, exit 143)."""
        previous = self._previous_sigterm
        if callable(previous):
            try:  # the program's handler: what it raises shows no frame of ours
                previous(signum, frame)
            except BaseException as exc:
                hide_frame(exc)
                raise
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


#: how long a process going away waits for a sink thread that may wait for it (Sink.lock_wait_s)
SINK_WAIT_S = 1.0
#: the end_reason of a dynamic-mode capture that ran its iterations (or was stopped)
CAPTURE_END = "capture end"
#: how long the session's end waits for a training thread that still runs to stop Kineto
OWNER_STOP_S = 1.0

#: exits after which the process is gone at once (besides ``os._exit(N)`` and SIGTERM)
_HURRIED_EXITS = frozenset({"exec"})
#: option ``export``: "background" renders at most EXIT_RENDER_S at exit, then hands the
#: rest to a detached exporter; "inline" renders everything before the job exits; "off" none
EXPORT_DEFAULT = "background"
#: iteration methods that hand an iteration over as it ends (not inside the next one)
ON_TIME_METHODS = frozenset({"optimizer_step", "explicit"})
EXIT_RENDER_S = 0.25
#: what starting the background exporter costs (a Python start-up and jobprof's imports, s)
EXPORTER_START_S = 0.3

_STEP_CALL = re.compile(r"\bjobprof\s*\.\s*step\s*\(|\bfrom\s+jobprof\s+import\s+[^\n]*\bstep\b")


def _main_calls_step() -> bool:
    """Does the program's main script call ``jobprof.step()``?  Then explicit marks win from
    the first iteration on (a call made only from other modules takes over at its first call)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return bool(_STEP_CALL.search(handle.read(1 << 20)))
    except OSError:
        return False
