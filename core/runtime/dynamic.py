"""Dynamic mode (``PROFILING_MODE=dynamic``): the step tier always on, captures on demand.

The job's session runs the step tier only (``training_trace``, or nothing written when it is
off) and this controller, told every iteration end on the training thread.  A capture is a
second :class:`~jobprof.runtime.session.Session` with every plugin the job's options (laid over
by the request's) turn on, borrowing the job's step detector: it starts at an iteration
boundary, ends at another, and writes a complete ``PROF_`` folder of its own (a sibling of the
job's) that summary / report / merge / diff / kineto read unchanged; its info.json says why it
ran (``jobprof.capture``).

Requests come through the job's control folder (:mod:`jobprof.files.control`): from ``jobprof
start`` / ``stop``, or from a trigger that fired on some rank.  The per-iteration cost when
nothing happens: a clock read, a deque append and a comparison.  The file work runs on a helper
thread (``jobprof-control``, :class:`_Files`): it lists the folder every
:data:`~jobprof.files.control.POLL_S` and tells the training thread when a request is there to
read, writes the status built every :data:`~jobprof.files.control.STATUS_S`, and on rank 0 reads
the ranks' statuses for ``rank_outlier`` (measured on a 37 ms transformer step: 0.4-0.7 ms per
iteration on the training thread before, mostly the status write).  What can take longer
(loading the capture's plugins, validating its options, finishing it: rendering, the background
exporter) runs on helper threads; the training thread does only the hand-over (plugins'
``session_start`` and Kineto's start at the first boundary, Kineto's stop at the last).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from jobprof import __version__
from jobprof.files import control, profdir
from jobprof.files.control import Request, Stop, Untrusted
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.values import Iteration

if TYPE_CHECKING:
    from jobprof.runtime.session import Session

#: iteration times kept for the running median (triggers, the rate in the status)
WINDOW = 51
#: how long the job's end waits for a capture that is finishing on its helper thread (s)
FINISH_WAIT_S = 10.0
#: ... and when it goes away at once (SIGTERM): the capture's rendering is cut short too
HURRIED_WAIT_S = 1.0
#: the controller's own time per iteration is counted from this iteration on
OWN_TIME_FROM = 10
#: the step-tier option keys the job's own session keeps in dynamic mode
STEP_KEYS = ("output", "storage_limit", "export", "training_trace", "fp_point", "bp_point")
#: trigger defaults (schemas/options.json ``trigger``)
TRIGGER_DEFAULTS = {"iterations": 10, "cooldown_s": 900.0, "warmup": 20}


def step_tier_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """The options of the job's own session in dynamic mode: the step tier only."""
    kept = {k: values[k] for k in STEP_KEYS if k in values}
    kept["task_trace"] = "off"  # on by default (msprof's); the operator tier waits for a capture
    return kept


@attrs.define
class Pending:
    """A request seen, its capture session being prepared on a helper thread."""

    request: Request
    session: Session | None = None
    error: str | None = None
    done: threading.Event = attrs.field(factory=threading.Event)


@attrs.define
class Active:
    """The capture running now."""

    request: Request
    session: Session
    first: int
    last: int
    note: str = ""


