"""The module paths of jobprof before the restructure into stages, kept for plugins written
against them (``from jobprof.hookspec import hookimpl``, ``from jobprof.types import WriterSpec``).

A finder at the END of ``sys.meta_path`` answers only for names no other finder found, so it
costs nothing for any other import.  ``import jobprof.types`` then gives the very module
``jobprof.plugin`` (one module object: ``isinstance`` and the manager's checks hold) and a
``DeprecationWarning`` naming the new path.  Installed when plugins are loaded
(:meth:`jobprof.engine.manager.PluginManager.load_entry_points`), never at interpreter start.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old module name -> where it lives now
MOVED = {f"jobprof.{old}": f"jobprof.{new}" for old, new in {
    **{m: f"plugin.{m}" for m in ("hookspec", "reporter", "clock", "lanes", "timeline", "opmath")},
    # the value, record and result types: one flat module, then split by concern; all of them
    # are names of the plugin API package
    "types": "plugin", "plugin.types": "plugin",
    # the engine (plugin manager, options) left the API package: plugins never import it
    **{m: f"engine.{m}" for m in ("manager", "options")},
    **{f"plugin.{m}": f"engine.{m}" for m in ("manager", "options", "configure", "schemacheck", "moved")},
    **{m: f"files.{m}" for m in ("fsio", "rawstore", "profdir", "export", "pftrace")},
    **{m: f"ops.{m}" for m in ("opcapture", "perfcounters", "calibrate")},
    "optree": "plugin.opview",
    # moved again when the plugin API became one package: from a stage into the contract
    "ops.optree": "plugin.opview", "ops.opmath": "plugin.opmath", "files.lanes": "plugin.lanes",
    "files.timeline": "plugin.timeline",
    **{m: f"runtime.{m}" for m in ("bootstrap", "session", "sink", "steps", "torch_import", "storage")},
    # the socket channel from helper processes joined the contract: plugins import it from there
    "channel": "plugin.channel", "runtime.channel": "plugin.channel",
    **{m: f"analysis.{m}" for m in ("profile", "selection", "summary", "breakdown", "findings", "diff",
                                    "merge", "stats", "cann8")},
    "progress": "cli.progress",
}.items()}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning,
                      stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the real module ran already, under its own name


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
