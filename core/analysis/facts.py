"""Reduce each rank where its data is: the map half of ``summary`` / ``report`` / ``diff``.

A device's *facts* are everything the analysis commands need of it, computed from its raw data in
one pass: its iteration records, the per-iteration breakdown rows of
:func:`jobprof.analysis.summary.iteration_rows`, its rank entry, every plugin's
``jobprof_rank_facts`` aggregates and ``jobprof_diff_tables`` tables, and the read problems met on
the way.  They are small (a row per iteration and a few aggregates), so the cross-rank half
(:func:`jobprof.analysis.summary.summarize`, :func:`jobprof.analysis.diff.load`) holds every
rank's at once and reads no raw record.

Where they come from, cheapest first:

- the device's facts file, ``device_<id>/data/facts.<id>.json``, written by the exporter (the
  session's exit export and ``jobprof export``) and valid while the raw data, the rendered files
  and the set of plugins that answer ``jobprof_rank_facts`` are what they were (its ``stamp``);
  only for the whole profile (``--iterations`` narrows what a plugin aggregates: facts of a window
  are computed);
- computed, on one of the engines of :data:`ENGINES`: ``local`` (this process with ``jobs=1``,
  else a pool of worker processes, one device per task) or ``dask`` (one task per device on a
  Dask cluster: the scheduler at ``--scheduler`` or ``DASK_SCHEDULER_ADDRESS``, else a local
  cluster of ``jobs`` worker processes).  Each task reduces one device from its own files, so a
  worker needs jobprof installed and the PROF_ folder at the same path (a shared file system).

Whatever the engine, a device's facts are the same JSON, so the model a command prints is the same.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from jobprof.analysis import breakdown, workers
from jobprof.analysis.profile import Facts, Profile
from jobprof.analysis.selection import Selection, runs
from jobprof.analysis.stats import describe
from jobprof.engine.manager import DISABLE_ENV, PluginManager
from jobprof.files import batchgc, fsio, jsonread, rawstore
from jobprof.files.profdir import info_rank
from jobprof.plugin import results
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.values import Iteration

#: bumped whenever what a facts file holds changes shape: an older file is then stale
SCHEMA = "jobprof.facts/4"
ENGINES = ("local", "dask")
#: the environment variable Dask (and Nsight Systems' recipes) read for a scheduler's address
DASK_SCHEDULER = "DASK_SCHEDULER_ADDRESS"


def path(folder: Path, device: int) -> Path:
    """A device's facts file."""
    return folder / "data" / f"facts.{device}.json"


def _files_stamp(folder: Path) -> list[Any]:
    """What the facts were computed from, as cheap ``stat`` values: every raw segment and Kineto
    window folder (name, size, mtime), the rendered folders (mtime: a file added, removed or
    replaced by a rename changes it) and whether the job finished."""
    stamp: list[Any] = []
    for segment in rawstore.segments(folder):
        st = segment.stat()
        stamp.append([segment.name, st.st_size, st.st_mtime_ns])
    for sub in ("data/kineto", "summary", "timeline"):
        try:
            stamp.append([sub, (folder / sub).stat().st_mtime_ns])
        except OSError:
            stamp.append([sub, None])
    for name in sorted([*folder.glob("end_info.*"), *folder.glob("info.json.*")]):
        stamp.append([name.name, name.stat().st_size])
    return stamp


def stamp(folder: Path, keys: Iterable[str]) -> list[Any]:
    """The facts file's validity key: the schema, the plugins asked (:func:`plugin_keys`: a
    plugin installed, removed or upgraded makes every facts file stale), the files read."""
    return [SCHEMA, sorted(keys), _files_stamp(folder)]


def _implementers(manager: PluginManager, hook: str) -> set[str]:
    return {impl.plugin_name for impl in getattr(manager.hook, hook).get_hookimpls()
            if not impl.wrapper and manager.has_plugin(impl.plugin_name)}


