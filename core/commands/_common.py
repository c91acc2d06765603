"""What every command shares: a plugin manager and its reporter."""

from __future__ import annotations

from jobprof.manager import PluginManager
from jobprof.reporter import Reporter


def new_manager() -> tuple[PluginManager, Reporter]:
    reporter = Reporter()
    return PluginManager(reporter), reporter
