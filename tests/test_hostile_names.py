"""Names the profiled job chooses (``record_function`` ranges) reach terminals and spreadsheets
through jobprof's files and commands: they must arrive as text, never as commands (issue 29)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli

#: formula starts a spreadsheet evaluates, terminal control sequences (clear the screen, set
#: the title, ring the bell, CSI in its 8-bit form), a bidi override, and a negative number
NAMES = ["=1+1", "@SUM(1+1)", "+cmd|' /C calc'!A0", "-2+3+cmd", "\t=1+1", '=HYPERLINK("http://x","y")',
         "\x1b[2J\x1b]0;pwned\x07clear", "\x9b31mred", "\u202eevil", "-2.5"]
CONTROL = ("\x1b", "\x07", "\x9b", "\u202e")

JOB = f"""
import torch
names = {json.dumps(NAMES)}
model = torch.nn.Linear(4, 4)
for step in range(3):
    for name in names:
        with torch.profiler.record_function(name):
            model(torch.randn(2, 4)).sum().backward()
"""


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("hostile"))
    runner.run(JOB, {"training_trace": "on", "task_trace": "on", "msproftx": "on"})
    return runner.out


def _cells(folder: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*.csv")):
        with path.open(newline="", encoding="utf-8") as f:
            found[str(path.relative_to(folder))] = [cell for row in csv.reader(f) for cell in row]
    return found


def _formula_cells(cells: list[str]) -> list[str]:
    def number(cell: str) -> bool:
        try:
            float(cell)
        except ValueError:
            return False
        return True
    return [c for c in cells if c and c[0] in "=+-@\t\r" and not number(c)]


def test_no_csv_cell_is_a_formula_and_the_names_are_kept(profile: Path) -> None:
    files = _cells(profile)
    tx = [cell for name, cells in files.items() if "/msprof_tx_" in name for cell in cells]
    assert tx, sorted(files)
    for name, cells in files.items():
        assert not _formula_cells(cells), (name, _formula_cells(cells)[:5])
    # each name is there, as a spreadsheet shows it (the ' is hidden) or as itself
    for name in NAMES:
        assert (name if name == "-2.5" or name[:1] not in "=+-@\t" else "'" + name) in tx, name


def test_the_cann8_layout_has_no_formula_cell(profile: Path) -> None:
    proc = jobprof_cli("export", str(profile), "--layout", "cann8")
    assert proc.returncode == 0, proc.stderr
    files = _cells(next(profile.glob("PROF_*")) / "mindstudio_profiler_output")
    assert any("msprof_tx" in name for name in files), sorted(files)
    for name, cells in files.items():
        assert not _formula_cells(cells), (name, _formula_cells(cells)[:5])


def test_summary_shows_control_characters_escaped(profile: Path) -> None:
    proc = jobprof_cli("summary", str(profile))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert not [c for c in CONTROL if c in out + proc.stderr], [c for c in CONTROL if c in out]
    assert "\\x1b[2J\\x1b]0;pwned\\x07clear" in out and "\\u202eevil" in out, out


def test_report_shows_control_characters_escaped(profile: Path, tmp_path: Path) -> None:
    """Before (issue 29 item 10): raw ESC/BEL bytes inside a report cell (HTML-escaped, but a
    terminal that shows the file acts on them)."""
    out = tmp_path / "r.html"
    proc = jobprof_cli("report", str(profile), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text(encoding="utf-8")
    assert not [c for c in CONTROL if c in page], [c for c in CONTROL if c in page]
    assert "\\x1b[2J\\x1b]0;pwned\\x07clear" in page and "\\u202eevil" in page
