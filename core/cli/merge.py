"""``jobprof merge``: one Chrome-trace timeline of every rank, on one time axis."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from jobprof.analysis.merge import ALIGNS, FORMATS, JSON_EVENTS_MAX, MergeError, merge
from jobprof.analysis.profile import find_prof_dir
from jobprof.cli._common import add_prof_dir, add_selection, printable, selection
from jobprof.cli.progress import progress
from jobprof.files import fsio


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge", help="merge every rank's master timelines into one Chrome-trace file (one process "
                      "group per rank, one time axis)")
    add_prof_dir(p)
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="the merged file (default: merged.json, or merged.pftrace for the native format, in "
                        "the current folder: only `jobprof export` writes into a profile); a .gz name "
                        "is gzip-compressed; - for standard output")
    p.add_argument("--format", choices=FORMATS, default="auto",
                   help="json: Chrome-trace JSON; perfetto: a native Perfetto trace (protobuf, needs "
                        "jobprof[perfetto]); auto (default): what the output name says, else JSON up to "
                        f"{JSON_EVENTS_MAX:,} events and the native format above")
    p.add_argument("--align", choices=ALIGNS, default="clock",
                   help="clock: each process's clock anchor (right for ranks on one host); collectives: "
                        "per-rank offsets estimated from collectives every rank ran (ranks on several "
                        "hosts; needs hccl on)")
    add_selection(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prof = find_prof_dir(args.prof_dir)
    try:
        chosen = selection(args)
    except ValueError as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 2
    try:  # before the work: a link, FIFO, device or folder at -o is refused, never replaced
        if args.output is not None:
            fsio.check_output(args.output, parents=True)  # merge makes a missing folder
    except fsio.CannotWrite as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 2
    iterations, ranks = chosen.iterations, sorted(chosen.ranks) if chosen.ranks is not None else None
    try:
        result = merge(prof, args.output, how=args.align, ranks=ranks, iterations=iterations,
                       progress=lambda todo, n: progress(todo, total=n, desc="merge", unit="file"),
                       fmt=args.format, folder=Path.cwd())
    except (MergeError, fsio.CannotWrite) as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 2 if isinstance(exc, fsio.UnsafePath) else 1
    for note in result.notes:
        print(printable(f"jobprof: {note}"), file=sys.stderr)
    per_rank = _per_rank(result.ranks)
    kind = "native Perfetto trace" if result.format == "perfetto" else "Chrome-trace JSON"
    print(f"{result.path}: {kind} ({result.format_reason}); {result.files} file(s), aligned by "
          f"{result.alignment.clock}; {per_rank}",
          file=sys.stderr if str(result.path) == fsio.STDOUT else sys.stdout)
    return 0



#: above this many ranks the closing line gives totals and extremes instead of every rank
RANKS_LISTED = 16


def _per_rank(ranks: dict[str, dict[str, Any]]) -> str:
    """What each rank contributed: every rank for a few, else the total, the extremes and the
    largest clock offset (a 1,000-rank line would not be read)."""
    if len(ranks) <= RANKS_LISTED:
        return ", ".join(f"rank {rank}: {info['events']} events (offset {info['offset_us']:+.1f} us)"
                         for rank, info in ranks.items())
    events = {rank: int(info["events"]) for rank, info in ranks.items()}
    fewest = min(events, key=lambda r: (events[r], int(r)))
    most = max(events, key=lambda r: (events[r], -int(r)))
    offset = max(ranks, key=lambda r: (abs(ranks[r]["offset_us"]), -int(r)))
    return (f"{len(ranks)} ranks, {sum(events.values()):,} events (fewest: rank {fewest}, "
            f"{events[fewest]:,}; most: rank {most}, {events[most]:,}); largest offset: rank {offset}, "
            f"{ranks[offset]['offset_us']:+.1f} us")
