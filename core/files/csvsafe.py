"""CSV cells a spreadsheet would run as a formula, written as text.

A profile's CSVs hold names the profiled job chose (``record_function`` and NVTX ranges, module
and operator names); opened in Excel or LibreOffice, a cell that begins with ``=``, ``+``,
``-``, ``@``, a TAB or a CR is read as a formula (``=HYPERLINK(...)``, ``+cmd|' /C calc'!A0``).
Every CSV jobprof writes goes through :func:`neutralised`: such a cell, unless it is a number
(``-2.5``), gets a leading ``'``, the usual rule (OWASP "CSV injection"), which spreadsheets
show as text and hide.  A file with no such cell is returned as it is, unparsed.
"""

from __future__ import annotations

import csv
import io
import re

#: the first characters that make a spreadsheet evaluate a cell
FORMULA_START = frozenset("=+-@\t\r")
#: a cell (quoted or not) that may begin with one of them: a cheap test of a whole file
_MAYBE = re.compile(r'(?:^|,)"?[=+\-@\t\r]', re.MULTILINE)


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def safe_cell(cell: str) -> str:
    """``cell`` as a spreadsheet shows it as text: ``'=1+1`` for ``=1+1``; numbers unchanged."""
    return "'" + cell if cell[:1] in FORMULA_START and not _number(cell) else cell


def safe_row(cells: list[str]) -> list[str] | None:
    """The row with its formula cells neutralised, or None when it has none."""
    if not any(c[:1] in FORMULA_START for c in cells):
        return None
    out = [safe_cell(c) for c in cells]
    return out if out != cells else None


def neutralised(text: str) -> str:
    """A CSV file's text with every formula cell neutralised (rows written back with the csv
    module, ``\\n`` line ends); the text itself when no cell needs it."""
    if not _MAYBE.search(text):
        return text
    rows = list(csv.reader(io.StringIO(text, newline="")))
    changed = False
    for i, cells in enumerate(rows):
        safe = safe_row(cells)
        if safe is not None:
            rows[i] = safe
            changed = True
    if not changed:
        return text
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()