def asked_plugins(manager: PluginManager) -> list[str]:
    """The loaded plugins that answer ``jobprof_rank_facts`` (a plugin not asked falls back to
    computing its aggregates from the raw data in :meth:`Profile.facts`)."""
    return sorted(_implementers(manager, "jobprof_rank_facts"))


#: ``(items, total, desc) -> items``; ``total`` is a count, None, or a function giving the count
#: (called only by a progress that shows a bar: counting iterations reads the raw files once)
Progress = Callable[[Iterable[Any], "int | Callable[[], int] | None", str], Iterable[Any]]


def quiet(items: Iterable[Any], total: int | Callable[[], int] | None, desc: str) -> Iterable[Any]:
    """The :data:`Progress` that shows nothing."""
    return items


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


#: an iteration's parts in ns (None where unknown), in :data:`breakdown.PARTS` order, and how
#: each uncertain one was found: compact, the profiled job keeps one per iteration until exit
Parts = tuple[tuple[int | None, ...], dict[str, str]]
#: the few distinct bases, shared by the iterations that have them
_BASES: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}


class Kept(NamedTuple):
    """What the exporter keeps of an iteration with operators as it renders it: its parts and
    the plugins' ``jobprof_iteration_facts`` digests (by plugin, as compact JSON text: a fifth of
    the memory of the objects, the job keeps one per iteration until it exits), so the facts
    written after decode none of its operator windows again."""

    parts: Parts | None
    digests: dict[str, str]


def kept_of(manager: PluginManager, streams: Mapping[str, list[Any]]) -> Kept | None:
    """An iteration's :class:`Kept` (None without its record)."""
    parts = iteration_parts(manager, streams)
    if parts is None:
        return None
    it = Iteration.from_record(streams[rawstore.ITERATION_STREAM][0])
    return Kept(parts, {plugin: json.dumps(value, separators=(",", ":"))
                        for plugin, value in manager.iteration_facts(it, streams)})


def iteration_parts(manager: PluginManager, streams: Mapping[str, list[Any]]) -> Parts | None:
    """The parts of the iteration whose raw ``streams`` these are (None without its record):
    what the plugins' ``jobprof_iteration_spans`` answers paint.  The profiled job's exporter
    asks it of each iteration with operators as it renders it (:func:`write`'s ``known``)."""
    records = streams.get(rawstore.ITERATION_STREAM) or []
    if not records:
        return None
    it = Iteration.from_record(records[0])
    answers = manager.iteration_spans(it, streams)
    spans = breakdown.collect(a for _, a in answers)
    if rawstore.PROFILER_STREAM in streams:  # the core's own, no plugin's
        spans[results.PROFILER] = [tuple(s) for s in streams[rawstore.PROFILER_STREAM]]
    parts, basis = breakdown.paint(it, spans)
    return tuple(parts[p] for p in breakdown.PARTS), _BASES.setdefault(tuple(sorted(basis.items())), basis)


