"""``jobprof import``: torch.profiler traces of any job (GPU, NCCL, ROCm) into a jobprof profile.

Most users of PyTorch already have torch.profiler traces (``tensorboard_trace_handler`` writes one
per rank, Lightning's and Hugging Face's profilers the same); importing them gives every jobprof
command (summary, report, diff, merge, kineto, the CANN 8 and per-rank exports) without running
the job again.  The stages are in :mod:`jobprof.imports`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobprof.analysis.facts import default_jobs
from jobprof.analysis.selection import ranges
from jobprof.cli._common import printable
from jobprof.imports import job


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="turn torch.profiler (Kineto) traces into a jobprof profile",
                       description="Import torch.profiler trace files (Kineto's Chrome-trace JSON, plain, "
                                   ".gz or .xz; one rank per file, several files of one rank joined) into "
                                   "a new PROF_ folder that every other command reads.")
    p.add_argument("traces", type=Path, nargs="+", metavar="TRACE_OR_FOLDER",
                   help="trace files, or folders holding them (*.json, *.json.gz, *.json.xz)")
    p.add_argument("-o", "--output", type=Path, default=Path("prof"),
                   help="the folder the new PROF_* folder goes into (default: ./prof)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help=f"worker processes, a rank each (default: every core, {default_jobs()} here)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    jobs = args.jobs if args.jobs is not None else default_jobs()
    if jobs < 1:
        print("jobprof import: error: --jobs must be 1 or more", file=sys.stderr)
        return 2
    done = job.run(args.traces, args.output, jobs, say=lambda text: print(text, file=sys.stderr, flush=True))
    for r in done.ranks:
        for b in r.built:
            rate = r.events / r.seconds if r.seconds > 0 else 0
            tasks = f"{b.kernels:,} device task(s)" if b.kernels else \
                "no device work (its top-level operators are the tasks, as a CPU-only job's)"
            print(printable(
                f"rank {r.rank}: {b.path}: iteration(s) {', '.join(ranges(b.iterations))} "
                f"({b.method}), {tasks}, {b.collectives:,} collective(s); "
                f"{b.events:,} events, read at {rate:,.0f}/s"))
    for note in done.notes:
        print(printable(f"  note: {note}"), file=sys.stderr)
    for problem in done.problems:
        print(printable(f"jobprof import: error: {problem}"), file=sys.stderr)
    for problem in done.render_problems:
        print(printable(f"  problem: {problem}"), file=sys.stderr)
    if done.prof_dir is None:
        print("jobprof import: nothing imported", file=sys.stderr)
        return 1
    events = sum(r.events for r in done.ranks)
    rate = events / max(done.seconds, 1e-9)
    print(printable(f"{done.prof_dir}: {len([r for r in done.ranks if r.built])} rank(s), {events:,} events "
                    f"imported in {done.seconds:.1f} s ({rate:,.0f} events/s, every file written)"))
    return 1 if done.problems or done.render_problems else 0
