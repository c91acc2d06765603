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

from jobprof.analysis.report import render, trace
from jobprof.cli._common import add_engine, add_prof_dir, add_selection, printable
from jobprof.cli.summary import load, usable
from jobprof.files import fsio


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="the summary as one self-contained HTML page with charts")
    add_prof_dir(p)
    p.add_argument("-o", "--output", type=Path, default=Path("report.html"),
                   help="the HTML file to write (default: report.html in the current directory; "
                        "- for standard output)")
    add_selection(p)
    add_engine(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.output
    try:  # checked before reading the profile, which can take a while
        fsio.check_output(out)
    except fsio.CannotWrite as exc:
        hint = "; give the HTML file's path with -o" if out.is_dir() and not out.is_symlink() else ""
        print(printable(f"jobprof: error: {exc}{hint}"), file=sys.stderr)
        return 2
    try:
        profile, model = load(args)
    except ValueError as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 2
    view = trace.one_iteration(profile, model)
    try:
        with fsio.StreamedFile(out, output=True) as page:
            page.handle.write(render(model, view=view))
            page.finish()
    except fsio.CannotWrite as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 2
    if str(out) != fsio.STDOUT:
        print(printable(str(out.resolve())))
    if not usable(model):
        print(f"jobprof: no rank had data in {model['prof_dir']}: the report shows only what is missing",
              file=sys.stderr)
        return 1
    return 0
