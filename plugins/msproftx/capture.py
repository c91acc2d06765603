"""Zero-code-change capture: ``record_function`` and ``torch.cuda.nvtx`` ranges into the recorder.

``record_function`` blocks are seen through the core's watch of the class (no wrapper); the
NVTX calls are wrapped (the originals keep running: Nsight still sees everything).  Each
installer returns a function that undoes it.  A wrapper never raises on its own account (the
recorder swallows its errors) and the original's exception propagates as before, without a
frame of ours in its traceback.  Spans are taken tight: the start after the original's enter,
the end before its exit.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from jobprof.plugin import hide_frame, watch_blocks
from jobprof.plugins.msproftx.recorder import Recorder

RECORD_FUNCTION_DOMAIN = "record_function"
NVTX_DOMAIN = "nvtx"
NVTX_CALLS = ("range_push", "range_pop", "range_start", "range_end", "mark")

_thread = threading.get_ident  # pairs enters and exits only: no need for the native id (a syscall)
Restore = Callable[[], None]


class _RangeListener:
    """Records every ``with record_function(name)`` (and its decorator form) as a range, told of
    each block by the core's watch of ``record_function`` (:mod:`jobprof.plugin.blocks`): no
    wrapper of torch's ``__enter__``/``__exit__``, so no frame of ours in the program's
    tracebacks, and nothing added to the block object.

    A decorated function reuses one object for every call, possibly recursively or on several
    threads at once, so each object has a small list of (thread, start) and its end closes the
    newest entry of its own thread (an end on another thread, as an interleaving coroutine may
    do, closes the newest of any thread and is attributed to the ending thread)."""

    def __init__(self, recorder: Recorder) -> None:
        self._now, self._span = recorder.clock, recorder.span
        # every open entry, by id of its (thread, start) tuple: the exit warning names the
        # blocks never ended (the tuple itself is kept, so its id cannot be reused while listed)
        self._still = recorder.open_blocks
        #: id(block) -> its open entries
        self._open: dict[int, list[tuple[int, int]]] = {}

    def opened(self, block: Any) -> None:
        # the lean path (several per step on the training thread): one tuple now, the record
        # built off the training thread
        entry = (_thread(), self._now())
        opened = self._open.get(id(block))
        if opened is None:
            self._open[id(block)] = [entry]
        else:
            opened.append(entry)
        self._still[id(entry)] = (entry, block.name)

    def ended(self, block: Any) -> None:
        end = self._now()
        opened = self._open.get(id(block))
        if not opened:
            return
        here = _thread()
        if opened[-1][0] == here or len(opened) == 1:  # the usual case: one entry
            entry = opened.pop()
        else:  # recursion or interleaving on several threads: this thread's newest
            mine = [i for i, entry in enumerate(opened) if entry[0] == here]
            entry = opened.pop(mine[-1] if mine else -1)
        if not opened:
            del self._open[id(block)]
        self._still.pop(id(entry), None)
        self._span(RECORD_FUNCTION_DOMAIN, block.name, entry[1], end)


def install_record_function(recorder: Recorder, cls: Any) -> Restore | None:
    """Record every ``record_function`` block of ``cls`` as a range; None (nothing recorded)
    when ``cls`` has a ``record`` attribute of its own, which no supported torch has."""
    blocks, unwatch = watch_blocks(cls, _RangeListener(recorder))
    if not blocks.installed:
        unwatch()
        return None
    return unwatch


def install_nvtx(recorder: Recorder, module: Any) -> Restore:
    """Record ``torch.cuda.nvtx`` calls under domain ``nvtx`` (``nvtx.range`` uses push/pop).

    Calls made through names imported before the session started (``from torch.cuda.nvtx
    import range_push``) bypass the wrappers.  NVTX's own handles are mapped to ours.
    """
    originals = {name: getattr(module, name) for name in NVTX_CALLS}
    handles: dict[Any, int] = {}

    def range_push(msg: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = originals["range_push"](msg, *args, **kwargs)
        except BaseException as exc:
            hide_frame(exc)
            raise
        recorder.push(NVTX_DOMAIN, msg)
        return result

    def range_pop(*args: Any, **kwargs: Any) -> Any:
        recorder.pop(NVTX_DOMAIN)
        try:
            return originals["range_pop"](*args, **kwargs)
        except BaseException as exc:
            hide_frame(exc)
            raise

    def range_start(msg: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            handle = originals["range_start"](msg, *args, **kwargs)
        except BaseException as exc:
            hide_frame(exc)
            raise
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
        try:
            return originals["range_end"](range_id, *args, **kwargs)
        except BaseException as exc:
            hide_frame(exc)
            raise

    def mark(msg: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = originals["mark"](msg, *args, **kwargs)
        except BaseException as exc:
            hide_frame(exc)
            raise
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
        restore = install_record_function(recorder, torch.autograd.profiler.record_function)
        if restore is not None:
            restores.append(restore)
    if recorder.allows(NVTX_DOMAIN):
        if cuda is None:
            try:
                cuda = bool(torch.cuda.is_available())
            except Exception:
                cuda = False
        if cuda:
            module = nvtx_module if nvtx_module is not None else torch.cuda.nvtx
            restores.append(install_nvtx(recorder, module))