class PartsKept:
    """Each iteration's parts and plugin digests, computed as an export renders it
    (``export_device``'s ``on_streams``), so that :func:`write` (its ``known``) does not read
    and decode the operator windows a second time (they were half of ``jobprof export``'s time)."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager
        #: iteration index -> what is kept, for the iterations with operators
        self.parts: dict[int, Kept] = {}

    def __call__(self, index: int, streams: Mapping[str, list[Any]]) -> None:
        if not streams.get(rawstore.OPS_STREAM):
            return  # without operators the facts read little: nothing to save
        try:
            found = kept_of(self.manager, streams)
        except Exception:
            return  # the facts compute it from the raw data instead (and report what fails)
        if found is not None:
            self.parts[index] = found


def iteration_rows(profile: Profile, manager: PluginManager, device: int,
                   progress: Progress = quiet, known: Mapping[int, Kept] | None = None
                   ) -> Iterator[dict[str, Any]]:
    """One row per selected iteration of ``device``: its time and parts in ms, and their basis.
    ``known``: parts already computed, by iteration (their operator windows are not read)."""
    rank = profile.rank(device)
    known = known or {}

    def total() -> int:
        return profile.iteration_count(device)

    for index, streams in progress(profile.streams(device, skip_ops=known), total, f"rank {rank}"):
        records = streams.get(rawstore.ITERATION_STREAM) or []
        if not records:
            continue
        it = Iteration.from_record(records[0])
        kept = known.get(index)
        found = kept.parts if kept is not None and kept.parts is not None else \
            iteration_parts(manager, streams)
        assert found is not None  # the iteration record is there
        values, basis = found
        parts = dict(zip(breakdown.PARTS, values, strict=True))
        yield {"rank": rank, "device": device, "iteration": index, "start_ns": it.start_ns,
               "skipped": it.skipped, "iteration_ms": _ms(it.end_ns - it.start_ns),
               **{f"{p}_ms": _ms(v) for p, v in parts.items()}, "_basis": basis}


def _gaps(indices: list[int]) -> list[str]:
    """Gaps in a rank's iteration numbers, as ``"5-9"`` ranges (computed from the ends, never
    expanded: a raw line's index of 2**62 must not cost memory)."""
    return [f"{a + 1}-{b - 1}" if b > a + 2 else str(a + 1)
            for a, b in itertools.pairwise(sorted(set(indices))) if b > a + 1]


def _count(value: Any) -> int | None:
    """A pid or world size as JSON wants it: info.json holds msprof's strings ("1234", "N/A")."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rank_entry(profile: Profile, device: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A rank's line of the model: who it is, its iterations, its breakdown statistics."""
    info = profile.info(device)
    job = info.get("jobprof", {}) if isinstance(info.get("jobprof"), dict) else {}
    index = [r["iteration"] for r in rows]
    series = {"iteration": [r["iteration_ms"] for r in rows],
              **{p: [r[f"{p}_ms"] for r in rows] for p in breakdown.PARTS}}
    total = sum(series["iteration"])
    share = {p: (sum(v for v in series[p] if v is not None) / total
                 if total and any(v is not None for v in series[p]) else None) for p in breakdown.PARTS}
    basis: dict[str, str] = {}
    for r in rows:
        basis.update(r["_basis"])
    return {
        "rank": profile.rank(device), "device": device, "hostname": info.get("hostname"),
        "pid": _count(info.get("pid")), "finished": profile.finished(device),
        # a process with no rank of a distributed job (a helper or child that inherited
        # PROFILING_MODE, the program after exec): its device id stands in for the rank
        "distributed": info_rank(info) is not None,
        "iteration_method": job.get("iteration_method"), "world_size": _count(job.get("world_size")),
        "iterations": {"count": len(rows), "first": index[0] if index else None,
                       "last": index[-1] if index else None, "gaps": _gaps(index)},
        "breakdown_ms": {k: describe(v, index) for k, v in series.items()},
        "share": share, "basis": basis, "startup": _startup(profile, device, job, rows),
    }


