"""Trace files -> one PROF_ folder: files found, grouped into ranks, built, rendered, renamed.

Ranks: ``distributedInfo.rank`` where the trace has it, else the order of the files (said).
Several files of one rank (a profiler schedule's repeats, ``tensorboard_trace_handler`` writes
one per cycle) are joined in time order; an iteration number two of them hold is taken from the
first.  Each rank is built (passes 1 and 2) and rendered (the ordinary export, then the facts
file) in a worker process of its own, ``jobs`` at a time.  Everything is written into a staging
folder beside the result and renamed into place at the end, so a failed or interrupted import
leaves no half-written profile; a file that cannot be imported is named and costs only itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from jobprof.analysis import workers
from jobprof.files import fsio, kinetotrace, profdir, rawstore
from jobprof.imports import build, scan, source

#: the names taken from a folder (a file named on the command line is read whatever its name)
SUFFIXES = (".json", ".json.gz", ".json.xz")
#: folders below an input folder walked at most this deep (a trace folder's own layout)
MAX_DEPTH = 8


@attrs.frozen
class RankResult:
    rank: int
    built: tuple[build.Built, ...] = ()
    facts: build.RankFacts | None = None
    problems: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def events(self) -> int:
        return sum(b.events for b in self.built)


@attrs.frozen
class Imported:
    """What ``jobprof import`` did."""

    prof_dir: Path | None
    ranks: tuple[RankResult, ...]
    #: files that could not be imported, each with why (one line each)
    problems: tuple[str, ...]
    #: what the reader should know (ranks from the file order, categories it did not know ...)
    notes: tuple[str, ...]
    render_problems: tuple[str, ...]
    seconds: float


def collect(inputs: Iterable[Path]) -> tuple[list[Path], list[str]]:
    """Trace files named or held (at any depth up to :data:`MAX_DEPTH`) by ``inputs``, each
    once, in name order per folder; what was refused (links, FIFOs), each named."""
    files: list[Path] = []
    problems: list[str] = []
    seen: set[tuple[int, int]] = set()

    def add(path: Path, st: os.stat_result) -> None:
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            files.append(path)

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"{folder}: cannot list ({exc.strerror or exc})")
            return
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith("."):
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if depth < MAX_DEPTH:
                    walk(path, depth + 1)
            elif entry.name.endswith(SUFFIXES):
                if stat.S_ISREG(st.st_mode):
                    add(path, st)
                else:
                    why = "is a symbolic link: give the file it points to" if stat.S_ISLNK(st.st_mode) \
                        else f"is {fsio.describe(st.st_mode)}, not a trace file"
                    problems.append(str(source.TraceError(path, why)))

    for path in inputs:
        try:
            st = os.lstat(path)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        if stat.S_ISDIR(st.st_mode):
            before = len(files)
            walk(path, 0)
            if len(files) == before:
                problems.append(f"{path}: no trace files in it (*.json, *.json.gz, *.json.xz)")
        else:
            try:
                add(path, source.check_path(path))
            except source.TraceError as exc:
                problems.append(str(exc))
    return files, problems


def worker_of(path: Path) -> str:
    """The process a file without a rank came from: ``tensorboard_trace_handler`` names its files
    ``<worker>.<time ns>.pt.trace.json[.gz]`` (worker: ``<host>_<pid>`` unless given), one per
    profiler cycle; any other file is a process of its own."""
    match = _HANDLER_NAME.match(path.name)
    return f"{path.parent}/{match[1]}" if match else str(path)


_HANDLER_NAME = re.compile(r"^(.+)\.\d+\.pt\.trace\.json(?:\.gz)?$")


def assign_ranks(headers: Sequence[source.Header]) -> tuple[dict[int, list[source.Header]], list[str]]:
    """Rank -> its files in time order; notes on ranks taken from the file order.  Files without
    a rank are one rank per process (:func:`worker_of`), in the order of their first file."""
    ranks: dict[int, list[source.Header]] = {}
    unranked: dict[str, list[source.Header]] = {}
    for h in headers:
        if h.rank is not None:
            ranks.setdefault(h.rank, []).append(h)
        else:
            unranked.setdefault(worker_of(h.path), []).append(h)
    notes = []
    free = (r for r in range(len(headers) + max(ranks, default=0) + 1) if r not in ranks)
    for files in unranked.values():
        rank = next(free)
        ranks[rank] = files
        names = files[0].path.name if len(files) == 1 else f"{len(files)} files of worker " \
            f"{_HANDLER_NAME.match(files[0].path.name)[1]}"  # type: ignore[index]
        notes.append(f"{files[0].path.parent}/{names}: no distributedInfo.rank in the trace: imported as "
                     f"rank {rank} (the file order)")
    for files in ranks.values():
        files.sort(key=lambda h: (h.base_ns, str(h.path)))
    return dict(sorted(ranks.items())), notes


def build_rank(rank: int, headers: Sequence[source.Header], staging: Path, backend: str | None) -> RankResult:
    """Passes 1 and 2 over each file of one rank (a worker process); the raw data written."""
    began = time.perf_counter()
    device_dir = staging / f"device_{rank}"
    fsio.make_dirs(device_dir / "data", root=staging)
    taken: set[int] = set()
    window = 1
    lines: list[tuple[int, dict[str, list[Any]]]] = []
    built: list[build.Built] = []
    problems: list[str] = []
    facts: build.RankFacts | None = None
    dumps = build.dumps_function()
    spools = device_dir / "data" / kinetotrace.FOLDER
    fsio.make_dirs(spools, root=staging)
    for header in headers:
        first_window = window
        # pass 1 writes each event it keeps here, one JSON line; pass 2 routes the lines
        spool = fsio.new_empty_file(spools, lambda: f".import.{os.getpid()}.{time.monotonic_ns()}.jsonl",
                                    root=staging)
        try:
            with open(fsio.open_append(spool, root=staging), "ab", buffering=1 << 20) as handle:
                found = scan.scan(header, source.events(header.path), header.path, handle, dumps)
            done, more, window = build.build(found, spool, device_dir, rank, taken, window, backend)
        except (source.TraceError, OSError) as exc:
            text = str(exc) if isinstance(exc, source.TraceError) else f"{header.path}: {exc.strerror or exc}"
            problems.append(text)
            for written in spools.glob("window.*.json.gz"):  # what this file had written
                if int(written.name.split(".")[1]) >= first_window:
                    written.unlink(missing_ok=True)
            window = first_window
            continue
        finally:
            spool.unlink(missing_ok=True)
        if not done.iterations:
            problems.append(f"{header.path}: no event to import ({found.events} events, none timed)"
                            if not found.timed else f"{header.path}: every ProfilerStep is one an earlier "
                            f"file of rank {rank} has")
            continue
        facts = facts or build.RankFacts.of(found)
        taken.update(done.iterations)
        lines.extend(more)
        built.append(done)
    if not built:
        shutil.rmtree(device_dir, ignore_errors=True)
        return RankResult(rank, problems=tuple(problems), seconds=time.perf_counter() - began)
    writer = rawstore.RawWriter(device_dir)
    try:
        writer.append_many(sorted(lines, key=lambda line: line[0]))
    finally:
        writer.close()
    return RankResult(rank, tuple(built), facts, tuple(problems), time.perf_counter() - began)


def render_rank(device_dir: Path) -> tuple[str, ...]:
    """The ordinary export of one imported device folder, then its facts file (a worker);
    what went wrong."""
    from jobprof.analysis import facts
    from jobprof.engine.manager import PluginManager
    from jobprof.files import export
    from jobprof.plugin.reporter import Reporter

    manager = PluginManager(Reporter())
    manager.load_entry_points()
    kept = facts.PartsKept(manager)
    result = export.export_device(device_dir, manager, on_streams=kept)
    device = profdir.device_id(device_dir)
    problems = list(result.problems)
    with rawstore.reporting(problems.append):
        facts.write(device_dir.parent, manager, devices=[device], known={device: kept.parts})
    return tuple(problems)


def _map(pool: ProcessPoolExecutor | None, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
    if pool is None:
        return [fn(*args) for args in calls]
    try:
        # Ctrl-C waits until the workers (forked by the first call) are known to the pool
        with workers.held_interrupt():
            futures: list[Future[Any]] = [pool.submit(fn, *args) for args in calls]
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C, a failed rank: the workers end now, not after their queue
        workers.end(pool)
        raise


def run(inputs: Sequence[Path], output: Path, jobs: int = 1,
        say: Callable[[str], None] = lambda _text: None) -> Imported:
    """Import ``inputs`` into a new PROF_ folder inside ``output``."""
    began = time.perf_counter()
    files, problems = collect(inputs)
    headers: list[source.Header] = []
    for path in files:
        try:
            headers.append(source.read_header(path))
        except source.TraceError as exc:
            problems.append(str(exc))
    if not headers:
        return Imported(None, (), tuple(problems), (), (), time.perf_counter() - began)
    ranks, notes = assign_ranks(headers)
    jobs = min(jobs, len(ranks))  # a worker per rank at most: one rank is built here, no pool
    backends = {b for h in headers if isinstance(b := h.distributed.get("backend"), str)}
    backend = next(iter(backends)) if len(backends) == 1 else None
    worlds = {w for h in headers if isinstance(w := h.distributed.get("world_size"), int)}
    world: Any = next(iter(worlds)) if len(worlds) == 1 else "N/A" if not worlds else max(worlds)
    fsio.make_dirs(output)
    final, claim = profdir.job_dir(str(output), environ={})
    # the profile is built under its final name inside a hidden folder (readers need a PROF_
    # name) and moved into place once whole
    hidden = fsio.make_unique_dir(output, ".jobprof-import.")
    staging = hidden / final.name
    try:
        fsio.make_dirs(staging, root=output)
        with ProcessPoolExecutor(jobs, initializer=workers.ignore_interrupts) if jobs > 1 \
                else contextlib.nullcontext() as pool:
            say(f"building {len(ranks)} rank(s) from {len(headers)} file(s)")
            results: list[RankResult] = _map(pool, build_rank,
                                             [(r, hs, staging, backend) for r, hs in ranks.items()])
            built = [r for r in results if r.built]
            for r in results:
                problems.extend(r.problems)
            if not built:
                shutil.rmtree(hidden, ignore_errors=True)
                return Imported(None, tuple(results), tuple(problems), tuple(notes), (),
                                time.perf_counter() - began)
            time_base = min(b.first_ns for r in built for b in r.built) // 10**9 * 10**9
            config = build.options(any(b.collectives for r in built for b in r.built),
                                   any(b.ranges for r in built for b in r.built), str(output),
                                   any(build.has_api_calls(b) for r in built for b in r.built))
            for r in built:
                assert r.facts is not None  # set with the first built file
                build.write_metadata(staging / f"device_{r.rank}", r.facts, list(r.built), r.rank, world,
                                     backend or "N/A", config, time_base)
            # the raw data is whole: the profile is moved into place, then rendered there (as
            # a live job's exporter renders its raw data; an interrupted render is what
            # `jobprof export` finishes)
            os.rename(staging, final)
            os.rmdir(hidden)
            say(f"rendering {len(built)} rank(s)")
            rendered = _map(pool, render_rank, [(final / f"device_{r.rank}",) for r in built])
        render_problems = [p for ps in rendered for p in ps]
    except BaseException:
        shutil.rmtree(hidden, ignore_errors=True)
        raise
    finally:
        if claim is not None:
            claim.close()
    for r in results:
        for b in r.built:
            if b.unknown:
                notes.append(f"{b.path}: categories jobprof does not know, kept on the timeline as host "
                             f"events: {', '.join(f'{k} ({v})' for k, v in sorted(b.unknown.items()))}")
            if b.outside:
                notes.append(f"{b.path}: {b.outside} event(s) outside every ProfilerStep (before the first, "
                             "after the last or between steps) left out")
            if b.duplicates:
                notes.append(f"{b.path}: ProfilerStep(s) {', '.join(map(str, b.duplicates))} left out: an "
                             f"earlier file of rank {r.rank} has them")
            if b.method == build.WHOLE_TRACE:
                notes.append(f"{b.path}: no ProfilerStep#N in the trace: imported as one iteration")
    return Imported(final, tuple(results), tuple(problems), tuple(notes), tuple(render_problems),
                    time.perf_counter() - began)

