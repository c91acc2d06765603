"""Build real, test-local plugin distributions that importlib.metadata discovers.

Each call writes ``<root>/<module>.py`` (or a package) and ``<root>/<dist>-<ver>.dist-info/``
with METADATA and entry_points.txt; put ``root`` on PYTHONPATH of a child process and the
plugin is found through the ``jobprof`` entry-point group exactly like a pip-installed one.
"""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_dist(root: Path, dist: str, modules: dict[str, str], entry_points: dict[str, str],
              version: str = "1.0") -> Path:
    """Create a distribution under ``root``; returns ``root`` (the PYTHONPATH entry).

    ``modules`` maps module name -> source; ``entry_points`` maps plugin name -> "module[:attr]".
    """
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[jobprof]\n{lines}\n")
    return root
