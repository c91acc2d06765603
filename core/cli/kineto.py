"""``jobprof kineto``: gather each iteration's Kineto-format traces of every rank into one folder.

Holistic Trace Analysis reads a folder holding one trace per rank (``TraceAnalysis(trace_dir=
...)``, the rank taken from each file's ``distributedInfo``); jobprof writes each rank's file in
its own ``device_<id>/timeline/`` (``kineto_trace`` option).  This command copies them to
``<out>/iteration_<n>/rank_<r>.pt.trace.json`` (plain copies: the folder can be moved or
archived).  Several PROF_ directories may be given (a multi-node job has one per node).
"""

from __future__ import annotations

import argparse
import re
import shutil
import stat
import sys
from pathlib import Path

from jobprof.analysis.profile import find_prof_dir
from jobprof.analysis.selection import Selection
from jobprof.cli._common import add_selection, printable, selection
from jobprof.files import fsio, profdir
from jobprof.files.profdir import iteration_files
from jobprof.plugin.values import STEP_MODE_MODEL_ID

#: the kineto plugin's writer (WriterSpec "kineto", json): timeline/kineto_<dev>_<model>_<iter>.json
WRITER = "kineto"
#: the rank as HTA reads it: the first lowercase "rank" key (distributedInfo's, near the top)
RANK_RE = re.compile(r'"rank":\s*(\d+)')
HEAD_BYTES = 1 << 16


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kineto", help="gather the ranks' Kineto-format traces per iteration (for HTA)")
    p.add_argument("prof_dirs", type=Path, nargs="+", help="PROF_* directories (one per node), or output "
                   "folders holding one")
    p.add_argument("-o", "--output", type=Path, help="where the iteration_<n>/ folders go "
                   "(default: ./kineto, in the current folder: only `jobprof export` writes into a profile)")
    add_selection(p)
    # the old spelling, kept working: --iterations is every command's
    p.add_argument("--iteration", type=int, action="append", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def rank_of(path: Path) -> int | None:
    """The file's distributedInfo rank, or None (a job that was not distributed)."""
    with fsio.open_read(path, "r", encoding="utf-8", errors="replace") as handle:
        found = RANK_RE.search(handle.read(HEAD_BYTES))
    return int(found.group(1)) if found else None


def gather(prof_dirs: list[Path], output: Path, iterations: set[int] | None = None,
           selected: Selection | None = None) -> dict[str, dict[int, Path]]:
    """Copy every rank's file of each iteration to ``output/<folder>/rank_<r>.pt.trace.json``
    (only the iterations and ranks ``selected``); returns {folder: {rank: source}}.  Raises
    ValueError naming both files when two have one rank."""
    found: dict[str, dict[int, Path]] = {}
    for prof in prof_dirs:
        for device_dir in profdir.device_dirs(prof):
            for file in iteration_files(device_dir, "timeline", WRITER):
                path, model, index = file.path, file.model, file.iteration
                if (iterations and index not in iterations) or \
                        (selected is not None and not selected.has_iteration(index)):
                    continue
                folder = f"iteration_{index}" if model == STEP_MODE_MODEL_ID \
                    else f"model_{model}_iteration_{index}"
                rank = rank_of(path)
                rank = 0 if rank is None else rank
                if selected is not None and not selected.has_rank(rank):
                    continue
                ranks = found.setdefault(folder, {})
                if rank in ranks:
                    raise ValueError(f"{ranks[rank]} and {path} both hold rank {rank}")
                ranks[rank] = path
    if found:
        _check_folder(output)
        fsio.make_dirs(output)
    for folder, ranks in found.items():
        target = output / folder
        # through no symlink at or below the output folder, each copy atomic (fsio)
        fsio.make_dirs(target, root=output)
        for rank, path in ranks.items():
            with fsio.open_read(path) as src, fsio.StreamedFile(target / f"rank_{rank}.pt.trace.json",
                                                            binary=True, root=output) as out:
                shutil.copyfileobj(src, out.handle)
                out.finish()
    return found


def _check_folder(output: Path) -> None:
    """The output folder is absent or a real folder (a link, file, FIFO... is refused)."""
    try:
        mode = output.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        raise fsio.UnsafePath(output, fsio.describe(mode))


def run(args: argparse.Namespace) -> int:
    try:
        profs = [find_prof_dir(p) for p in args.prof_dirs]
    except (OSError, ValueError) as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 1
    output = args.output or Path("kineto")
    try:
        found = gather(profs, output, set(args.iteration) if args.iteration else None, selection(args))
    except (OSError, ValueError) as exc:
        print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
        return 1
    if not found:
        print(f"jobprof: error: no kineto_*.json files under {', '.join(map(str, profs))} "
              "(profile with PROFILING_OPTIONS '{\"kineto_trace\": \"on\"}', or run `jobprof export` "
              "with it recorded)", file=sys.stderr)
        return 1
    for folder, ranks in sorted(found.items(), key=lambda kv: (len(kv[0]), kv[0])):
        print(f"{output / folder}: ranks {', '.join(map(str, sorted(ranks)))}")
    print(f"open with: TraceAnalysis(trace_dir=\"{output}/iteration_<n>\")")
    return 0
