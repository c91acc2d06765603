"""``jobprof export``: re-render timeline/ and summary/ files from raw data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobprof import cann8, export, rawstore
from jobprof.commands._common import add_prof_dir, new_manager
from jobprof.profile import find_prof_dir
from jobprof.progress import bar


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="re-render timeline/ and summary/ files from raw data (idempotent)")
    add_prof_dir(p)
    p.add_argument("--layout", choices=("old", "cann8"), default="old",
                   help="old: per-iteration files under device_<id>/ (CANN 6/7); cann8: also "
                        f"{cann8.FOLDER}/<name>_<timestamp>.csv|json with every device and iteration "
                        "(CANN 8+, what msprof-analyze and MindStudio Insight read)")
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
        with bar(total=_stored_iterations(device_dir), desc=device_dir.name, unit="iteration") as shown:
            result = export.export_device(device_dir, manager, lambda _done: shown.update(1))
        finished = any(device_dir.glob("end_info.*"))
        print(f"{device_dir}: {result.iterations} iteration(s), {result.files} file(s)"
              + ("" if finished else " (no end_info: the job did not finish; rendered what was saved)"))
        for problem in result.problems:
            print(f"  problem: {problem}", file=sys.stderr)
            status = 1
    if args.layout == "cann8":
        with bar(total=cann8.input_files(prof), desc=cann8.FOLDER, unit="file") as shown:
            assembled = cann8.assemble(prof, advance=shown.update)
        print("\n".join(cann8.describe(assembled)))
        for note in assembled.problems:
            print(f"  note: {note}", file=sys.stderr)
    return status


def _stored_iterations(device_dir: Path) -> int | None:
    """About how many iterations the raw segments hold (their complete lines), for the bar's
    total; counted in blocks without parsing, so it costs a read of the data, not a decode."""
    lines = 0
    try:
        for segment in rawstore.segments(device_dir):
            with open(segment, "rb") as handle:
                while block := handle.read(1 << 20):
                    lines += block.count(b"\n")
    except OSError:
        return None
    return lines
