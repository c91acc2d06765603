"""``jobprof report PROF_DIR [-o report.html]``: the summary as one self-contained HTML page.

The page holds what ``jobprof summary`` shows (same model, same ``--iterations``/``--rank``
selection) plus charts; it needs no network to view.  Written by default to ``report.html``
in the current directory, not inside the profile: a PROF_ directory holds the msprof file set
only, and may be read-only or shared.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobprof.commands._common import add_prof_dir, add_selection
from jobprof.commands.summary import load
from jobprof.fsio import atomic_write
from jobprof.report import render


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="the summary as one self-contained HTML page with charts")
    add_prof_dir(p)
    p.add_argument("-o", "--output", type=Path, default=Path("report.html"),
                   help="the HTML file to write (default: report.html in the current directory)")
    add_selection(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.output
    if out.is_dir():  # checked before reading the profile, which can take a while
        print(f"jobprof: error: {out} is a directory; give the HTML file's path with -o", file=sys.stderr)
        return 2
    if not out.parent.is_dir():
        print(f"jobprof: error: {out.parent} does not exist (the folder for -o {out})", file=sys.stderr)
        return 2
    try:
        _, model = load(args)
    except ValueError as exc:
        print(f"jobprof: error: {exc}", file=sys.stderr)
        return 2
    atomic_write(out, render(model))
    print(out.resolve())
    if not model["ranks"]:
        print("jobprof: no rank had data: the report shows only what is missing", file=sys.stderr)
        return 1
    return 0
