"""``record_function`` blocks as they open and end, seen without wrapping torch's code.

    blocks, unwatch = watch(torch.autograd.profiler.record_function, listener)

A data descriptor for the instance's ``record`` (its RecordFunction handle) rather than wrappers
of ``__enter__``/``__exit__``: a block is open once ``__enter__`` stored a handle, and its end
begins when ``__exit__`` (or ``_call_end_callbacks_on_future``, which hands the end to a future)
reads it.  No jobprof frame is on the stack when torch's own code raises there (a name torch
refuses, say), so the program's tracebacks are the ones it has unprofiled; the value stays in
the instance ``__dict__`` (copy, pickle, ``vars`` see what they see unprofiled).  Installed on
the class: blocks created before the watch began are covered.  One descriptor per class, shared
by every watcher (the operator capture, msproftx), removed when the last one stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class BlockListener(Protocol):
    """Told of every block entered and ended while it watches (on the thread doing it; it
    must be quick and must not raise: what it raises is dropped)."""

    def opened(self, block: Any) -> None: ...

    def ended(self, block: Any) -> None: ...


class Blocks:
    """The ``record_function`` blocks of one class: :attr:`open` (by ``id``: every block
    entered and not yet ended, any thread) and the listeners told of each."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        self.open: dict[int, Any] = {}
        #: entries not yet ended per block (a decorator's one object entered recursively)
        self.depth: dict[int, int] = {}
        self.listeners: tuple[BlockListener, ...] = ()
        self.users = 0
        self._slot = _RecordSlot(self)
        #: False when the class has a ``record`` of its own (no torch so far): nothing is seen
        self.installed = "record" not in cls.__dict__
        if self.installed:
            cls.record = self._slot

    def reopen(self, block: Any, record: Any) -> None:
        """Give an open block a new handle (the operator capture continues it under a new
        profiler session): not a new entry, no listener is told."""
        block.__dict__["record"] = record
        self.open[id(block)] = block

    def _remove(self) -> None:
        if self.installed and self.cls.__dict__.get("record") is self._slot:
            del self.cls.record
        self.installed = False


def watch(cls: Any, listener: BlockListener | None = None) -> tuple[Blocks, Callable[[], None]]:
    """Watch the blocks of ``cls`` (``torch.autograd.profiler.record_function``); returns the
    shared :class:`Blocks` and the function that stops this watch (idempotent)."""
    slot = cls.__dict__.get("record")
    blocks = slot.blocks if isinstance(slot, _RecordSlot) else Blocks(cls)
    blocks.users += 1
    if listener is not None:
        blocks.listeners += (listener,)
    stopped = False

    def unwatch() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        if listener is not None:
            blocks.listeners = tuple(x for x in blocks.listeners if x is not listener)
        blocks.users -= 1
        if not blocks.users:
            blocks._remove()

    return blocks, unwatch


class _RecordSlot:
    """``record_function.record`` while jobprof watches (see the module's docstring)."""

    def __init__(self, blocks: Blocks) -> None:
        self.blocks = blocks

    def __get__(self, block: Any, owner: Any = None) -> Any:
        if block is None:  # as a property does: TorchScript's compiler reads every class attribute
            return self
        record = block.__dict__.get("record")
        blocks = self.blocks
        key = id(block)
        blocks.open.pop(key, None)  # the block ends (or its end moves to a future)
        depth = blocks.depth.get(key)
        if depth:
            if depth == 1:
                del blocks.depth[key]
            else:
                blocks.depth[key] = depth - 1
            for listener in blocks.listeners:
                try:
                    listener.ended(block)
                except Exception:
                    pass
        if record is None and "record" not in block.__dict__:
            raise AttributeError(f"'{type(block).__name__}' object has no attribute 'record'")
        return record

    def __set__(self, block: Any, record: Any) -> None:
        block.__dict__["record"] = record
        if record is not None:
            blocks = self.blocks
            key = id(block)
            blocks.open[key] = block
            blocks.depth[key] = blocks.depth.get(key, 0) + 1
            for listener in blocks.listeners:
                try:
                    listener.opened(block)
                except Exception:
                    pass

    def __delete__(self, block: Any) -> None:
        self.blocks.open.pop(id(block), None)
        self.blocks.depth.pop(id(block), None)
        del block.__dict__["record"]
