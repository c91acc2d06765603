"""Zero-code-change capture: ``record_function`` and ``torch.cuda.nvtx`` ranges into the recorder.

Both installers wrap the originals (which keep running: the torch profiler and Nsight still
see everything) and return a function that puts them back.  A wrapper never raises on its
own account: the recorder swallows its errors, and the original's exception propagates as
before.  Spans are taken tight: the start after the original's enter, the end before its exit.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from jobprof.plugins.msproftx.recorder import Recorder

RECORD_FUNCTION_DOMAIN = "record_function"
NVTX_DOMAIN = "nvtx"
NVTX_CALLS = ("range_push", "range_pop", "range_start", "range_end", "mark")
#: per record_function object: [(thread, range id), ...] of its open enters
_OPEN = "_jobprof_mstx_open"

_thread = threading.get_ident  # pairs enters and exits only: no need for the native id (a syscall)
Restore = Callable[[], None]


def install_record_function(recorder: Recorder, cls: Any) -> Restore:
    """Record every ``with record_function(name)`` (and its decorator form) as a range.

    A decorated function reuses one object for every call, possibly recursively or on several
    threads at once, so the object keeps a small list of (thread, start) and ``__exit__`` ends
    the newest enter of its own thread (an ``__exit__`` on another thread, as an interleaving
    coroutine may do, ends the newest of any thread and is attributed to the exiting thread).
    """
    original_enter, original_exit = cls.__dict__["__enter__"], cls.__dict__["__exit__"]
    now, span = recorder.clock, recorder.span
    # every open enter, by id of its (thread, start) entry: the exit warning names the blocks
    # never exited (the entry itself is kept, so its id cannot be reused while listed)
    still = recorder.open_blocks

    @functools.wraps(original_enter)  # __wrapped__: TorchScript compiles the original's source
    def __enter__(self: Any) -> Any:
        result = original_enter(self)
        # the lean path (several per step on the training thread): a stamp on the object now,
        # one tuple into the recorder at exit; the record is built off the training thread
        try:
            entry = (_thread(), now())
            opened = self.__dict__.get(_OPEN)
            if opened is None:
                self.__dict__[_OPEN] = [entry]
            else:
                opened.append(entry)
            still[id(entry)] = (entry, self.name)
        except Exception:
            pass  # e.g. a subclass with __slots__: not recorded
        return result

    @functools.wraps(original_exit)
    def __exit__(self: Any, *exc: Any) -> Any:
        try:
            opened = self.__dict__.get(_OPEN)
            if opened:
                end = now()
                here = _thread()
                if opened[-1][0] == here or len(opened) == 1:  # the usual case: one enter
                    entry = opened.pop()
                else:  # recursion or interleaving on several threads: this thread's newest
                    mine = [i for i, entry in enumerate(opened) if entry[0] == here]
                    entry = opened.pop(mine[-1] if mine else -1)
                still.pop(id(entry), None)
                span(RECORD_FUNCTION_DOMAIN, self.name, entry[1], end)
        except Exception:
            pass
        return original_exit(self, *exc)

    cls.__enter__, cls.__exit__ = __enter__, __exit__

    def restore() -> None:
        # someone may have wrapped ours since: leave theirs (ours is harmless once closed)
        if cls.__dict__.get("__enter__") is __enter__:
            cls.__enter__ = original_enter
        if cls.__dict__.get("__exit__") is __exit__:
            cls.__exit__ = original_exit

    return restore


def install_nvtx(recorder: Recorder, module: Any) -> Restore:
    """Record ``torch.cuda.nvtx`` calls under domain ``nvtx`` (``nvtx.range`` uses push/pop).

    Calls made through names imported before the session started (``from torch.cuda.nvtx
    import range_push``) bypass the wrappers.  NVTX's own handles are mapped to ours.
    """
    originals = {name: getattr(module, name) for name in NVTX_CALLS}
    handles: dict[Any, int] = {}

    def range_push(msg: Any, *args: Any, **kwargs: Any) -> Any:
        result = originals["range_push"](msg, *args, **kwargs)
        recorder.push(NVTX_DOMAIN, msg)
        return result

    def range_pop(*args: Any, **kwargs: Any) -> Any:
        recorder.pop(NVTX_DOMAIN)
        return originals["range_pop"](*args, **kwargs)

    def range_start(msg: Any, *args: Any, **kwargs: Any) -> Any:
        handle = originals["range_start"](msg, *args, **kwargs)
        range_id = recorder.range_start(NVTX_DOMAIN, msg)
        if range_id:
            try:
                handles[handle] = range_id
            except TypeError:
                recorder.range_end(range_id)
        return handle

    def range_end(range_id: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            ours = handles.pop(range_id, 0)
        except TypeError:
            ours = 0
        recorder.range_end(ours)
        return originals["range_end"](range_id, *args, **kwargs)

    def mark(msg: Any, *args: Any, **kwargs: Any) -> Any:
        result = originals["mark"](msg, *args, **kwargs)
        recorder.mark(NVTX_DOMAIN, msg)
        return result

    wrappers = {"range_push": range_push, "range_pop": range_pop, "range_start": range_start,
                "range_end": range_end, "mark": mark}
    for name, wrapper in wrappers.items():
        functools.update_wrapper(wrapper, originals[name])
        setattr(module, name, wrapper)

    def restore() -> None:
        for name, wrapper in wrappers.items():
            if getattr(module, name, None) is wrapper:
                setattr(module, name, originals[name])

    return restore


def install(recorder: Recorder, torch: Any, restores: list[Restore], cuda: bool | None = None,
            nvtx_module: Any = None) -> None:
    """Install every capture the options allow, appending each undo function to ``restores``
    as soon as it exists; ``cuda``/``nvtx_module`` override detection (tests without CUDA)."""
    if recorder.allows(RECORD_FUNCTION_DOMAIN):
        restores.append(install_record_function(recorder, torch.autograd.profiler.record_function))
    if recorder.allows(NVTX_DOMAIN):
        if cuda is None:
            try:
                cuda = bool(torch.cuda.is_available())
            except Exception:
                cuda = False
        if cuda:
            module = nvtx_module if nvtx_module is not None else torch.cuda.nvtx
            restores.append(install_nvtx(recorder, module))
