"""How a session's output ends: how long the exit may render (option ``export`` and how the
process goes away: exit, SIGTERM, ``os._exit``, exec), what is said about iterations left
unrendered, the end metadata, this rank's facts file, and the detached background exporter that
renders the rest after the job.  :class:`Ending` also keeps whether the end is running on this
thread and the SIGTERM that came meanwhile (the handler of :mod:`jobprof.runtime.sigterm` asks
it), delivered when the end is done.  The session's own teardown (detector, plugins, operator
capture) stays in :meth:`jobprof.runtime.session.Session.finish`, which calls this before and
after it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jobprof.analysis.selection import ranges, run_texts
from jobprof.engine.manager import PluginManager
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.values import Config
from jobprof.runtime.metadata import Metadata
from jobprof.runtime.sink import SIGTERM_RENDER_S, Sink
from jobprof.runtime.storage import RESERVE as STORAGE_RESERVE

#: how long a process going away waits for a sink thread that may wait for it (Sink.lock_wait_s)
SINK_WAIT_S = 1.0
#: the end_reason of a dynamic-mode capture that ran its iterations (or was stopped)
CAPTURE_END = "capture end"
#: exits after which the process is gone at once (besides ``os._exit(N)`` and SIGTERM)
_HURRIED_EXITS = frozenset({"exec"})
#: option ``export``: "background" renders at most EXIT_RENDER_S at exit, then hands the
#: rest to a detached exporter; "inline" renders everything before the job exits; "off" none
EXPORT_DEFAULT = "background"
EXIT_RENDER_S = 0.25
#: what starting the background exporter costs (a Python start-up and jobprof's imports, s)
EXPORTER_START_S = 0.3


def exit_reason(reason: str) -> str:
    """At exit, a program that died of an uncaught exception ends ``exception: <type>`` (Python
    sets ``sys.last_value`` before the atexit handlers run; ``sys.exit`` does not)."""
    if reason == "exit":
        died = getattr(sys, "last_value", None)
        if isinstance(died, BaseException):
            return f"exception: {type(died).__name__}"
    return reason


class Ending:
    def __init__(self, config: Config, manager: PluginManager, reporter: Reporter, meta: Metadata) -> None:
        self.manager, self.reporter, self.meta = manager, reporter, meta
        #: option export: "background", "inline" or "off"
        self.mode = config.get("export") or EXPORT_DEFAULT
        #: the end is running on this thread (a SIGTERM handler that interrupts it must not
        #: re-enter it), and the SIGTERM it received meanwhile, delivered when it is done
        self.finishing = self.hurried = False
        self.signal_during_finish: int | None = None
        #: what cut the exit-time rendering short (SIGTERM, os._exit, exec), for the message
        self._hurried_by = ""

    def interrupted(self, signum: int, sink: Sink | None) -> bool:
        """A SIGTERM came: True when it interrupted the end (the exit-time export, on this
        thread).  Then the rendering is bounded (a second one: now), and the end writes
        end_info, says what is unrendered and then delivers the signal."""
        if not self.finishing:
            return False
        self.signal_during_finish = signum
        if sink is not None:
            sink.hurry(0 if self.hurried else SIGTERM_RENDER_S)
        self.hurried = True
        return True

    def take_signal(self) -> int | None:
        """The SIGTERM that came during the end, to deliver now (once)."""
        signum, self.signal_during_finish = self.signal_during_finish, None
        return signum

    def begin(self, reason: str, sink: Sink | None) -> None:
        """Before the teardown: bound the exit-time rendering by how the process ends."""
        if reason == "SIGTERM" or reason in _HURRIED_EXITS or reason.startswith("os._exit("):
            # the process is going away now: raw data and end_info, rendering for a second
            self._hurried_by = self._hurried_by or reason.split("(")[0]
            self.hurried = True
            if sink is not None:
                sink.hurry(SIGTERM_RENDER_S)
                # the signal may have cut into an import the sink thread waits for
                sink.lock_wait_s = SINK_WAIT_S
        elif sink is not None and self.mode != "inline":
            # the job ends when it ends: what EXIT_RENDER_S does not render, the exporter does
            # (unless what is left costs less than the exporter's own start-up)
            sink.hurry(EXIT_RENDER_S if self.mode == "background" else 0)
            if self.mode == "background":
                sink.finish_within_s = EXPORTER_START_S

    def close(self, sink: Sink, reason: str, job_dir: Path, write_metadata: Callable[[str], None],
              mid_run: bool) -> None:
        """After the teardown: drain the sink, say what is left unrendered, write the end
        metadata (``write_metadata(end_reason)``) and the facts file, start the exporter.
        ``mid_run``: a dynamic-mode capture's end, whose facts are not in the job's time."""
        sink.close()
        if self.signal_during_finish is not None and reason != "SIGTERM":
            name = signal.Signals(self.signal_during_finish).name
            reason = (f"{name} (during the exit-time export)" if reason == "exit"
                      else f"{reason}; then {name} during the exit-time export")
        if sink.stuck:
            self.reporter.warning(
                f"the exporting thread was waiting for an import that {reason} interrupted"
                f"{f' (its import at {sink.stuck_at})' if sink.stuck_at else ''}; "
                f"after {sink.lock_wait_s:g} s jobprof went on without it: iterations after the "
                "last one on disk are lost")
        for note, iterations in sink.notes.items():  # one line per kind, not per iteration
            self.reporter.warning(f"{note}: iteration(s) {', '.join(ranges(iterations))}")
        handed = None
        mode = self.mode
        if sink.unrendered and not sink.failed and mode == "background":
            handed = self._hand_over(sink, job_dir)
        elif sink.unrendered and not sink.failed and mode == "off":
            self.reporter.info(f"{sink.unrendered_count} iteration(s) saved as raw data, not rendered "
                               f"(export \"off\"): `jobprof export {job_dir}` renders them")
        elif sink.unrendered and not sink.failed:  # said first: end_info keeps the message
            why = [f"{sink.deferred} beyond the in-process backlog"] if sink.deferred else []
            if sink.unrendered_count > sink.deferred:
                why.append(f"{sink.unrendered_count - sink.deferred} left when "
                           f"{self._hurried_by or 'SIGTERM'}'s {SIGTERM_RENDER_S:g} s for "
                           "rendering ran out")
            self.reporter.warning(
                f"{sink.unrendered_count} iteration(s) were not rendered in the job "
                f"({', '.join(why)}; iterations {', '.join(run_texts(sink.unrendered))}; raw data "
                f"kept): run `jobprof export {job_dir}`")
        sink.release_reserve()  # room for end_info and info.json, even on a full disk
        try:
            write_metadata(reason)
        except OSError as exc:
            if not sink.failed:  # else the failure was said, once, with what was saved
                self.reporter.error(f"cannot write end_info in {self.meta.device_dir}: "
                                    f"{exc.strerror or exc}")
        device = self.meta.device_id
        if not sink.failed and not self.hurried and self.signal_during_finish is None \
                and device is not None and not sink.unrendered and not mid_run:
            self._write_facts(job_dir, device, sink)  # else the exporter (or `jobprof export`) does
        if handed is not None:
            try:  # after end_info and info.json: the exporter updates them
                self._start_exporter(sink, handed)
            except OSError as exc:
                self.reporter.warning(
                    f"could not start the background exporter ({exc.strerror or exc}): "
                    f"{sink.unrendered_count} iteration(s) not rendered (raw data kept): run "
                    f"`jobprof export {job_dir}`")

    def _hand_over(self, sink: Sink, job_dir: Path) -> list[list[int]]:
        """What the background exporter renders (said once, now: end_info keeps the line)."""
        self.reporter.info(
            f"{sink.unrendered_count} iteration(s) left to render ({', '.join(run_texts(sink.unrendered))}): "
            f"a background exporter renders them after the job (lowest priority; "
            f"`jobprof export --wait {job_dir}` waits for it)")
        return [list(r) for r in sink.unrendered]

    def _start_exporter(self, sink: Sink, iterations: list[list[int]]) -> None:
        from jobprof.runtime import background

        assert self.meta.device_dir is not None  # a sink had iterations
        budget = sink.budget
        room = max(0, budget.limit_bytes - STORAGE_RESERVE - budget.total_bytes)
        background.start(self.meta.device_dir, iterations, room)

    def _write_facts(self, job_dir: Path, device: int, sink: Sink) -> None:
        """Reduce this rank once, now, into its facts file: ``summary`` and ``report`` then read
        no raw data of it (a SIGTERM'd exit skips it: the commands compute the facts instead)."""
        try:
            from jobprof.analysis import facts

            facts.write(job_dir, self.manager, devices=[device], known={device: sink.parts})
        except Exception as exc:  # a cache: the job's exit never fails for it
            self.reporter.warning(f"could not write the facts file in {self.meta.device_dir}: {exc!r} "
                                  "(summary and report will read the raw data instead)")

    def parts_of(self, streams: Mapping[str, list[Any]]) -> Any:
        """An iteration's summary parts and plugin digests, asked by the exporter as it renders
        one with operators (sink thread): the facts file written at exit takes them instead of
        reading its operator windows again, which cost as much as rendering them."""
        from jobprof.analysis import facts

        return facts.kept_of(self.manager, streams)
