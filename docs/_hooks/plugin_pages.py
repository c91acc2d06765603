"""mkdocs hook: a nav section given as a glob (``- Data types (plugins): plugins/*.md``) becomes
one entry per matching page, so a new ``docs/plugins/<name>.md`` needs no nav edit.

Each entry's title is the page's first heading; the order is the ``jobprof`` entry points' order
in pyproject.toml (a page ``plugins/<name>.md`` documents the plugin registered as ``<name>``),
then pages of no entry point by name.  Loaded by ``hooks:`` in mkdocs.yml, excluded from the
site by ``exclude_docs``; tests/test_docs.py expands the nav with :func:`expand`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

GLOB_CHARS = re.compile(r"[*?\[]")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?(?:[ \t]*\{[^}]*\})?[ \t]*$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")


def entry_point_names(pyproject: Path) -> list[str]:
    """The ``jobprof`` entry points' names, in pyproject.toml's order ([] without a pyproject or
    on Python 3.10, which has no tomllib: the pages then go by name)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        return []
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    except (OSError, KeyError, ValueError):
        return []
    return list(project.get("entry-points", {}).get("jobprof", {}))


def first_heading(page: Path) -> str | None:
    """The text of the page's first Markdown heading outside code blocks, or None."""
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            return match.group(1).strip()
    return None


def pages(docs_dir: Path, pattern: str, order: list[str]) -> list[Any]:
    """The nav entries of the pages matching ``pattern`` (relative to ``docs_dir``)."""
    rank = {name: i for i, name in enumerate(order)}
    found = sorted((p for p in docs_dir.glob(pattern) if p.is_file() and p.suffix == ".md"),
                   key=lambda p: (rank.get(p.stem, len(rank)), p.as_posix()))
    entries: list[Any] = []
    for page in found:
        path = page.relative_to(docs_dir).as_posix()
        title = first_heading(page)
        entries.append({title: path} if title else path)
    return entries


def expand(nav: list[Any], docs_dir: Path, order: list[str]) -> list[Any]:
    """``nav`` with every ``{title: "<glob>"}`` section replaced by ``{title: [its pages]}``."""
    out: list[Any] = []
    for item in nav:
        if isinstance(item, dict):
            item = {title: expand(value, docs_dir, order) if isinstance(value, list)
                    else pages(docs_dir, value, order) if isinstance(value, str) and GLOB_CHARS.search(value)
                    else value
                    for title, value in item.items()}
        out.append(item)
    return out


def on_config(config: Any) -> Any:
    if config.nav:
        docs_dir = Path(config.docs_dir)
        order = entry_point_names(Path(config.config_file_path).parent / "pyproject.toml")
        config.nav = expand(config.nav, docs_dir, order)
    return config
