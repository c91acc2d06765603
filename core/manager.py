"""Finds plugins through entry points, loads them, and calls hooks with failure isolation.

Built-in plugins come in through the same ``jobprof`` entry-point group as third-party ones.
A plugin that fails to import, implements a hook that does not exist (``check_pending``), or
raises inside a hook is disabled and reported by name; nothing it does can stop the job.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import attrs
import pluggy

from jobprof import hookspec
from jobprof.reporter import REPORTER, Reporter
from jobprof.types import PluginRecord

GROUP = "jobprof"
DISABLE_ENV = "JOBPROF_DISABLE_PLUGINS"


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


def disabled_names(environ: os._Environ | dict = os.environ) -> set[str]:
    return {n.strip() for n in environ.get(DISABLE_ENV, "").split(",") if n.strip()}


class PluginManager:
    """The pluggy manager plus what jobprof knows about each plugin's health."""

    def __init__(self, reporter: Reporter = REPORTER) -> None:
        self.pm = pluggy.PluginManager(hookspec.PROJECT)
        self.pm.add_hookspecs(hookspec)
        self.reporter = reporter
        self._records: dict[str, PluginRecord] = {}
        self.inactive: set[str] = set()

    # -- loading ---------------------------------------------------------------------------
    def load_entry_points(self, environ: os._Environ | dict = os.environ) -> None:
        """Load every ``jobprof`` entry point not listed in JOBPROF_DISABLE_PLUGINS."""
        blocked = disabled_names(environ)
        for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
            dist, version = _dist_of(ep)
            record = PluginRecord(ep.name, dist, version, "active")
            if ep.name in self._records:
                self._records[f"{ep.name} ({dist})"] = attrs.evolve(
                    record, status="failed", error=f"name '{ep.name}' is already taken"
                )
                continue
            if ep.name in blocked:
                self._records[ep.name] = attrs.evolve(record, status="disabled", error=DISABLE_ENV)
                continue
            self._records[ep.name] = record
            try:
                self.register(ep.load(), ep.name)
            except Exception as exc:
                self.fail(ep.name, f"cannot load '{ep.value}': {_short_error(exc)}")

    def register(self, plugin: object, name: str) -> None:
        """Register one plugin object; a hook with no matching spec fails it (check_pending)."""
        self._records.setdefault(name, PluginRecord(name, "(local)", "", "active"))
        self.pm.register(plugin, name=name)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError:
            self.pm.unregister(name=name)
            known = {n for n in dir(hookspec) if n.startswith("jobprof_")}
            unknown = [n for n in dir(plugin) if n.startswith("jobprof_") and n not in known]
            raise ValueError(f"implements unknown hook(s): {', '.join(unknown)}") from None

    def fail(self, name: str, error: str) -> None:
        """Disable a plugin for the rest of the process and say so once."""
        if self.pm.has_plugin(name):
            self.pm.unregister(name=name)
        record = self._records.get(name)
        if record is not None:
            self._records[name] = attrs.evolve(record, status="failed", error=error)
        self.reporter.warning(f"plugin '{name}' disabled: {error}")

    # -- calling ---------------------------------------------------------------------------
    def _impls(self, hook_name: str, only_active: bool) -> Iterator[tuple[str, Callable, list]]:
        caller = getattr(self.pm.hook, hook_name)
        for impl in reversed(caller.get_hookimpls()):  # pluggy's own calling order
            if only_active and impl.plugin_name in self.inactive:
                continue
            yield impl.plugin_name, impl.function, impl.argnames

    def call(self, hook_name: str, only_active: bool = False, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call one hook on every plugin, isolating failures.  Returns (plugin, result) pairs."""
        results = []
        for name, function, argnames in list(self._impls(hook_name, only_active)):
            try:
                result = function(**{arg: kwargs[arg] for arg in argnames})
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                self.fail(name, f"{hook_name} raised {_short_error(exc)} "
                                f"({os.path.basename(where.filename)}:{where.lineno})")
                continue
            if result is not None:
                results.append((name, result))
        return results

    # -- introspection ---------------------------------------------------------------------
    def records(self) -> list[PluginRecord]:
        return list(self._records.values())

    def record(self, name: str) -> PluginRecord | None:
        return self._records.get(name)

    def update(self, name: str, **changes: Any) -> None:
        self._records[name] = attrs.evolve(self._records[name], **changes)

    def active(self) -> list[str]:
        return [n for n, r in self._records.items() if r.status == "active" and n not in self.inactive]


def _dist_of(ep: EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "(unknown)", ""
    return dist.metadata["Name"] or "(unknown)", dist.version or ""
