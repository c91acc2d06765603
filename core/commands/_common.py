"""What every command shares: a plugin manager and its reporter."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from jobprof.manager import PluginManager
from jobprof.progress import progress
from jobprof.reporter import Reporter


def new_manager() -> tuple[PluginManager, Reporter]:
    reporter = Reporter()
    return PluginManager(reporter), reporter


def progress_for() -> Callable[[Iterable[Any], int | None, str], Iterable[Any]]:
    """A progress callback for :func:`jobprof.summary.summarize` (a bar on a terminal only)."""
    return lambda items, total, desc: progress(items, total=total, desc=desc, unit="iteration")
