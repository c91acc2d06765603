"""The control of the operator capture: the one Kineto capture a session runs for every plugin
that asked for operators (:meth:`~jobprof.runtime.session.Session.request_ops`).  What they asked
(merged to the most detail any needs), installing the capture and starting it at the first root
forward, cutting it at each iteration end on the training thread (sampling, a stop asked from
another thread or after its records broke), the ``ops`` stream as references to Kineto's window
files (built on the sink thread), and stopping it on the thread that started it, as Kineto
needs.  The session owns one :class:`OpsTier`; its hand-over calls it only where a capture is
installed, so the step tier pays one ``is None`` test per iteration for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs

from jobprof.files import kinetotrace
from jobprof.ops.opcapture import STREAM as OPS_STREAM
from jobprof.ops.opcapture import Detail, OpCapture
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.values import Config, Iteration

#: iteration methods that hand an iteration over as it ends (not inside the next one)
ON_TIME_METHODS = frozenset({"optimizer_step", "explicit"})
#: how long the session's end waits for a training thread that still runs to stop Kineto
OWNER_STOP_S = 1.0


class OpsTier:
    def __init__(self, config: Config, reporter: Reporter) -> None:
        self.config, self.reporter = config, reporter
        #: the most detail the plugins asked for; None: no plugin asked for operators
        self.detail: Detail | None = None
        #: record allocations with the operators (PluginSession.request_op_memory)
        self.memory = False
        #: the operator capture, once installed (never replaced once set)
        self.ops: OpCapture | None = None
        #: its records failed to build (sink thread): stop Kineto at the next cut
        self.broken = False
        #: an iteration ended on a thread the operator capture does not record: said once
        self._other_thread_said = False
        self._folder: Path | None = None
        self._ending: Callable[[], bool] = lambda: False
        self._method: Callable[[], str | None] = lambda: None

    def request(self, shapes: bool, cupti_metrics: tuple[str, ...]) -> None:
        wanted = Detail(shapes, False, cupti_metrics)
        self.detail = wanted if self.detail is None else self.detail.merge(wanted)

    @property
    def error(self) -> str | None:
        """Why the capture stopped working (for info.json's ``disabled``), or None."""
        return self.ops.error if self.ops is not None else None

    def install(self, torch: Any, on_root_module: Callable[[Callable[[Any], None], str], None],
                record_module_calls: Callable[[], None], method: Callable[[], str | None]) -> None:
        """Install the capture when some plugin asked for operators; it starts at the first root
        forward (``on_root_module``).  ``method``: the session's iteration method."""
        if self.detail is None:
            return
        try:
            cuda = bool(torch.cuda.is_available())
        except Exception:
            cuda = False
        detail = attrs.evolve(self.detail, cuda=cuda, memory=self.memory)
        self._method = method
        try:
            ops = self.ops = OpCapture(torch, detail, self.reporter.warning)
            ops.every = int(self.config.get("task_trace_every") or 1)
            ops.warm_up()
        except Exception as exc:  # a torch without the profiler API we use
            self.reporter.warning(f"operator capture unavailable on torch {torch.__version__}: {exc!r}")
            return
        if detail.memory:  # the module path of each allocation
            record_module_calls()
        # started at the first root forward: DataLoader workers never run one, and nothing
        # before it belongs to an iteration
        on_root_module(lambda module: ops.start(), "operator capture start")

    def live(self, folder: Path, ending: Callable[[], bool]) -> None:
        """The device folder is claimed: Kineto's scratch files and windows go there; ``ending``
        says the session is ending (windows are then kept as Kineto wrote them)."""
        self._folder, self._ending = folder, ending
        if self.ops is not None:
            self.ops.scratch = lambda: kinetotrace.scratch_file(folder)

    def cut(self, ops: OpCapture, iteration: Iteration, streams: dict[str, Any]) -> None:
        """At an iteration end (training thread, ``ops`` is :attr:`ops`): cut Kineto there and
        add the iteration's ``ops`` stream (built later, on the sink thread) when it is taken."""
        if self.broken and ops.state == "capturing":
            ops.stop_requested = True  # stopped on its own thread, as Kineto needs (below)
        if ops.state == "capturing" and ops.owns_thread():
            if ops.stop_requested:
                ops.stop()  # the session is ending on another thread (see Session.finish)
            else:
                taken = ops.sampled(iteration.index) and self._whole_window(ops, iteration)
                ops.cut(iteration.end_ns, iteration.index)
                if taken:
                    streams[OPS_STREAM] = partial(self._windows, iteration.start_ns, iteration.end_ns)
        elif not ops.owns_thread() and not self._other_thread_said \
                and (ops.state == "capturing" or ops.owner_ended):
            # Kineto records the thread that started it: another thread's operators are not
            # captured, and its iterations get none (not the owner's, by time)
            self._other_thread_said = True
            self.reporter.warning(
                f"iterations end on more than one thread: the operator capture records the "
                f"thread that ran the first forward only; iterations ended on thread "
                f"'{threading.current_thread().name}' and other threads have no operator data "
                f"(from iteration {iteration.index})")

    def _windows(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """The ``ops`` stream of one iteration as references to Kineto's window files (sink
        thread; see jobprof.files.kinetotrace)."""
        folder, ending = self._folder, self._ending
        assert self.ops is not None and folder is not None  # only while capturing, live
        # once the job ends, windows are kept as Kineto wrote them: compressing one of a huge
        # iteration would hold the exit (whoever renders it compresses it)
        refs = self.ops.take_windows(start_ns, end_ns,
                                     lambda result, number: kinetotrace.save_window(
                                         result, number, folder, hurry=ending),
                                     lambda name: kinetotrace.forget_window(name, folder))
        return [kinetotrace.reference(r.name, r.offset_ns, r.size, r.first, r.shapes, r.clip_ns)
                for r in refs]

    def _whole_window(self, ops: OpCapture, iteration: Iteration) -> bool:
        """Sampling resumed Kineto at the end of the iteration before this one: true unless that
        end was found late (forward / backward detection hands an iteration over inside the
        next one: only the optimizer step and jobprof.step() end one as it ends), so that this
        one's start was not recorded.  Then sampling stops (said once): every iteration is
        captured from here on, this one has no operators."""
        method = self._method()
        if ops.resumed_ns is None or method in ON_TIME_METHODS:
            return True
        ops.every = 1
        self.reporter.warning(
            f"task_trace_every: iteration {iteration.index} was found after it had begun (iteration "
            f"method '{method}'), so sampled iterations would miss their start; the "
            f"operators of every iteration are captured from iteration {iteration.index + 1} on "
            "(sampling needs the optimizer step or jobprof.step() to end iterations)")
        return False

    # -- stopping ----------------------------------------------------------------------------
    def halt(self) -> None:
        """A capture session's last boundary (training thread): Kineto stops here."""
        if self.ops is not None:
            self.ops.halt()

    def stop(self) -> None:
        """Stop Kineto now; on the training thread while the session runs (it must not be
        stopped under it)."""
        if self.ops is not None:
            self.ops.stop()

    def stop_on_owner(self) -> None:
        """The session ends: Kineto can be stopped only on the thread that started it; a daemon
        thread still training stops it at its next iteration end."""
        if self.ops is not None:
            self.ops.stop_on_owner(OWNER_STOP_S)

    def stop_at_exit(self) -> None:
        """The session's end, after the last hand-over: stop, and say what the capture noted."""
        if self.ops is not None:
            self.ops.stop()
            for note in self.ops.exit_notes():
                self.reporter.warning(note)

    def forked(self) -> None:
        if self.ops is not None:
            self.ops.forked_child()
