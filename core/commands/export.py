"""``jobprof export``: re-render timeline/ and summary/ files from raw data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from jobprof import export
from jobprof.commands._common import new_manager
from jobprof.profile import find_prof_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="re-render timeline/ and summary/ files from raw data (idempotent)")
    p.add_argument("prof_dir", type=Path, help="a PROF_* directory, or an output folder holding one")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prof = find_prof_dir(args.prof_dir)
    manager, _ = new_manager()
    manager.load_entry_points()
    devices = export.device_dirs(prof)
    if not devices:
        print(f"jobprof: error: {prof} has no device_<id> folders", file=sys.stderr)
        return 1
    status = 0
    for device_dir in devices:
        show = _progress(device_dir.name)
        result = export.export_device(device_dir, manager, show)
        if show is not None:
            sys.stderr.write("\r\033[K")
        finished = any(device_dir.glob("end_info.*"))
        print(f"{device_dir}: {result.iterations} iteration(s), {result.files} file(s)"
              + ("" if finished else " (no end_info: the job did not finish; rendered what was saved)"))
        for problem in result.problems:
            print(f"  problem: {problem}", file=sys.stderr)
            status = 1
    return status


def _progress(label: str) -> Any:
    """A one-line progress counter on a terminal; silent otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(done: int) -> None:
        if done % 50 == 0:
            sys.stderr.write(f"\r{label}: {done} iterations exported")
            sys.stderr.flush()

    return show