def _startup(profile: Profile, device: int, job: Mapping[str, Any],
             rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What came before iteration 1, in no iteration: ``{"ms": profiling start (the session's
    clock anchor, start_info) to iteration 1's start (its first forward), "own_ms": jobprof's
    part of it, "own": {what: ms}}``; None when iteration 1 is not selected (a narrowed
    selection, a dynamic capture) or the anchor is unknown."""
    if not rows or rows[0]["iteration"] != 1 or rows[0].get("start_ns") is None:
        return None
    anchor = rawstore.read_start(profile.folder(device) / f"start_info.{device}")
    if anchor is None:
        return None
    ms = (rows[0]["start_ns"] - int(anchor["clockMonotonic"])) / 1e6
    if ms < 0:
        return None
    told = job.get("own_startup_ms")
    told = told if isinstance(told, dict) else {}
    own = {str(k): float(v) for k, v in told.items() if isinstance(v, int | float)}
    return {"ms": round(ms, 3), "own_ms": round(sum(own.values()), 3), "own": own}


def plugin_keys(manager: PluginManager) -> list[str]:
    """``"<name> <distribution> <version>"`` of every plugin whose answers a facts file keeps:
    those that answer ``jobprof_rank_facts`` or ``jobprof_diff_tables``."""
    records = {r.name: r for r in manager.records()}
    kept = _implementers(manager, "jobprof_rank_facts") | _implementers(manager, "jobprof_diff_tables")
    return [f"{name} {records[name].distribution} {records[name].version}".rstrip() if name in records
            else name for name in sorted(kept)]


def reduce_device(profile: Profile, manager: PluginManager, device: int,
                  progress: Progress = quiet, tables: bool = True,
                  known: Mapping[int, Kept] | None = None) -> Facts:
    """One device's facts, computed from its raw data (``profile`` holds that device);
    ``tables``: with ``jobprof diff``'s tables (key ``diff_tables``); ``known``: as
    :func:`iteration_rows` takes it."""
    problems: list[str] = []
    with rawstore.reporting(problems.append):
        rows = list(iteration_rows(profile, manager, device, progress, known))
        if known:
            profile.keep_digests(device, {index: kept.digests for index, kept in known.items()})
        entry = rank_entry(profile, device, rows)
        iterations = list(profile.records(rawstore.ITERATION_STREAM, device))
        plugins = {name: value for name, value in manager.rank_facts(profile, device)}
        # jobprof diff's tables (core-declared DiffTable values, so the core keeps them for any plugin)
        diff = {name: [t.to_plain() for t in found] for name, found in manager.diff_tables(profile, device)} \
            if tables else None
    facts: Facts = {
        "schema": SCHEMA, "device": device, "rank": profile.rank(device),
        "selection": profile.selection.describe(), "entry": entry,
        # the model's iteration rows as they are: the basis is in the entry already
        "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
        "iterations": [{k: v for k, v in r.items() if not k.startswith("_")} for r in iterations],
        "rendered": runs(profile.rendered(device)),
        "asked": asked_plugins(manager), "plugins": plugins, "problems": problems}
    if diff is not None:
        facts["diff_tables"] = diff
    return facts


def _plain(facts: Facts) -> Facts:
    # what a facts file or a worker gives back: the same value whichever way it came
    return json.loads(json.dumps(facts, allow_nan=False))


def file_text(key: list[Any], facts: Facts) -> str:
    """A facts file's text: two JSON lines, ``{"stamp", "facts"}`` then ``{"diff_tables"}``.
    The second, as large as the first for a long run, is read apart, only by ``jobprof diff``."""
    compact = (",", ":")
    body = {k: v for k, v in facts.items() if k != "diff_tables"}
    return (json.dumps({"stamp": key, "facts": body}, separators=compact) + "\n"
            + json.dumps({"diff_tables": facts.get("diff_tables", {})}, separators=compact))


def _halves(file: Path, tail: bool = True) -> tuple[bytes, bytes]:
    """The facts file's two lines; without ``tail`` the second is not even read."""
    with fsio.open_read(file) as handle:
        return handle.readline().rstrip(b"\n"), handle.read() if tail else b""


def _tables(tail: bytes) -> dict[str, Any]:
    diff = jsonread.loads(tail)["diff_tables"]
    if not isinstance(diff, dict):
        raise ValueError("diff_tables is not an object")
    return diff


def read_file(file: Path) -> dict[str, Any]:
    """A facts file whole, unchecked: ``{"stamp", "facts"}``, diff's tables in ``facts``
    (OSError, ValueError, KeyError, TypeError when it is not one)."""
    head, tail = _halves(file)
    kept: dict[str, Any] = jsonread.loads(head)
    kept["facts"]["diff_tables"] = _tables(tail)
    return kept


def read_cached(profile: Profile, device: int, keys: list[str], tables: bool = False) -> Facts | None:
    """The device's facts file when it holds the whole profile and is still valid; else None.
    ``tables``: with diff's tables (decoded only then)."""
    if profile.selection.iterations is not None:
        return None
    folder = profile.folder(device)
    try:
        head, tail = _halves(path(folder, device), tables)
        kept = jsonread.loads(head)
        if not isinstance(kept, dict) or kept.get("stamp") != stamp(folder, keys) \
                or not isinstance(kept.get("facts"), dict):
            return None
        facts: Facts = kept["facts"]
        if tables:
            facts["diff_tables"] = _tables(tail)
    except fsio.NotRegular as exc:  # a FIFO would block: named, the facts are computed instead
        rawstore.problem(f"{exc}: the facts are computed from the raw data")
        return None
    except (OSError, ValueError, KeyError, TypeError):  # unreadable, not JSON, not the shape written
        return None
    return facts


def write(prof_dir: Path, manager: PluginManager, devices: Iterable[int] | None = None,
          known: Mapping[int, Mapping[int, Kept]] | None = None) -> list[Path]:
    """Compute and keep the facts of ``devices`` (default every one) of a whole profile; the
    exporter's last step.  A device whose facts cannot be written is named and skipped.
    ``known``: by device, the parts of the iterations the exporter computed as it rendered
    them (a job's exit then reads no operator window a second time)."""
    written = []
    for device in devices if devices is not None else Profile(prof_dir).all_devices:
        profile = Profile(prof_dir, device=device)
        folder = profile.folder(device)
        if not (folder / "data").is_dir():
            continue  # nothing jobprof wrote is there (its readers name the folder)
        # stamped before the read: a change meanwhile makes the file stale, not wrong
        key = stamp(folder, plugin_keys(manager))
        facts = _plain(reduce_device(profile, manager, device, known=(known or {}).get(device)))
        target = path(folder, device)
        try:
            fsio.atomic_write(target, file_text(key, facts), root=profile.path)
        except OSError as exc:
            rawstore.problem(f"{target}: cannot write the facts file ({exc}): commands will read "
                             "the raw data instead")
            continue
        written.append(target)
    return written


# -- engines ----------------------------------------------------------------------------------
#: a worker's task: (PROF_ folder, device, --iterations window, disabled plugins, with diff's tables)
Task = tuple[str, int, tuple[int, int] | None, str, bool]


#: a worker's plugin manager, by the JOBPROF_DISABLE_PLUGINS it was loaded with
_WORKER_MANAGERS: dict[str, PluginManager] = {}


def _task(prof_dir: str, device: int, iterations: tuple[int, int] | None, disabled: str,
          tables: bool) -> Facts:
    """One device reduced in a worker (a pool's process or a Dask worker): the entry points
    loaded as the command loaded them (``disabled``: its JOBPROF_DISABLE_PLUGINS), the facts as
    plain JSON."""
    manager = _WORKER_MANAGERS.get(disabled)
    if manager is None:  # once per worker process: loading the entry points costs ~60 ms
        manager = _WORKER_MANAGERS[disabled] = PluginManager(Reporter())
        manager.load_entry_points({DISABLE_ENV: disabled})
    profile = Profile(Path(prof_dir), Selection(iterations), device=device)
    return _plain(reduce_device(profile, manager, device, tables=tables))


def _local(tasks: list[Task], jobs: int,
           progress: Progress) -> Generator[Facts, None, None]:
    # imported here: concurrent.futures registers an atexit hook, refused during the job's exit
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context, resource_tracker

    pool = None
    try:
        # started before: as it starts, multiprocessing's resource tracker unblocks SIGINT, which
        # the workers must inherit blocked
        resource_tracker.ensure_running()
        # Ctrl-C waits until every worker is started and known to the pool (jobprof.analysis.workers)
        with workers.held_interrupt():
            # spawn: a fresh interpreter per worker (a forked copy of a process with threads may hang)
            pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"),
                                       initializer=_worker_start)
            futures = [pool.submit(_task, *t) for t in tasks]
        for future in progress(futures, len(futures), "ranks"):
            yield future.result()
        workers.end(pool, now=False)
    except BaseException:
        # Ctrl-C, a failed rank, the reader gone: the workers end now, not after their queue
        workers.end(pool)
        raise


