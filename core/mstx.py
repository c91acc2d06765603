"""``jobprof.mstx``: user markers in the style of Ascend's mstx API.

    from jobprof import mstx

    mstx.mark("checkpoint saved")
    rid = mstx.range_start("eval")          # 0 means "not recorded", as mstx's failure id
    ...
    mstx.range_end(rid)                     # may be called from another thread

    with mstx.range("forward"):             # also a decorator: @mstx.range("load")
        ...
    mstx.push("phase"); ...; mstx.pop()     # same-thread nesting

    io = mstx.domain("io")                  # the same calls in a named domain
    io.mark("shard opened")

Module-level calls use the domain ``default``.  ``stream`` arguments are accepted, as in mstx,
so ported code runs, and ignored: jobprof's markers are host-only (no device stream).

Every call is a cheap no-op unless a profiling session with ``"msproftx": "on"`` is collecting
in this process: the API looks the recorder up on the session at each call
(``SESSION.attached("msproftx")``), so a session that starts after these calls were first made
(or after a decorator was applied) is picked up, and nothing is cached in this module.  Calls
never raise into the program: a bad message goes through ``str()``, an unknown range id is
ignored.

The recorder itself belongs to the msproftx plugin; this module only knows its five methods
(``mark``, ``range_start``, ``range_end``, ``push``, ``pop``, each taking the domain name first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobprof.runtime import _state

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["DEFAULT_DOMAIN", "Domain", "domain", "mark", "pop", "push", "range", "range_end",
           "range_start"]

#: the name under which the msproftx plugin attaches its recorder to the session
RECORDER = "msproftx"
DEFAULT_DOMAIN = "default"


# Each call repeats the two-line lookup instead of calling a helper: a Python call costs about
# as much as the whole no-op path, and the no-op path is what every unprofiled run pays.
def _start(domain: str, message: Any) -> int:
    session = _state.SESSION
    if session is not None:
        recorder = session.attached(RECORDER)
        if recorder is not None:
            return recorder.range_start(domain, message)
    return 0


def mark(message: Any, stream: Any = None) -> None:
    """Record an instant (a zero-duration marker) in the ``default`` domain."""
    session = _state.SESSION
    if session is not None:
        recorder = session.attached(RECORDER)
        if recorder is not None:
            recorder.mark(DEFAULT_DOMAIN, message)


def range_start(message: Any, stream: Any = None) -> int:
    """Open a range; returns its id for :func:`range_end`, or 0 when nothing is recorded."""
    session = _state.SESSION
    if session is not None:
        recorder = session.attached(RECORDER)
        if recorder is not None:
            return recorder.range_start(DEFAULT_DOMAIN, message)
    return 0


def range_end(range_id: int) -> None:
    """Close the range ``range_id`` (from any thread; 0 and unknown ids are ignored)."""
    session = _state.SESSION
    if session is not None and range_id:
        recorder = session.attached(RECORDER)
        if recorder is not None:
            recorder.range_end(range_id)


_end = range_end  # ids carry no domain: every domain ends its ranges the same way


def push(message: Any) -> None:
    """Open a nested range on this thread; closed by the next :func:`pop` on the same thread."""
    session = _state.SESSION
    if session is not None:
        recorder = session.attached(RECORDER)
        if recorder is not None:
            recorder.push(DEFAULT_DOMAIN, message)


def pop() -> None:
    """Close this thread's innermost :func:`push` range (nothing open: ignored)."""
    session = _state.SESSION
    if session is not None:
        recorder = session.attached(RECORDER)
        if recorder is not None:
            recorder.pop(DEFAULT_DOMAIN)


class range:  # mstx's name (lower case); shadows the builtin only inside this module
    """A range as a context manager (``with mstx.range("x"):``) or a decorator.

    As a decorator every call of the function is its own range (async functions: the await,
    not just the call).  One ``range`` object can be entered again after it was exited, and
    re-entered while open on the same thread (nested); for concurrent use from several threads
    prefer the decorator, which keeps no state on the object.
    """

    __slots__ = ("_domain", "_ids", "_message")

    def __init__(self, message: Any, stream: Any = None) -> None:
        self._message = message
        self._domain = DEFAULT_DOMAIN
        self._ids: list[int] | None = None

    def __enter__(self) -> range:
        session = _state.SESSION  # inlined: `with` is the costliest no-op of the API
        if session is not None:
            recorder = session.attached(RECORDER)
            if recorder is not None:
                range_id = recorder.range_start(self._domain, self._message)
                if range_id:
                    if self._ids is None:
                        self._ids = [range_id]
                    else:
                        self._ids.append(range_id)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._ids:
            _end(self._ids.pop())

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        import functools
        import inspect

        domain, message = self._domain, self._message
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                range_id = _start(domain, message)
                try:
                    return await func(*args, **kwargs)
                finally:
                    if range_id:
                        _end(range_id)
            return timed_async

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            range_id = _start(domain, message)
            try:
                return func(*args, **kwargs)
            finally:
                if range_id:
                    _end(range_id)
        return timed


class Domain:
    """A named group of markers (mstx's ``domain_create``); filtered with the options
    ``mstx_domain_include`` / ``mstx_domain_exclude``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Domain({self.name!r})"

    def mark(self, message: Any, stream: Any = None) -> None:
        session = _state.SESSION
        if session is not None:
            recorder = session.attached(RECORDER)
            if recorder is not None:
                recorder.mark(self.name, message)

    def range_start(self, message: Any, stream: Any = None) -> int:
        return _start(self.name, message)

    def range_end(self, range_id: int) -> None:
        _end(range_id)

    def range(self, message: Any, stream: Any = None) -> range:
        block = range(message)
        block._domain = self.name
        return block

    def push(self, message: Any) -> None:
        session = _state.SESSION
        if session is not None:
            recorder = session.attached(RECORDER)
            if recorder is not None:
                recorder.push(self.name, message)

    def pop(self) -> None:
        session = _state.SESSION
        if session is not None:
            recorder = session.attached(RECORDER)
            if recorder is not None:
                recorder.pop(self.name)


def domain(name: Any) -> Domain:
    """The domain ``name`` (``str()`` of it; empty means ``default``)."""
    try:
        text = name if type(name) is str else str(name)
    except Exception:
        text = ""
    return Domain(text or DEFAULT_DOMAIN)
