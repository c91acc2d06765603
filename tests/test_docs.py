"""The documentation stays a door, not a book: README.md and CONTRIBUTING.md keep their size
limits, every page of the reference site (``docs/``) is in ``mkdocs.yml``'s nav and every nav
entry exists, and the site builds with ``mkdocs build --strict`` (broken links and anchors fail).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

README_MAX_LINES = 250
CONTRIBUTING_MAX_LINES = 400
DOCS = REPO / "docs"


def _lines(name: str) -> int:
    return len((REPO / name).read_text(encoding="utf-8").splitlines())


def test_readme_is_short() -> None:
    assert _lines("README.md") <= README_MAX_LINES, "README.md is the door: move reference to docs/"


def test_contributing_is_short() -> None:
    assert _lines("CONTRIBUTING.md") <= CONTRIBUTING_MAX_LINES, \
        "CONTRIBUTING.md teaches a plugin: move reference to docs/ (e.g. docs/hooks.md)"


def _nav_pages() -> list[str]:
    """Every ``.md`` path the nav names (read as text: mkdocs.yml needs no YAML library here)."""
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^docs_dir: docs$", text, re.M) and re.search(r"^strict: true$", text, re.M)
    nav = text[text.index("\nnav:"):]
    return re.findall(r"(?:^\s*-\s*(?:[^:\n]+:\s*)?)([\w./-]+\.md)\s*$", nav, re.M)


def test_nav_and_docs_folder_agree() -> None:
    nav = _nav_pages()
    assert nav, "mkdocs.yml has no nav pages"
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"
    missing = sorted(p for p in nav if not (DOCS / p).is_file())
    assert not missing, f"nav pages that do not exist: {missing}"
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    orphans = sorted(set(on_disk) - set(nav))
    assert not orphans, f"pages under docs/ missing from mkdocs.yml's nav: {orphans}"


def test_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert not (REPO / "site").exists(), "a build wrote site/ into the repository"
