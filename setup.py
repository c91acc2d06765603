"""What pyproject.toml cannot say declaratively: the package list under the folder mapping, and
``jobprof-autoload.pth`` in site-packages.

* Packages: the import names are mapped from folders (``[tool.setuptools] package-dir``:
  ``jobprof`` = ``core/``, ``jobprof.plugins`` = ``plugins/``, ``jobprof.schemas`` =
  ``schemas/``).  ``[tool.setuptools.packages.find]`` finds folder names (it would list
  ``core.cli``, not ``jobprof.cli``) and cannot prefix them, so the list was kept by hand, and a
  new plugin folder missing from it installed from a checkout but was absent from the wheel.
  :class:`MappedPackages` lists every package (a folder with ``__init__.py``) under each mapped
  folder, prefixed with its import name, from the mapping pyproject.toml gives: a new
  ``plugins/<name>/`` needs no packaging edit, only its entry point.  (Left without a list,
  setuptools' own automatic discovery would walk the mapping too, but as namespace packages:
  any folder, ``__init__.py`` or not, and that "explicit layout" branch is undocumented.)
* ``jobprof-autoload.pth``: setuptools has no declarative way to put a file at the top of
  site-packages, so two build commands add it: ``build_py`` for wheels (and sdist installs),
  ``editable_wheel`` for ``pip install -e .``.

Everything else lives in pyproject.toml.
"""

from pathlib import Path

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "jobprof-autoload.pth"
# Executed by site.py at every interpreter start.  It costs one environ lookup; the tiny
# autoload module is imported only when PROFILING_MODE is "true", "dynamic" or a look-alike
# (the module starts profiling for exactly "true" / "dynamic" and prints a hint for "True",
# "1", ...).  Keep the set in sync with jobprof._autoload.IMPORTED_FOR (a test checks it).
PTH_LINE = (
    "import os; (os.environ.get('PROFILING_MODE') or '').strip().lower() in "
    "('true', '1', 'yes', 'on', 'y', 't', 'enable', 'enabled', 'dynamic') "
    "and __import__('jobprof._autoload')._autoload.run()\n"
)


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        Path(self.build_lib, PTH_NAME).write_text(PTH_LINE)


class EditableWheelWithPth(editable_wheel):
    # The unpacked editable wheel's root becomes site-packages; setuptools fills it here.
    def _install_namespaces(self, installation_dir, pth_prefix):  # type: ignore[override]
        super()._install_namespaces(installation_dir, pth_prefix)
        Path(installation_dir, PTH_NAME).write_text(PTH_LINE)


def mapped_packages(package_dir: dict[str, str], root: Path) -> list[str]:
    """Every package under each folder of ``package_dir`` (``{import name: folder}``), by its
    import name: ``{"jobprof.plugins": "plugins"}`` gives ``jobprof.plugins``,
    ``jobprof.plugins.dp``, ...  A folder without ``__init__.py`` is not a package (and not
    shipped), as with ``find_packages``."""
    found: set[str] = set()
    for name, folder in package_dir.items():
        prefix = f"{name}." if name else ""
        if name:
            found.add(name)
        found.update(prefix + sub for sub in find_packages(str(root / folder)))
    return sorted(found)


class MappedPackages(Distribution):
    """A distribution whose ``packages`` default to :func:`mapped_packages` of the package-dir
    mapping, once pyproject.toml is applied (a ``packages`` list there would still win)."""

    def parse_config_files(self, *args, **kwargs) -> None:
        super().parse_config_files(*args, **kwargs)
        if self.packages is None and self.package_dir:
            self.packages = mapped_packages(self.package_dir, Path(__file__).resolve().parent)


setup(distclass=MappedPackages,
      cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
