"""What the wheel ships: every built-in plugin folder is a listed package with an entry point, and
every built-in entry point names a module that exists in the packaged tree.

The package list in pyproject.toml is explicit (the source folders are remapped into the
``jobprof`` namespace); a plugin folder missing from it would install from a checkout but be
absent from the wheel, where its entry point then fails to import.  A folder registers one
entry point naming its package (``dp = "jobprof.plugins.dp"``; the aic_metrics groups are one
plugin too: ``aic_metrics = "jobprof.plugins.aic_metrics"``).
"""

from __future__ import annotations

import tomllib

from conftest import REPO

PLUGINS = REPO / "plugins"


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_builtin_plugin_folder_is_packaged_and_registered():
    project = _project()
    packages = set(project["tool"]["setuptools"]["packages"])
    entry_points = project["project"]["entry-points"]["jobprof"]
    folders = sorted(p.name for p in PLUGINS.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert folders, "no plugin folders found"
    registered = {value.split(":")[0].split(".")[2] for value in entry_points.values()
                  if value.startswith("jobprof.plugins.")}
    for name in folders:
        assert f"jobprof.plugins.{name}" in packages, f"plugins/{name} is not in the wheel's packages"
        assert name in registered, f"plugins/{name} has no entry point"
    # a sub-package not listed would be left out of the wheel too
    for init in PLUGINS.rglob("__init__.py"):
        package = ".".join(("jobprof", *init.parent.relative_to(REPO).parts))
        assert package in packages, f"{init.parent.relative_to(REPO)} is not in the wheel's packages"
    for name in ("jobprof", "jobprof.plugins", "jobprof.schemas"):
        assert name in packages


def test_every_builtin_entry_point_module_is_in_the_packaged_tree():
    project = _project()
    packages = set(project["tool"]["setuptools"]["packages"])
    entry_points = project["project"]["entry-points"]["jobprof"]
    assert entry_points
    for name, value in entry_points.items():
        module = value.split(":")[0]
        assert module.startswith("jobprof.plugins."), f"entry point {name}: {module} is not a built-in plugin"
        path = PLUGINS.joinpath(*module.split(".")[2:])
        if (path / "__init__.py").is_file():
            package = module  # the entry point is a package
        else:
            assert path.with_suffix(".py").is_file(), \
                f"entry point {name}: {module} has no module file ({path.relative_to(REPO)}.py)"
            package = module.rpartition(".")[0]
        assert package in packages, f"entry point {name}: {package} is not in the wheel's packages"
