"""``jobprof export``: re-render timeline/ and summary/ files from raw data."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobprof.analysis import cann8, facts, per_rank
from jobprof.analysis.merge import MergeError
from jobprof.analysis.profile import find_prof_dir
from jobprof.analysis.selection import ranges
from jobprof.cli._common import add_prof_dir, new_manager, printable
from jobprof.cli.progress import bar
from jobprof.files import export, fsio, handover, profdir, rawstore
from jobprof.plugin.timeline import NAME as MASTER


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="re-render timeline/ and summary/ files from raw data (idempotent)")
    add_prof_dir(p)
    p.add_argument("--layout", choices=("old", "cann8"), default="old",
                   help="old: per-iteration files under device_<id>/ (CANN 6/7); cann8: also "
                        f"{cann8.FOLDER}/<name>_<timestamp>.csv|json with every device and iteration "
                        "(CANN 8+, what msprof-analyze and MindStudio Insight read)")
    p.add_argument("--per-rank", metavar="DIR", type=Path,
                   help="also write one PROF_ folder per rank into DIR (a new folder), each with its "
                        f"{cann8.FOLDER}/ and analyze/ (communication.json, communication_matrix.json): "
                        "what msprof-analyze cluster and compare read (docs/msprof-tools.md)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the job's background exporters, then render only the iterations "
                        "still without files (a stopped exporter's, or export \"off\")")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prof = find_prof_dir(args.prof_dir)
    manager, _ = new_manager()
    manager.load_entry_points()
    devices = profdir.device_dirs(prof)
    if not devices:
        print(printable(f"jobprof: error: {prof} has no device_<id> folders"), file=sys.stderr)
        return 1
    status = 0
    unusable = exported = 0
    #: device folders that hold nothing jobprof wrote (no metadata, no raw data): one line for all
    empty: list[int] = []
    rendered_any = False
    #: by device, the parts of the iterations rendered here: the facts file reads no window again
    known: dict[int, dict[int, facts.Kept]] = {}
    for device_dir in devices:
        _wait_for_exporter(device_dir)
        only = _missing(device_dir) if args.wait else None
        if only is not None and not only:
            continue  # everything is rendered
        rendered_any = True
        total = len(only) if only is not None else _stored_iterations(device_dir)
        with bar(total=total, desc=device_dir.name, unit="iteration") as shown:
            kept = facts.PartsKept(manager)
            result = export.export_device(device_dir, manager, lambda _done: shown.update(1), only=only,
                                          on_streams=kept)
        known[profdir.device_id(device_dir)] = kept.parts
        if not result.problems:
            handover.done(device_dir)  # a stopped exporter's hand-over: its work is done now
        if not result.iterations and _holds_nothing(device_dir):
            empty.append(profdir.device_id(device_dir))
            unusable += 1
            continue
        finished = any(device_dir.glob("end_info.*"))
        print(f"{device_dir}: {result.iterations} iteration(s), {result.files} file(s)"
              + ("" if finished else " (no end_info: the job did not finish; rendered what was saved)"))
        exported += result.iterations
        for note, iterations in result.notes.items():
            print(printable(f"  note: {note}: iteration(s) {', '.join(ranges(iterations))}"))
        for problem in result.problems:
            print(printable(f"  problem: {problem}"), file=sys.stderr)
        # a device whose metadata cannot be read (named above) costs only itself, unless all do;
        # any other problem (a writer failed, a folder refused) fails the command
        unreadable = bool(result.problems) and all("unreadable metadata" in p for p in result.problems)
        if result.problems and not unreadable:
            status = 1
        unusable += unreadable
    if empty:
        print(printable(f"  problem: {len(empty)} device folder(s) of {prof} hold nothing jobprof wrote "
                        f"(no start_info, info.json or raw data): devices {', '.join(ranges(empty))}"),
              file=sys.stderr)
    if unusable and not exported:
        status = 1
    # every rank reduced once, here, so that summary and report read no raw data again
    # (quiet when it works: a device whose facts file cannot be written is named as a problem)
    if args.wait and not rendered_any:
        print(f"{prof}: every iteration with raw data is rendered")
    else:
        with rawstore.reporting(lambda text: print(f"  problem: {text}", file=sys.stderr)):
            facts.write(prof, manager, known=known)
    if args.layout == "cann8":
        try:
            with bar(total=cann8.input_files(prof), desc=cann8.FOLDER, unit="file") as shown:
                assembled = cann8.assemble(prof, advance=shown.update)
        except MergeError as exc:  # an unreadable timeline: named, the per-device files stay
            print(printable(f"jobprof: error: {cann8.FOLDER} not written: {exc}"), file=sys.stderr)
            return 1
        print(printable("\n".join(cann8.describe(assembled))))
        for note in assembled.problems:
            print(printable(f"  note: {note}"), file=sys.stderr)
    if args.per_rank is not None:
        if args.per_rank.exists() or args.per_rank.is_symlink():
            print(printable(f"jobprof: error: --per-rank {args.per_rank} exists: name a new folder"),
                  file=sys.stderr)
            return 1
        try:
            split = per_rank.split(prof, args.per_rank)
        except (OSError, ValueError, MergeError) as exc:
            print(printable(f"jobprof: error: --per-rank {args.per_rank} not written: {exc}"),
                  file=sys.stderr)
            return 1
        print(printable(f"{args.per_rank}: {len(split.folders)} PROF_ folder(s), one per rank; "
                        f"{split.collectives} collective call(s) in analyze/"))
        if split.unpaired:
            print(printable(f"  note: {split.unpaired} collective call(s) lack a peer's record (a rank not "
                            "profiled, or iterations not captured on every rank): their wait is 0"),
                  file=sys.stderr)
    return status


def _wait_for_exporter(device_dir: Path) -> None:
    """A job's background exporter still at work on this folder: waited for (two writers of
    one file would race), saying so."""
    handed = handover.running(device_dir)
    if handed is not None:
        print(printable(f"{device_dir}: waiting for the job's background exporter (pid {handed.pid}, "
                        f"{handed.count} iteration(s) handed over)"), file=sys.stderr, flush=True)
        handover.wait(device_dir)


def _missing(device_dir: Path) -> set[int]:
    """Iterations with raw data and no master timeline (the last file rendered for one)."""
    try:
        stored = rawstore.indices(device_dir)
    except OSError:
        return set()
    return stored - {f.iteration for f in profdir.iteration_files(device_dir, "timeline", MASTER)}


def _holds_nothing(device_dir: Path) -> bool:
    """No metadata and no raw segment: an empty folder (or one of someone else's files)."""
    try:
        names = {p.name for p in device_dir.iterdir()}
    except OSError:
        return False
    return not any(n.startswith(("start_info.", "info.json.", "end_info.")) for n in names) \
        and not rawstore.segments(device_dir)


def _stored_iterations(device_dir: Path) -> int | None:
    """About how many iterations the raw segments hold (their complete lines), for the bar's
    total; counted in blocks without parsing, so it costs a read of the data, not a decode."""
    lines = 0
    try:
        for segment in rawstore.segments(device_dir):
            with fsio.open_read(segment) as handle:
                while block := handle.read(1 << 20):
                    lines += block.count(b"\n")
    except OSError:
        return None
    return lines
