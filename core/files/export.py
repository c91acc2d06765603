"""Renders the per-iteration timeline/summary files from raw records.

Used in the profiled process (by the sink thread, from records still in memory) and offline
by ``jobprof export PROF_DIR`` (from ``device_<id>/data``).  Rendering is deterministic, so
exporting twice gives the same files.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import attrs

from jobprof.engine.manager import PluginManager
from jobprof.files import csvsafe, kinetotrace, profdir, rawstore
from jobprof.files.fsio import atomic_write, make_dirs
from jobprof.plugin import timeline
from jobprof.plugin.clock import ClockAnchor, own_base
from jobprof.plugin.values import Config, ExportContext, Iteration, MetricSet, WriterSpec


@attrs.frozen
class DeviceMeta:
    """What export needs to know about one device folder (from its metadata files)."""

    device_id: int
    pid: int
    anchor: ClockAnchor
    config: Config | None
    program: str = ""
    #: the calibration the profiled process recorded (info.json ``jobprof.calibration``)
    machine: Mapping[str, Any] = attrs.field(factory=dict)
    metrics: MetricSet | None = None
    #: rank_id, world_size, backend of the process (info.json), ``N/A`` outside a distributed job
    job: Mapping[str, Any] = attrs.field(factory=dict)
    #: the job's time base (info.json ``jobprof.time_base_ns``; see jobprof.plugin.clock)
    time_base_ns: int | None = None


#: the name writers of the core itself are listed under (the master timeline)
CORE = "jobprof"


def writers_for(manager: PluginManager, config: Config | None) -> list[tuple[str, WriterSpec]]:
    """Every plugin's writers, then the core's master timeline (built from every plugin)."""
    specs = [(plugin, spec) for plugin, specs in manager.writers(config)
             for spec in specs]
    master = WriterSpec(timeline.NAME, "json", partial(render_master, manager),
                        "master timeline: the tracks of every plugin")
    return [*specs, (CORE, master)]


def render_master(manager: PluginManager, ctx: ExportContext) -> str | None:
    """The master timeline of ``ctx``'s iteration: every active plugin adds its tracks
    (``jobprof_timeline``), None when none added an event."""
    master = timeline.Timeline(ctx.pid)
    manager.timeline(ctx, master)
    return master.render()


class Cancelled(Exception):
    """``render_iteration`` stopped between two writers because ``cancel()`` said so."""


def render_iteration(device_dir: Path, meta: DeviceMeta, streams: Mapping[str, list[Any]],
                     writers: Iterable[tuple[str, WriterSpec]],
                     on_error: Callable[[str, str], None],
                     on_note: Callable[[int, str], None] | None = None,
                     cancel: Callable[[], bool] | None = None) -> list[tuple[Path, int]]:
    """Write every writer's file for one iteration; returns (path, bytes) per file.  What the
    writers noted (:attr:`ExportContext.notes`) goes to ``on_note(iteration, sentence)``;
    ``cancel()`` is asked between writers (true: :class:`Cancelled` is raised, the files
    written so far stay to be rendered again)."""
    iteration = Iteration.from_record(streams[rawstore.ITERATION_STREAM][0])
    ctx = ExportContext(meta.device_id, iteration, meta.pid, streams, meta.anchor, meta.config,
                        meta.program, meta.metrics, meta.machine, job=meta.job,
                        time_base_ns=meta.time_base_ns)
    try:
        return _render(ctx, device_dir, meta, writers, on_error, on_note, cancel)
    finally:
        # what the writers memoised (the operator view, the task table) refers back to the
        # context: a cycle that kept every operator of the iteration alive until Python's
        # cyclic collector found it (1.4M objects for 200k operators, a second to traverse)
        ctx.memo.clear()


def _render(ctx: ExportContext, device_dir: Path, meta: DeviceMeta, writers: Iterable[tuple[str, WriterSpec]],
            on_error: Callable[[str, str], None],
            on_note: Callable[[int, str], None] | None,
            cancel: Callable[[], bool] | None = None) -> list[tuple[Path, int]]:
    iteration = ctx.iteration
    written = []
    for plugin, spec in writers:
        if cancel is not None and cancel():
            raise Cancelled
        try:
            text = spec.render(ctx)
        except Exception as exc:
            on_error(plugin, f"writer '{spec.name}' raised {type(exc).__name__}: {exc}")
            continue
        if text is None:
            continue
        files = text.items() if isinstance(text, Mapping) else ((iteration.model_id, text),)
        for model, body in files:
            if not isinstance(model, int) or not isinstance(body, str):
                on_error(plugin, f"writer '{spec.name}' returned {type(model).__name__} -> "
                                 f"{type(body).__name__}, not model id -> text")
                continue
            if spec.extension == "csv":  # names the job chose, opened in a spreadsheet
                body = csvsafe.neutralised(body)
            path = device_dir / spec.folder / spec.filename(meta.device_id, model, iteration.index)
            # root: the PROF_ folder; a symlinked device/summary/timeline folder is refused
            written.append((path, atomic_write(path, body, root=device_dir.parent)))
    if on_note is not None:
        for note in dict.fromkeys(ctx.notes):
            on_note(iteration.index, note)
    return written


def read_meta(device_dir: Path) -> DeviceMeta:
    """Load the device's id, pid, clock anchor and recorded options from its metadata."""
    device_id = profdir.device_id(device_dir)  # ValueError for a folder not named device_<id>
    # through the readers' checks (rawstore), which name a present but unusable file
    start = rawstore.read_start(device_dir / f"start_info.{device_id}")
    info = rawstore.read_info(device_dir / f"info.json.{device_id}")
    unusable = [name for name, got in ((f"start_info.{device_id}", start), (f"info.json.{device_id}", info))
                if got is None]
    if unusable:
        raise ValueError(f"{' and '.join(unusable)} missing or unusable")
    assert start is not None and info is not None  # both read (unusable is empty)
    own = info.get("jobprof", {})
    options = own.get("options")
    config = Config(options, explicit=own.get("explicit", [])) if options else None
    job = {"rank_id": info.get("rank_id", "N/A"), "world_size": own.get("world_size", "N/A"),
           "backend": own.get("backend", "N/A")}
    anchor = ClockAnchor.from_info(start)
    base = own.get("time_base_ns")
    # a profile written before the base was recorded: the process's own (its anchor's second)
    base = base if isinstance(base, int) and not isinstance(base, bool) else own_base(anchor)
    return DeviceMeta(device_id, int(info.get("pid", 0)), anchor, config,
                      str(info.get("pid_name", "")), own.get("calibration") or {}, job=job,
                      time_base_ns=base)


