"""Progress bars for long CLI work (export, merge, summary): shown on a terminal, silent otherwise.

A thin layer over tqdm so every command draws the same bar and the choice of library lives in
one place.  tqdm's ``disable=None`` turns the bar off when stderr is not a TTY, so pipes, CI
logs and tests see nothing extra.  Never used by the profiled process (collectors never print).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(iterable: Iterable[T], total: int | None = None, desc: str = "", unit: str = "it",
             leave: bool = False) -> Iterator[T]:
    """``iterable`` wrapped in a progress bar on stderr when stderr is a terminal.

    ``total`` defaults to ``len(iterable)`` where it has one; without a total the bar shows a
    count and a rate.  The bar is erased when done unless ``leave``."""
    return iter(bar(total=total, desc=desc, unit=unit, leave=leave, iterable=iterable))


def bar(total: int | None = None, desc: str = "", unit: str = "it", leave: bool = False,
        iterable: Iterable[Any] | None = None) -> tqdm:
    """A bar to advance by hand (``with bar(...) as b: b.update(1)``), for work that reports
    through a callback instead of an iterable; disabled (a no-op) off a terminal."""
    sized = _columns() > 0
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr, disable=None,
                dynamic_ncols=sized, ncols=None if sized else 80, nrows=None if sized else 24)


def shown() -> bool:
    """Whether a bar is drawn (stderr is a terminal): work done only for the bar (counting a
    total) is skipped otherwise."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _columns() -> int:
    """The terminal's width; 0 for a terminal that reports no size (a bare pseudo-terminal),
    where tqdm would draw nothing at all."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0
