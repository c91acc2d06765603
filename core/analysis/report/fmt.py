"""Numbers as the report shows them, each cell tagged with where it comes from in the model.

Every number the page shows carries ``data-key`` (its dotted path in ``summary --json``) and
``data-value`` (the raw value as JSON), so a reader's tools and the tests can check the page
against the model.  ``jobprof summary`` prints through :func:`text` too, so the page and the
terminal show the same digits: 3 decimals for ms, 1 for percentages, ``N/A`` for a value
nobody measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from typing import Any

#: how a value is shown: milliseconds, a 0..1 share as a percentage, or as the model holds it
MS, PCT, RAW = "ms", "pct", "raw"


def key(*parts: object) -> str:
    """The dotted path of a value in the model: ``key("ranks", 0, "share")`` -> ``ranks.0.share``."""
    return ".".join(str(p) for p in parts)


def text(value: Any, kind: str = RAW) -> str:
    """``value`` as the terminal prints it (plain text, not escaped)."""
    if value is None:
        return "N/A"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if kind == MS:
        return f"{value:.3f}"
    if kind == PCT:
        return f"{100 * value:.1f}%"
    if isinstance(value, int):
        return str(value)
    # plugins round their own cells; keep what they chose unless it is long noise
    short = repr(value)
    return short if len(short) <= 12 else f"{value:.6g}"


def num(value: Any, path: str, kind: str = RAW, tag: str = "td", cls: str = "num") -> str:
    """An element showing one number of the model, tagged with its path and raw value."""
    shown = escape(text(value, kind))
    return (f'<{tag} class="{cls}" data-key="{escape(path)}" data-kind="{kind}" '
            f"data-value='{escape(json.dumps(value), quote=True)}'>{shown}</{tag}>")


def cell(value: Any, path: str, kind: str = RAW) -> str:
    """A table cell: a tagged number, or escaped text."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return num(value, path, kind)
    if isinstance(value, list | tuple):
        value = ", ".join(map(str, value))
    return f"<td>{escape(str(value))}</td>"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """An HTML table from escaped headers and already-rendered cells (``<td>...</td>``)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
