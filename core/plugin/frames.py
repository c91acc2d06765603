"""No jobprof frame in the program's tracebacks.

A wrapper jobprof puts around the program's calls (``Module.__call__``, ``backward``, a
DataLoader's ``__next__``, a collective) is a Python frame the program's exceptions pass
through, and Python records every frame an exception leaves in its traceback: the program would
print ``File ".../jobprof/...", in __call__`` in every error it shows (an uncaught one,
``traceback.print_exc()``, ``logging.exception``).  A wrapper drops its own entry as the
exception passes::

    try:
        return original(*args, **kwargs)
    except BaseException as exc:
        hide_frame(exc)
        raise  # a bare raise adds no entry for this frame again

and the traceback reads as it does unprofiled.
"""

from __future__ import annotations

import sys


def hide_frame(exc: BaseException) -> None:
    """Drop the calling frame's entry from the head of ``exc.__traceback__``.  The wrapper's
    ``try`` holds only the call it wraps: the exception came from there (from C code, the
    entry was the only one: the traceback then ends at the program's call, as unprofiled)."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame is sys._getframe(1):
        exc.__traceback__ = tb.tb_next
