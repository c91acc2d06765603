"""What every command shares: a plugin manager and its reporter."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from jobprof.analysis.selection import Selection
from jobprof.cli.progress import progress, shown
from jobprof.engine.manager import PluginManager
from jobprof.files import rawstore
from jobprof.plugin.reporter import Reporter


def new_manager() -> tuple[PluginManager, Reporter]:
    reporter = Reporter()
    return PluginManager(reporter), reporter


def progress_for() -> Callable[[Iterable[Any], Any, str], Iterable[Any]]:
    """A progress callback for :func:`jobprof.analysis.summary.summarize` (a bar on a terminal only,
    with its total: a count, or a function counting, called only when the bar is shown)."""
    def show(items: Iterable[Any], total: int | Callable[[], int] | None, desc: str) -> Iterable[Any]:
        if callable(total):
            total = total() if shown() else None
        return progress(items, total=total, desc=desc, unit="iteration")

    return show


def _ranks(text: str) -> list[int]:
    try:
        return [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rank number or R1,R2, got {text!r}") from None


def add_prof_dir(p: argparse.ArgumentParser) -> None:
    """The ``prof_dir`` argument of every command that reads one profile."""
    p.add_argument("prof_dir", type=Path, help="a PROF_* directory, or an output folder holding one")


def add_selection(p: argparse.ArgumentParser, iterations_help: str = "") -> None:
    """``--iterations`` and ``--rank``, the same for every command that reads a profile."""
    p.add_argument("--iterations", metavar="A-B",
                   help=iterations_help or "only these iterations: 5-20, 5-, -20 or 7")
    p.add_argument("--rank", type=_ranks, action="append", metavar="R",
                   help="only rank R (rank_id in info.json, else the device id); repeat or R1,R2 for several")


def add_engine(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--jobs`` and ``--scheduler``: where the ranks are reduced."""
    from jobprof.analysis.facts import DASK_SCHEDULER, ENGINES, default_jobs

    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="where ranks without a valid facts file are reduced: local (this machine's "
                        "cores) or dask (a Dask cluster; pip install 'jobprof[cluster]')")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help=f"worker processes (default: every core, {default_jobs()} here; 1 reads in "
                        "this process); with --engine dask, the local cluster's workers")
    p.add_argument("--scheduler", metavar="ADDR",
                   help=f"with --engine dask: the scheduler's address (default ${DASK_SCHEDULER}, "
                        "else a local cluster of --jobs workers)")


def selection(args: argparse.Namespace, iterations: str | None = None) -> Selection:
    """The selection the arguments ask for (ValueError names a bad ``--iterations``)."""
    ranks = None if args.rank is None else [r for group in args.rank for r in group]
    return Selection(args.iterations if iterations is None else iterations, ranks)


def printable(text: str) -> str:
    """``text`` with control characters escaped, newlines kept: names and contents of a profile
    someone else wrote (a ``record_function`` name, a file name) must not act on the terminal
    (clear it, set its title, hide lines)."""
    return "\n".join(rawstore.escaped(line) for line in text.split("\n"))
