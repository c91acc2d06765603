"""What the wheel ships: every built-in plugin folder is a listed package with an entry point.

The package list in pyproject.toml is explicit (the source folders are remapped into the
``jobprof`` namespace); a plugin folder missing from it would install from a checkout but be
absent from the wheel, where its entry point then fails to import.
"""

from __future__ import annotations

import tomllib

from conftest import REPO


def test_every_builtin_plugin_is_packaged_and_registered():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = set(project["tool"]["setuptools"]["packages"])
    entry_points = project["project"]["entry-points"]["jobprof"]
    folders = sorted(p.name for p in (REPO / "plugins").iterdir()
                     if p.is_dir() and (p / "__init__.py").is_file())
    assert folders, "no plugin folders found"
    for name in folders:
        assert f"jobprof.plugins.{name}" in packages, f"plugins/{name} is not in the wheel's packages"
        assert entry_points.get(name) == f"jobprof.plugins.{name}", f"plugins/{name} has no entry point"
    for name in ("jobprof", "jobprof.plugins", "jobprof.schemas"):
        assert name in packages
