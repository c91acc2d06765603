"""SIGTERM in a profiled job: the session ends (raw data, end_info, a bounded rendering), then the
program's own disposition runs as it would have unprofiled (its handler, ignoring it, or dying of
it: exit 143).  :class:`Sigterm` installs the handler on the main thread, takes SIGTERM back
while the session ends even when the program installed its own handler after ours, and
delivers a signal that came during the end once that is done.  No frame of jobprof shows in
what the program's handler raises.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from jobprof.plugin.frames import hide_frame


class Sigterm:
    def __init__(self, finish: Callable[[str], None], interrupted: Callable[[int], bool]) -> None:
        """``finish(reason)`` ends the session; ``interrupted(signum)``: the signal came while
        it was ending on this thread (True: the end delivers it when it is done)."""
        self._finish, self._interrupted = finish, interrupted
        self._previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self.handler)
        except (ValueError, OSError):
            pass

    def own(self) -> None:
        """Handle SIGTERM ourselves while finishing, even when the program installed its own
        handler after ours (it then never calls ours): theirs runs after, as it would have."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            current = signal.getsignal(signal.SIGTERM)
            if current is not None and current != self.handler:  # None: set in C, leave it
                self._previous = current
                signal.signal(signal.SIGTERM, self.handler)
        except (ValueError, OSError, TypeError):
            pass

    def handler(self, signum: int, frame: Any) -> None:
        if self._interrupted(signum):
            return  # it interrupted the end (the exit-time export): delivered when that is done
        try:
            self._finish("SIGTERM")
        except Exception:
            pass
        try:
            self.deliver(signum, frame)
        except BaseException as exc:
            hide_frame(exc)
            raise

    def deliver(self, signum: int, frame: Any) -> None:
        """What the program's own SIGTERM disposition does (default: die of it, exit 143)."""
        previous = self._previous
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
