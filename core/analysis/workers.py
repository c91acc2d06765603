"""Worker processes of the commands that reduce ranks in parallel (``summary``, ``report``,
``diff``; ``import``), started and ended so that Ctrl-C stops the command whatever it was doing.

Ctrl-C is a SIGINT to the command (and, from a terminal, to its workers too: one process group).
The command turns it into KeyboardInterrupt, ends its workers and exits 130
(:func:`jobprof.cli.main.main`); a worker ignores it from birth (:func:`ignore_interrupts`).

Two places would leave a worker behind or print a traceback if Ctrl-C landed inside them, so it
is held back for them (:func:`held_interrupt`) and raised as they end:

- starting the pool: a worker spawned but not yet in the pool's table of processes is one the
  command cannot end (it printed a traceback of its own as the command exited); and a spawned
  interpreter starts with Python's own SIGINT handler, so a terminal's Ctrl-C before its
  initializer printed a KeyboardInterrupt traceback from the worker;
- ending the pool (:func:`end`): its workers terminated when the command is interrupted, then
  the pool's threads joined, so that no thread of the pool is left for the interpreter's exit
  (CPython's exit hook then wrote to the pool's closed wake-up pipe: an ``OSError: [Errno 9] Bad
  file descriptor`` traceback after "interrupted"), and its queues' semaphores released whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def held_interrupt() -> Iterator[None]:
    """Ctrl-C held back for the block, then raised (KeyboardInterrupt) as it ends: never inside
    it (one pending as it begins included).

    SIGINT is blocked in this thread, so the processes the block starts inherit it blocked (a
    spawned interpreter keeps the mask: a terminal's Ctrl-C waits until the worker ignores it;
    multiprocessing's resource tracker unblocks it as it starts, so a pool of the spawn context
    starts that first), and a SIGINT taken by another thread meanwhile is only noted.  Off the
    main thread, or where SIGINT is not handled in Python (ignored: ``nohup``, a background
    job), nothing changes."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield
        return
    noted: list[int] = []
    while True:
        try:  # signal.signal runs a pending handler first: a Ctrl-C that came before is held too
            signal.signal(signal.SIGINT, lambda signum, _frame: noted.append(signum))
            break
        except KeyboardInterrupt:
            noted.append(signal.SIGINT)
    try:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            # unblocked: a SIGINT that waited is delivered now, and noted
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted:
        previous(signal.SIGINT, None)  # Python's handler: raises KeyboardInterrupt


def ignore_interrupts() -> None:
    """In a worker, first thing: Ctrl-C is the command's to handle (it ends the workers), and the
    worker dies with the command (SIGTERM, SIGKILL), never left running on its own (Linux)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked by held_interrupt as the pool started it
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() == 1:  # the command was gone before the line above
            os._exit(1)


def end(pool: Any, now: bool = True) -> None:
    """End a ``ProcessPoolExecutor``, its threads joined, with Ctrl-C held back meanwhile (it
    releases its queues' semaphores as it ends: a Ctrl-C half-way through left one to
    multiprocessing's resource tracker, which said so on stderr after the command).  ``now``
    (Ctrl-C, a failed rank, the reader gone): its workers terminated, not left to finish their
    queue (``shutdown`` alone waits for the ranks already running).  ``pool`` None: none was
    started."""
    if pool is None:
        return
    with held_interrupt():
        if now:
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=now)
