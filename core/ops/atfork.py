"""A forked child of a process that ran Kineto must be able to exit.

Kineto's ``ConfigLoader`` (a function-local static, built the first time a profiler session is
prepared) starts a thread that waits on a condition variable for as long as the process lives.
A child forked from that process inherits the condition variable with the parent's waiter
counted in it but not the thread; when the child ends through ``exit()`` (``sys.exit``, the end
of the script), the C++ static destructors run and glibc's ``pthread_cond_destroy`` waits for
that waiter forever: the child hangs and the parent's ``waitpid`` with it.  torch.profiler has
the same bug (a job that used it and forks hangs unprofiled too), but jobprof starts Kineto in
jobs that never asked for it, so a job that exits fine unprofiled must exit fine profiled.

:func:`exit_without_static_destructors` is called in such a child (``os.register_at_fork``):
``on_exit(_exit)`` makes the child's ``exit(status)`` end the process with ``status`` before
the handlers registered in the parent, Kineto's destructor among them, run.  Python's own
finalisation (``atexit`` callbacks, flushing ``sys.stdout`` / ``sys.stderr``) happens before
``exit()`` and is untouched; the C library's stdio buffers are flushed by a Python ``atexit``
callback registered here.  A child that ends with ``os._exit`` (multiprocessing, DataLoader
workers) runs no handler at all and is unaffected.
"""

from __future__ import annotations

import atexit
import ctypes
import sys


def exit_without_static_destructors() -> bool:
    """In a forked child: skip the C/C++ exit handlers inherited from the parent at exit,
    keeping the exit status.  False where the C library has no ``on_exit`` (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        on_exit = libc.on_exit  # glibc; musl has none
        on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        on_exit.restype = ctypes.c_int
        fflush = libc.fflush
        fflush.argtypes = [ctypes.c_void_p]
        # the handler is called as _exit(status, arg): the status is the child's own
        if on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None) != 0:
            return False
    except (AttributeError, OSError):
        return False
    # C stdio buffers (printf from an extension) are flushed by exit() after the handlers,
    # which _exit skips: flushed by a Python atexit callback instead (LIFO: after the callbacks
    # the child registers, before those inherited from the parent)
    atexit.register(fflush, None)
    return True
