"""The documentation stays a door, not a book: README.md and CONTRIBUTING.md keep their size
limits, every page of the reference site (``docs/``) is in ``mkdocs.yml``'s nav and every nav
entry exists, and the site builds with ``mkdocs build --strict`` (broken links and anchors fail).

The plugin pages are one nav entry, a glob (``plugins/*.md``) that the hook
``docs/_hooks/plugin_pages.py`` expands at build time: a new plugin's page needs no nav line.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from conftest import REPO

README_MAX_LINES = 250
CONTRIBUTING_MAX_LINES = 400
DOCS = REPO / "docs"
HOOK = DOCS / "_hooks" / "plugin_pages.py"


def _lines(name: str) -> int:
    return len((REPO / name).read_text(encoding="utf-8").splitlines())


def test_readme_is_short() -> None:
    assert _lines("README.md") <= README_MAX_LINES, "README.md is the door: move reference to docs/"


def test_contributing_is_short() -> None:
    assert _lines("CONTRIBUTING.md") <= CONTRIBUTING_MAX_LINES, \
        "CONTRIBUTING.md teaches a plugin: move reference to docs/ (e.g. docs/hooks.md)"


@functools.cache
def _hook():  # the mkdocs hook module, loaded as mkdocs loads it (from its file)
    spec = importlib.util.spec_from_file_location("plugin_pages", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages() -> list[str]:
    """Every ``.md`` path the nav names, a glob entry expanded to its pages as the hook does
    (read as text: mkdocs.yml needs no YAML library here)."""
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^docs_dir: docs$", text, re.M) and re.search(r"^strict: true$", text, re.M)
    assert re.search(r"^hooks:\n  - docs/_hooks/plugin_pages\.py$", text, re.M), "the nav hook is not loaded"
    nav = text[text.index("\nnav:"):]
    pages: list[str] = []
    hook = _hook()
    for entry in re.findall(r"(?:^\s*-\s*(?:[^:\n]+:\s*)?)([\w./*?-]+\.md)\s*$", nav, re.M):
        if hook.GLOB_CHARS.search(entry):
            expanded = [path for item in hook.pages(DOCS, entry, []) for path in
                        (item.values() if isinstance(item, dict) else [item])]
            assert expanded, f"the nav entry {entry} matches no page"
            pages += expanded
        else:
            pages.append(entry)
    return pages


def test_nav_and_docs_folder_agree() -> None:
    nav = _nav_pages()
    assert nav, "mkdocs.yml has no nav pages"
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"
    missing = sorted(p for p in nav if not (DOCS / p).is_file())
    assert not missing, f"nav pages that do not exist: {missing}"
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    orphans = sorted(set(on_disk) - set(nav))
    assert not orphans, f"pages under docs/ missing from mkdocs.yml's nav: {orphans}"


def _entry_points() -> list[str]:
    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["jobprof"])


def _plugin_pages() -> list[tuple[str, str]]:
    """``(path, title)`` of the plugin section as the hook builds it."""
    pages = _hook().pages(DOCS, "plugins/*.md", _entry_points())
    untitled = [item for item in pages if not isinstance(item, dict)]
    assert not untitled, f"plugin pages without a heading: {untitled}"
    return [(path, title) for item in pages for title, path in item.items()]


def test_plugin_pages_are_titled_and_ordered_by_the_entry_points() -> None:
    entry_points = _entry_points()
    found = _plugin_pages()
    assert sorted(path for path, _ in found) == sorted(
        p.relative_to(DOCS).as_posix() for p in (DOCS / "plugins").glob("*.md"))
    for path, title in found:  # a page's title is its first heading
        heading = next(line for line in (DOCS / path).read_text(encoding="utf-8").splitlines()
                       if line.startswith("#"))
        assert heading.lstrip("#").strip() == title, path
    names = [Path(path).stem for path, _ in found]
    documented = [name for name in entry_points if name in names]  # entry-point order first
    assert names == documented + sorted(set(names) - set(documented))


def test_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert not (tmp_path / "site" / "_hooks").exists(), "the nav hook was published as a page"
    # the hook ran: the built nav (before the page's content) lists the plugin pages in its order
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    linked = re.findall(r'href="(plugins/[\w-]+)/"', html[:html.index("<article")])
    assert list(dict.fromkeys(linked)) == [path.removesuffix(".md") for path, _ in _plugin_pages()]
    assert not (REPO / "site").exists(), "a build wrote site/ into the repository"