def _worker_start() -> None:
    """In each worker: Ctrl-C is the command's (:func:`workers.ignore_interrupts`)."""
    workers.ignore_interrupts()
    batchgc.tune()


def _sees(prof_dir: str) -> bool:
    return Path(prof_dir).is_dir()


def check_workers(client: Any, prof_dir: str) -> None:
    """Before any task: every worker of ``client`` can run jobprof and sees ``prof_dir`` at that
    path (a worker without either would fail each rank's task, one traceback per rank);
    ValueError names what is missing and where."""
    try:
        seen = client.run(_sees, prof_dir)
    except Exception as exc:  # whatever a worker raised (an import error of jobprof, ...)
        raise ValueError(f"--engine dask: the Dask workers cannot run jobprof ({type(exc).__name__}: "
                         f"{exc}); install the same jobprof on every worker") from None
    if not seen:
        raise ValueError("--engine dask: the Dask cluster has no worker")
    blind = sorted(worker for worker, ok in seen.items() if not ok)
    if blind:
        raise ValueError(f"--engine dask: {len(blind)} of {len(seen)} Dask worker(s) do not see {prof_dir} "
                         f"({', '.join(blind[:3])}{', ...' if len(blind) > 3 else ''}): each worker reads "
                         "its ranks' files, so the PROF_ folder must be at the same path on every worker "
                         "(a shared file system)")


