"""Ship ``jobprof-autoload.pth`` into site-packages, for wheels and for editable installs.

setuptools has no declarative way to put a file at the top of site-packages, so two build
commands add it: ``build_py`` for wheels (and sdist installs), ``editable_wheel`` for
``pip install -e .``.  Everything else lives in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
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


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
