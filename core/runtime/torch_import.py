"""Run a callback once a module (torch) has been imported, now or whenever it happens.

A meta-path finder that finds the real spec with the other finders and wraps its loader, so
the callback runs right after the module finishes executing; the finder then removes itself.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` after ``name`` is imported (immediately if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    sys.meta_path.insert(0, _Watcher(name, callback))


class _Watcher(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self)
                return spec
        return None

    def fire(self, module: ModuleType) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            self.callback(module)
        except Exception as exc:  # never break the program's own `import torch`
            sys.stderr.write(f"jobprof: error: profiling disabled after importing {self.name}: {exc!r}\n")


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader; runs the watcher's callback after exec_module."""

    def __init__(self, inner: Any, watcher: _Watcher) -> None:
        self._inner, self._watcher = inner, watcher

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:  # leave no trace of the wrapper behind (a module may refuse new attributes)
            module.__loader__ = self._inner
            if module.__spec__ is not None:
                module.__spec__.loader = self._inner
        except Exception:
            pass
        self._watcher.fire(module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)