class _Files:
    """The controller's file work, on a daemon thread of its own: what the training thread
    would otherwise wait for at iteration ends (a directory listing, a JSON write and rename,
    every rank's status read).  It decides nothing: it sets :attr:`news` when the folder holds
    a request the controller has not read (the controller reads and answers it on the training
    thread, as before) and :attr:`outlier` when rank 0 finds an outlying rank (the controller
    fires the trigger)."""

    def __init__(self, controller: Controller) -> None:
        self._controller = controller
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._status: tuple[Path, str, str, dict[str, Any]] | None = None
        self._stopped = False
        self._next_outlier = 0.0
        #: a request (or a stop for this process's capture) waits in the folder
        self.news = False
        #: rank 0's verdict that some rank is an outlier (the trigger's reason)
        self.outlier: str | None = None
        self._thread = threading.Thread(target=self._run, name="jobprof-control", daemon=True)
        self._thread.start()

    def publish(self, folder: Path, key: str, old_key: str, status: dict[str, Any]) -> None:
        """Write ``status`` at this thread's next turn, within ``POLL_S`` (a newer one replaces
        one not yet written).  Not woken for it: waking a thread from the training thread cost
        ~2 ms of its time at each status (the woken thread took the CPU from it)."""
        with self._lock:
            self._status = (folder, key, old_key, status)

    def stop(self) -> None:
        """No more writes from this thread (the last status is the caller's to write)."""
        self._stopped = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(0.5)

    def _run(self) -> None:
        controller = self._controller
        while not self._stopped:
            self._wake.wait(control.POLL_S)
            self._wake.clear()
            with self._lock:
                item, self._status = self._status, None
            if self._stopped:
                return
            try:
                if item is not None:
                    controller._publish(*item)
                self._look(controller)
                trigger = controller.trigger
                if trigger and trigger.get("rank_outlier") and controller._key == "00000" \
                        and time.monotonic() >= self._next_outlier:
                    self._next_outlier = time.monotonic() + control.STATUS_S
                    self.outlier = controller._outlier(float(trigger["rank_outlier"]))
            except Exception:  # never this thread's end: the training thread's poll says what fails
                self.news = True

    def _look(self, controller: Controller) -> None:
        folder = controller.folder
        if folder is None:
            return
        try:
            control.check_folder(folder, controller.uid)
            starts, stops, _ = control.entries(folder)
        except (OSError, Untrusted):
            self.news = True  # the training thread's poll finds it and says so once
            return
        if any(number > controller.seen for number in starts) or any(
                number not in controller._stops and controller._targets(number) for number in stops):
            self.news = True