def with_metrics(meta: DeviceMeta, manager: PluginManager) -> DeviceMeta:
    """The device's metadata with the metric set its options chose (``aic_metrics``)."""
    if meta.config is None:
        return meta
    answer = manager.aic_metrics(meta.config.get("aic_metrics"))
    return attrs.evolve(meta, metrics=answer[1]) if answer else meta


@attrs.frozen
class ExportResult:
    device_dir: Path
    iterations: int
    files: int
    problems: tuple[str, ...] = ()
    #: what the writers noted (a cap applied): sentence -> iterations, in the order first noted
    notes: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)
    #: the iterations rendered, in order
    rendered: tuple[int, ...] = ()
    #: bytes written (what the rendered files hold)
    written_bytes: int = 0
    #: the iterations left unrendered because ``room`` ran out
    no_room: tuple[int, ...] = ()


def export_device(device_dir: Path, manager: PluginManager,
                  progress: Callable[[int], None] | None = None, *,
                  only: Container[int] | None = None, room: int | None = None,
                  on_streams: Callable[[int, Mapping[str, list[Any]]], None] | None = None) -> ExportResult:
    """Re-render every iteration whose raw data is present in one device folder (with
    ``only``: those it holds).  ``room``: bytes the rendered files may take; once they took it,
    the rest is left unrendered (:attr:`ExportResult.no_room`).  ``on_streams(index, streams)``
    sees each iteration's records once its files are written (the exporters keep its summary
    parts for the facts file)."""
    try:
        meta = read_meta(device_dir)
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        return ExportResult(device_dir, 0, 0, (f"{device_dir}: unreadable metadata ({exc})",))
    problems: list[str] = []
    notes: dict[str, list[int]] = {}
    rendered: list[int] = []
    no_room: list[int] = []
    files = written = 0
    try:  # a folder that is a symbolic link (fsio.UnsafePath) or unwritable stops this device only
        for sub in ("timeline", "summary"):
            make_dirs(device_dir / sub, root=device_dir.parent)
        meta = with_metrics(meta, manager)
        writers = writers_for(manager, meta.config)
        for index, streams in rawstore.read(device_dir, only=only):
            if room is not None and written >= room:
                no_room.append(index)
                continue
            made = render_iteration(device_dir, meta, streams, writers,
                                    lambda p, m: problems.append(f"plugin '{p}': {m}"),
                                    lambda i, note: notes.setdefault(note, []).append(i))
            if on_streams is not None:  # after the files: a hook it calls that fails cannot cost them
                on_streams(index, streams)
            files += len(made)
            written += sum(size for _, size in made)
            rendered.append(index)
            if progress:
                progress(len(rendered))
    except OSError as exc:
        problems.append(f"export of {device_dir.name} stopped: {exc.strerror or exc}")
    kinetotrace.compress_plain(device_dir)  # the windows the job's end left as Kineto wrote them
    return ExportResult(device_dir, len(rendered), files, tuple(problems),
                        {note: tuple(its) for note, its in notes.items()}, tuple(rendered), written,
                        tuple(no_room))


