"""Exits that skip ``atexit``: ``os._exit`` and the ``os.exec*`` family.

The session writes its raw data, end_info and files at exit through ``atexit`` (and on
SIGTERM).  ``os._exit`` runs no handler and ``exec`` replaces the process image, so a job that
ends either way lost every iteration still queued on the sink thread (the last ``FLUSH_S``,
i.e. all of a short job) and left Kineto's scratch files behind.  :func:`install` wraps
``os._exit``, ``os.execv`` and ``os.execve`` (``execl``/``execle``/``execlp``/``execlpe``/
``execvp``/``execvpe`` call these two through ``os``'s globals) so that, in the profiled process
only, the session ends first; then the real call happens with the same arguments.  A forked child
(multiprocessing and DataLoader workers end through ``os._exit``) calls the real one at once.

The wrappers keep the builtin's module and name, and ``posix`` gets them too, so that pickling
``os._exit`` still refers to ``posix._exit`` as unprofiled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

#: the real functions, by name, once wrapped (install is idempotent)
_WRAPPED: dict[str, Callable[..., Any]] = {}


def install(before: Callable[[str], None], pid: int) -> bool:
    """Wrap ``os._exit``/``os.execv``/``os.execve`` so that ``before(how)`` runs first in the
    process ``pid`` (``how``: ``"os._exit(3)"``, ``"exec"``); ``before`` must not raise.
    Idempotent; False where the platform has none of them (not POSIX)."""
    if _WRAPPED or os.name != "posix":
        return bool(_WRAPPED)
    posix = sys.modules.get("posix")

    def wrap(name: str, how: Callable[..., str]) -> None:
        real = getattr(os, name, None)
        if real is None:
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if os.getpid() == pid:
                try:
                    before(how(*args, **kwargs))
                except Exception:  # the exit happens whatever jobprof's part did
                    pass
            return real(*args, **kwargs)

        wrapper.__name__ = wrapper.__qualname__ = real.__name__
        wrapper.__module__ = getattr(real, "__module__", None) or "posix"
        wrapper.__doc__ = real.__doc__
        _WRAPPED[name] = real
        setattr(os, name, wrapper)
        if posix is not None and getattr(posix, name, None) is real:
            setattr(posix, name, wrapper)

    wrap("_exit", lambda status=0, *_a, **_k: f"os._exit({status})")
    wrap("execv", lambda *_a, **_k: "exec")
    wrap("execve", lambda *_a, **_k: "exec")
    return bool(_WRAPPED)