class Controller:
    """The captures of one process of a job in dynamic mode (see the module docstring)."""

    def __init__(self, base: Session, options: Mapping[str, Any], trigger: Mapping[str, Any] | None,
                 reporter: Reporter) -> None:
        self.base, self.reporter = base, reporter
        #: the job's own options (as the user wrote them): each capture's, under the request's
        self.options = dict(options)
        self.trigger = {**TRIGGER_DEFAULTS, **trigger} if trigger else None
        self.uid = os.geteuid()
        self.folder: Path | None = None
        self.torch: Any = None
        self.pending: Pending | None = None
        #: a capture session prepared ahead for the job's own options (triggers on)
        self._armed: Session | None = None
        self.capture: Active | None = None
        self._ending: threading.Thread | None = None
        self._finishing: Session | None = None  # the capture that thread finishes
        self.seen = 0  # the highest request id looked at
        self._stops: set[int] = set()
        self.history: deque[dict[str, Any]] = deque(maxlen=20)
        self.refused: deque[str] = deque(maxlen=10)
        #: the answer to each start request this process refused or cancelled, by id (in its
        #: status: `jobprof start` reads its own request's answer here, never from the text)
        self.refusals: deque[dict[str, Any]] = deque(maxlen=20)
        self._said: set[str] = set()
        self._inert = False
        self._rank: dict[str, Any] = {}
        self._key = f"pid{os.getpid()}"
        self._next_poll = 0
        self._next_status = 0
        #: the file work's thread, from the first iteration end (the folder made)
        self._files: _Files | None = None
        self._changed = True
        self.index = 0
        self.durations: deque[int] = deque(maxlen=WINDOW)
        self._median = 0
        self._median_at = 0
        self._last_fire = -1e18
        self._growth = 0
        self._memory_prev = -1
        self._statm: int | None = None
        self._page = 4096
        #: the controller's own time at iteration ends outside captures, and how many
        self.own_ns = 0
        self.own_count = 0
        #: requests written before this process ran are history, not news (an elastic restart)
        self._born = time.time()

    # -- from the job's session --------------------------------------------------------------
    def torch_ready(self, torch: Any) -> None:
        self.torch = torch
        if self.trigger is not None:
            threading.Thread(target=self._arm, name="jobprof-capture-prepare", daemon=True).start()

    def attached(self, name: str) -> Any:
        capture = self.capture
        return capture.session.attached(name) if capture is not None else None

    def forked(self) -> None:
        self._inert = True
        capture = self.capture
        if capture is not None:
            capture.session._forked()

    def on_iteration(self, iteration: Iteration) -> None:
        """Every iteration end of the job, on the training thread; never raises."""
        if self._inert:
            return
        began = time.monotonic_ns()
        try:
            self._on_iteration(iteration)
            # this controller's own time, outside captures and after its first iterations
            # (making the control folder, the first status): the bench's idle cost per step
            if self.capture is None and iteration.index > OWN_TIME_FROM:
                self.own_ns += time.monotonic_ns() - began
                self.own_count += 1
        except Exception as exc:  # the job comes first: dynamic mode ends, the step tier goes on
            self._inert = True
            self.reporter.error(f"dynamic mode stopped: internal error at iteration {iteration.index}: "
                                f"{exc!r}; the job goes on (its step tier too)")

    def _on_iteration(self, iteration: Iteration) -> None:
        index = self.index = iteration.index
        now = time.monotonic_ns()
        capture = self.capture
        if capture is not None:
            capture.session.on_iteration(iteration)
            if index >= capture.last:
                self._end(capture, index)
        else:
            self._observe(iteration, now)
        if now >= self._next_poll:
            self._next_poll = now + int(control.POLL_S * 1e9)
            files = self._files
            if files is None or files.news:
                if files is not None:
                    files.news = False
                self._poll(index)
        pending = self.pending
        if pending is not None and self.capture is None and index + 1 >= pending.request.at:
            self._begin(pending, index)
        if now >= self._next_status or self._changed:
            self._next_status = now + int(control.STATUS_S * 1e9)
            self._write_status()

    def close(self, reason: str) -> None:
        """The job's session ends (any thread): the running capture ends with it, the one
        finishing is waited for (bounded), and the status says the job has ended."""
        if self._inert:
            return
        capture, self.capture = self.capture, None
        if capture is not None:
            capture.last = min(capture.last, self.index)  # the job's last iteration
            capture.session.info["capture"].update(last=capture.last, note=(
                f"{capture.note}; " if capture.note else "") + f"ended with the job ({reason})")
            self._record(capture, "ended with the job")
            try:
                capture.session.finish(reason)
            except Exception as exc:
                self.reporter.warning(f"capture {capture.request.id} could not be finished: {exc!r}")
        ending, finishing = self._ending, self._finishing
        if ending is not None and ending.is_alive():
            # a process going away (SIGTERM, os._exit, exec) does not wait for a capture's
            # rendering: it is cut short, its raw data is on disk (`jobprof export` renders it)
            hurried = reason == "SIGTERM" or reason == "exec" or reason.startswith("os._exit(")
            if hurried and finishing is not None and finishing.sink is not None:
                finishing.sink.hurry(0)
            ending.join(HURRIED_WAIT_S if hurried else FINISH_WAIT_S)
        if self._files is not None:
            self._files.stop()  # no status of its after this last one
        self._write_status(ended=reason)
        self._inert = True

    # -- captures ----------------------------------------------------------------------------
    def _poll(self, index: int) -> None:
        if self.folder is None:
            try:
                self.folder = control.make(self.base.job_dir)
            except OSError as exc:
                self._say_once("folder", f"dynamic mode: cannot make the control folder "
                                         f"{control.folder_of(self.base.job_dir)} ({exc.strerror or exc}); "
                                         "captures cannot be asked for in this job")
                self._inert = True
                return
            self._files = _Files(self)
        try:
            control.check_folder(self.folder, self.uid)
            starts, stops, _ = control.entries(self.folder)
        except (OSError, Untrusted) as exc:
            self._say_once("untrusted", f"dynamic mode: the control folder is not the job's own "
                                        f"({exc}); requests in it are ignored")
            return
        for number in sorted(n for n in starts if n > self.seen):
            self.seen = number  # in the status: this process has read (and answered) request N
            self._changed = True
            request = self._read(self.folder / starts[number], Request, number)
            if request is not None and request.id != number:
                self._refuse(f"{starts[number]} refused: it names capture {request.id}", number)
            elif request is not None:
                self._consider(request, index)
        for number in stops:
            if number not in self._stops and self._targets(number):
                stop = self._read(self.folder / stops[number], Stop)
                self._stops.add(number)
                if stop is not None:
                    self._stop(stop, index)

    def _read(self, path: Path, kind: Any, number: int | None = None) -> Any:
        """The request in ``path`` (None: refused, and said; ``number``: a start request's id)."""
        try:
            return kind.from_json(control.read_trusted(path, self.uid))
        except (Untrusted, ValueError) as exc:
            self._refuse(f"{path.name} refused: {exc}", number)
        except OSError as exc:
            self._refuse(f"{path.name} could not be read: {exc.strerror or exc}", number)
        return None

    def _targets(self, number: int) -> bool:
        return any(c is not None and c.request.id == number for c in (self.capture, self.pending))

    def _consider(self, request: Request, index: int) -> None:
        if request.last <= index:
            if request.created >= self._born:
                self._refuse(f"capture {request.id} refused: it asked for iterations {request.at}-"
                             f"{request.last}, and this rank had run iteration {index} when it read it",
                             request.id)
            return
        busy = self.capture or self.pending
        if busy is not None:
            self._refuse(f"capture {request.id} refused: capture {busy.request.id} is running "
                         f"({busy.request.trigger})", request.id, running=busy.request.id)
            return
        armed = self._armed
        if not request.options and armed is not None:
            self._armed = None  # prepared ahead for the job's own options (a trigger's)
            try:
                self._label(armed, request)
                self.pending = Pending(request, armed)
                self.pending.done.set()
            except ValueError as exc:
                self._refuse(f"capture {request.id} refused: {exc}", request.id)
            self._changed = True
            return
        pending = self.pending = Pending(request)
        threading.Thread(target=self._prepare, args=(pending,), name="jobprof-capture-prepare",
                         daemon=True).start()
        self._changed = True

    def _prepare(self, pending: Pending) -> None:
        """Load the plugins and validate the capture's options (helper thread)."""
        try:
            session = self._build(pending.request.options)
            self._label(session, pending.request)
            pending.session = session
        except Exception as exc:
            pending.error = str(exc) if isinstance(exc, ValueError) else repr(exc)
        finally:
            pending.done.set()

    def _arm(self) -> None:
        """With triggers on: prepare the next triggered capture's session now (helper thread),
        so that it starts at the boundary after its trigger fired."""
        try:
            self._armed = self._build({})
        except Exception:  # the capture it would have served prepares itself (and says why not)
            self._armed = None

    def _build(self, overrides: Mapping[str, Any]) -> Session:
        """A capture session: the job's options under ``overrides`` (ValueError: invalid)."""
        from jobprof.engine.configure import prepare
        from jobprof.engine.manager import PluginManager
        from jobprof.runtime.session import Session

        options = {**self.options, **overrides}
        options["output"] = self.options.get("output", options.get("output"))
        manager = PluginManager(self.reporter)
        outcome, composed = prepare(manager, os.environ, text=json.dumps(options))
        if outcome.config is None:
            raise ValueError("its options are invalid: "
                             + "; ".join(p.render() for p in outcome.problems))
        # the folder is the request's (set by _label before the capture begins)
        return Session(outcome.config, manager, composed.owners, self.reporter,
                       capture_of=self.base, capture_dir=self.base.job_dir)

    def _label(self, session: Session, request: Request) -> None:
        """Point ``session`` at the request's folder and say why it runs (info.json)."""
        path = self.base.job_dir.parent / request.prof_dir
        problem = profdir.inherited_problem(str(path), str(self.base.job_dir.parent))
        if problem is not None or path == self.base.job_dir:
            raise ValueError(f"prof_dir {request.prof_dir!r} {problem or 'is the job folder'}")
        session.job_dir = path
        session.info["capture"] = {"id": request.id, "trigger": request.trigger,
                                   "reason": request.reason, "by": request.by,
                                   "asked": [request.at, request.last],
                                   "job": self.base.job_dir.name, "options": dict(request.options)}

    def _begin(self, pending: Pending, index: int) -> None:
        """Start the prepared capture at this boundary (training thread)."""
        request = pending.request
        single = self._world() <= 1
        if not pending.done.is_set():
            if single or index + 1 <= request.last:
                return  # not ready yet: at the next boundary (said in the capture's note)
            pending.error = "its plugins were not ready before its last iteration"
        self.pending = None
        self._changed = True
        if pending.session is None or self.torch is None or self.base.detector is None:
            self._refuse(f"capture {request.id} refused: {pending.error or 'torch is not loaded'}",
                         request.id)
            return
        first = index + 1
        last = first + request.iterations - 1 if single else request.last
        if first > last:
            self._refuse(f"capture {request.id} refused: its iterations {request.at}-{request.last} had "
                         f"passed when it was ready (iteration {index})", request.id)
            return
        note = f"started {first - request.at} iteration(s) late" if first > request.at else ""
        session = pending.session
        # from the request's writing to this boundary: what `jobprof start` costs in time
        session.info["capture"].update({"first": first, "last": last, "note": note,
                                        "latency_s": round(time.time() - request.created, 3)})
        started = time.monotonic_ns()
        session.begin_capture(self.torch, self.base.detector)
        session.record_own(started, time.monotonic_ns(), "capture start")
        self.capture = Active(request, session, first, last, note)
        self._record(self.capture, "running")

    def _end(self, capture: Active, index: int) -> None:
        """The capture's last boundary (training thread): Kineto stops here, the rest of its
        end (plugins, rendering, metadata) on a helper thread."""
        self.capture = None
        capture.last = index
        capture.session.info["capture"]["last"] = index
        capture.session.end_capture()
        self._record(capture, "finished")
        if capture.request.trigger != "manual":  # the cool-down runs from a triggered capture's end
            self._last_fire = time.monotonic()
        self._finishing = capture.session
        thread = self._ending = threading.Thread(target=self._finish_capture, args=(capture.session,),
                                                 name="jobprof-capture-end", daemon=True)
        thread.start()
        self._changed = True

    def _finish_capture(self, session: Session) -> None:
        """The end of a capture after its last boundary (helper thread), then the next armed."""
        from jobprof.runtime.ending import CAPTURE_END

        session.finish(CAPTURE_END)
        if self.trigger is not None and not self._inert:
            self._arm()

    def _stop(self, stop: Stop, index: int) -> None:
        pending, capture = self.pending, self.capture
        if pending is not None and pending.request.id == stop.id and index + 1 < pending.request.at:
            self.pending = None
            self._refuse(f"capture {stop.id} cancelled before it began ({stop.by})", stop.id,
                         state="cancelled")
        elif capture is not None and capture.request.id == stop.id:
            capture.last = max(index + 1, min(capture.last, stop.at - 1))
            capture.session.info["capture"]["stopped_by"] = stop.by
        self._changed = True

    def _record(self, capture: Active, state: str) -> None:
        entry = {"id": capture.request.id, "trigger": capture.request.trigger,
                 "reason": capture.request.reason, "first": capture.first, "last": capture.last,
                 "prof_dir": capture.request.prof_dir, "state": state, "note": capture.note}
        if self.history and self.history[-1]["id"] == entry["id"]:
            self.history[-1] = entry
        else:
            self.history.append(entry)
        self._changed = True

    def _refuse(self, message: str, number: int | None = None, running: int | None = None,
                state: str = "refused") -> None:
        """Say ``message`` (stderr, the status's ``refused``); with ``number``, also the answer
        to start request ``number`` (``running``: the capture that stood in its way)."""
        self.refused.append(message)
        if number is not None:
            self.refusals.append({"id": number, "state": state, "why": message, "running": running})
        self._changed = True
        self.reporter.warning(f"dynamic mode: {message}")

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.reporter.warning(message)

    # -- status ------------------------------------------------------------------------------
    def _world(self) -> int:
        world = self._rank.get("world_size")
        return world if isinstance(world, int) else 1

    def _rank_info(self) -> None:
        if self._rank.get("rank_from") in ("RANK / WORLD_SIZE", "torch.distributed") or self.torch is None:
            return
        self._rank = profdir.job_rank(self.torch)
        rank = self._rank.get("rank_id")
        if isinstance(rank, int):
            self._key = f"{rank:05d}"

    def _write_status(self, ended: str | None = None) -> None:
        self._changed = False
        folder = self.folder
        if folder is None:
            return
        old_key = self._key
        self._rank_info()
        capture, pending, ending = self.capture, self.pending, self._ending
        writing = self._finishing if ending is not None and ending.is_alive() else None
        median = self._median_ns()
        status = {
            "key": self._key, "rank": self._rank.get("rank_id", "N/A"), "world": self._world(),
            "pid": os.getpid(), "ppid": os.getppid(), "host": socket.gethostname(), "version": __version__,
            "job": self.base.job_dir.name, "iteration": self.index, "time": time.time(),
            "rate": round(1e9 / median, 3) if median else 0.0,
            "median_ms": round(median / 1e6, 3) if median else None,
            "step_tier": not self.base.quiet,
            "capture": None if capture is None else {"id": capture.request.id, "first": capture.first,
                                                     "last": capture.last, "state": "running",
                                                     "prof_dir": capture.request.prof_dir},
            "pending": None if pending is None else {"id": pending.request.id, "at": pending.request.at},
            "finishing": writing is not None,
            "finishing_id": None if writing is None else writing.info["capture"]["id"],
            "captures": list(self.history), "refused": list(self.refused),
            "seen": self.seen, "refusals": list(self.refusals),
            "trigger": self.trigger, "options": self.options, "ended": ended,
            "own_us_per_iteration": round(self.own_ns / self.own_count / 1e3, 3) if self.own_count else None,
        }
        files = self._files
        if files is not None and ended is None:
            files.publish(folder, self._key, old_key, status)  # written off the training thread
        else:
            self._publish(folder, self._key, old_key, status)

    def _publish(self, folder: Path, key: str, old_key: str, status: dict[str, Any]) -> None:
        try:
            control.publish(folder, control.rank_name(key), status)
            if old_key != key:  # the rank became known: the pid-named status goes
                (folder / control.rank_name(old_key)).unlink(missing_ok=True)
        except OSError as exc:
            self._say_once("status", f"dynamic mode: cannot write this process's status in {folder} "
                                     f"({exc.strerror or exc}); `jobprof status` will not list it")

    def _median_ns(self) -> int:
        if len(self.durations) >= 3 and self.index != self._median_at:
            ordered = sorted(self.durations)  # statistics.median costs 3x as much
            half = len(ordered) // 2
            self._median = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) // 2
            self._median_at = self.index
        return self._median

    # -- triggers ----------------------------------------------------------------------------
    def _observe(self, iteration: Iteration, now: int) -> None:
        duration = iteration.end_ns - iteration.start_ns
        trigger = self.trigger
        if trigger is not None and len(self.durations) >= max(3, int(trigger["warmup"])):
            k = trigger.get("slow_iteration")
            if self.index % 16 == 0 or not self._median:
                self._median_ns()
            if k and self._median and duration > k * self._median:
                self._fire("slow_iteration", f"iteration {iteration.index} took {duration / 1e6:.1f} ms, "
                                             f"{duration / self._median:.1f}x the running median "
                                             f"{self._median / 1e6:.1f} ms (threshold {k:g}x)")
            if trigger.get("memory_growth"):
                self._memory_trigger(int(trigger["memory_growth"]), iteration.index)
            files = self._files
            if files is not None and files.outlier is not None:  # rank 0's check, on that thread
                reason, files.outlier = files.outlier, None
                self._fire("rank_outlier", reason)
        self.durations.append(duration)
        if len(self.durations) == 3:
            self._changed = True  # the rate is known now: `jobprof start` needs it

    def _memory_trigger(self, m: int, index: int) -> None:
        used = self._memory()
        if used is None:
            return
        self._growth = self._growth + 1 if used > self._memory_prev >= 0 else 0
        self._memory_prev = used
        if self._growth >= m:
            self._growth = 0
            self._fire("memory_growth", f"memory in use grew at {m} iteration ends in a row, to "
                                        f"{used / 2**20:.1f} MiB at iteration {index}")

    def _memory(self) -> int | None:
        """Bytes in use: the CUDA caching allocator's when CUDA is in use, else the resident set."""
        torch = self.torch
        try:
            if torch is not None and torch.cuda.is_initialized():
                return int(torch.cuda.memory_allocated())
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
                self._page = os.sysconf("SC_PAGE_SIZE")
            return int(os.pread(self._statm, 128, 0).split()[1]) * self._page
        except Exception:
            self._say_once("memory", "trigger memory_growth: memory in use cannot be read here; "
                                     "that trigger is off")
            assert self.trigger is not None
            self.trigger["memory_growth"] = None
            return None

    def _outlier(self, percent: float) -> str | None:
        """Rank 0, once a second (on the file thread): the reason to fire ``rank_outlier`` when
        some rank's median iteration time is outside the others', else None."""
        if self.folder is None:
            return None
        states = [s for s in control.statuses(self.folder, self.uid)
                  if control.live(s) and s.get("median_ms") and not s.get("capture") and not s.get("ended")]
        if len(states) < 2:
            return None
        for status in states:
            others = statistics.median(s["median_ms"] for s in states if s is not status)
            mine = status["median_ms"]
            if others and abs(mine - others) > others * percent / 100:
                return (f"rank {status.get('rank')}'s median iteration time {mine:.1f} ms is "
                        f"{100 * (mine - others) / others:+.0f}% from the other ranks' {others:.1f} ms "
                        f"(threshold {percent:g}%)")
        return None

    def _fire(self, trigger: str, reason: str) -> None:
        """Ask every rank for a capture of the next iterations, unless one runs or the
        cool-down since the last triggered one has not passed (asked through the folder:
        the first rank to write request N wins; the others find it there)."""
        assert self.trigger is not None
        if self.capture or self.pending or self.folder is None \
                or time.monotonic() - self._last_fire < float(self.trigger["cooldown_s"]):
            return
        self._last_fire = time.monotonic()
        folder = self.folder
        try:
            number = control.next_id(folder)
            latest = number - 1
            if latest >= 1:
                previous = Request.from_json(
                    control.read_trusted(folder / control.request_name("start", latest), self.uid))
                if previous.trigger != "manual" \
                        and time.time() - previous.created < float(self.trigger["cooldown_s"]):
                    return  # another rank's trigger fired meanwhile
            if self._world() <= 1:  # alone: the next iteration (the capture waits if not ready)
                at = self.index + 1
            else:
                at = control.agreed_iteration(control.statuses(folder, self.uid)) or self.index + 2
            name = profdir.job_dir(str(self.base.job_dir.parent), {})
            if name[1] is not None:
                name[1].close()  # the name is what the request carries; the capture makes it
            first, count = max(at, self.index + 1), int(self.trigger["iterations"])
            request = {"id": number, "at": first, "iterations": count,
                       "options": {}, "prof_dir": name[0].name, "trigger": trigger, "reason": reason,
                       "by": f"trigger on rank {self._rank.get('rank_id', 'N/A')} (pid {os.getpid()})",
                       "created": time.time()}
            if control.publish(folder, control.request_name("start", number), request, exclusive=True):
                self.reporter.info(f"dynamic mode: trigger {trigger}: {reason}; capturing iterations "
                                   f"{first}-{first + count - 1} into {name[0].name}")
            self._next_poll = 0  # read it (ours or the winner's) at once
            if self._files is not None:
                self._files.news = True
        except (OSError, Untrusted, ValueError) as exc:
            self._say_once("fire", f"dynamic mode: trigger {trigger} could not ask for a capture ({exc})")