def _dask(tasks: list[Task], jobs: int,
          scheduler: str | None, progress: Progress) -> Generator[Facts, None, None]:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise ValueError("--engine dask needs Dask: pip install 'jobprof[cluster]' "
                         "(dask[distributed])") from None
    address = scheduler or os.environ.get(DASK_SCHEDULER)
    cluster = None
    if address:
        client = Client(address)
    else:  # a local cluster of worker processes, as Nsight Systems' dask-futures mode starts
        cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
    try:
        check_workers(client, tasks[0][0])
        futures = client.map(_task, *zip(*tasks, strict=True), pure=False)
        for future in progress(futures, len(futures), "ranks"):
            yield future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def default_jobs() -> int:
    """Every core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def gather(profile: Profile, manager: PluginManager, engine: str = "local", jobs: int | None = None,
           scheduler: str | None = None, progress: Progress | None = None,
           tables: bool = False) -> dict[int, Facts]:
    """Every selected device's facts, from its facts file or computed on ``engine``; each is
    also attached to ``profile`` (:meth:`Profile.attach_facts`) and its read problems reported
    again here, in device order.  ``tables``: with ``jobprof diff``'s tables (``diff_tables``),
    which ``summary`` / ``report`` neither read nor compute."""
    if engine not in ENGINES:
        raise ValueError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: expected 1 or more")
    show = progress or quiet
    keys = plugin_keys(manager)
    found: dict[int, Facts] = {}
    todo = []
    for device in profile.devices:
        cached = read_cached(profile, device, keys, tables)
        if cached is not None:
            found[device] = cached
        else:
            todo.append(device)
    disabled = os.environ.get(DISABLE_ENV, "")
    if engine == "local" and (jobs == 1 or len(todo) <= 1):
        for device in todo:
            one = Profile(profile.path, profile.selection, device=device)
            found[device] = _plain(reduce_device(one, manager, device, progress or quiet, tables))
    elif todo:
        tasks: list[Task] = [(str(profile.path), d, profile.selection.iterations, disabled, tables)
                             for d in todo]
        run = _local(tasks, min(jobs, len(todo)), show) if engine == "local" else \
            _dask(tasks, jobs, scheduler, show)
        with contextlib.closing(run):  # ended here, whatever ends the loop (its workers with it)
            for facts in run:
                found[facts["device"]] = facts
    out = {}
    for device in profile.devices:
        facts = found[device]
        for text in facts.get("problems", ()):
            rawstore.problem(text)
        profile.attach_facts(device, facts)
        out[device] = facts
    return out

