"""The plugin contract: every hook jobprof calls, in lifecycle order.

A plugin is any object (usually a module) registered under the ``jobprof`` entry-point group
whose functions are marked with :data:`hookimpl`.  Hooks are called by keyword, so an
implementation may accept only the arguments it needs.  Per-operator work never goes through
these hooks: they are the lifecycle; collectors installed in ``jobprof_session_start`` do the
hot-path work as plain code.

Lifecycle of one profiled process::

    registration   jobprof_options_schema()            every loaded plugin, before options are parsed
    configure      jobprof_configure(config)           once the options are valid
    collection     jobprof_session_start(session)      once torch is imported
                   jobprof_iteration_end(session, iteration)   after each finished iteration
                   jobprof_session_end(session)        at exit, SIGTERM or uncaught exception
    export         jobprof_writers(config)             by the exporter (in-process and `jobprof export`)
                   jobprof_aic_metrics(name)           once per export: the chosen metric group
                   jobprof_timeline(ctx, timeline)     per iteration, for the master timeline
    reporting      jobprof_rank_facts(profile, device)  per device: aggregates kept in its facts file
                   jobprof_report_sections(profile)    by `jobprof summary` and `jobprof report`
                   jobprof_iteration_spans(iteration, streams)   by `jobprof summary`, per iteration
                   jobprof_iteration_facts(iteration, streams)   per iteration, for jobprof_rank_facts
                   jobprof_breakdown_sources()         by `jobprof summary`: who measures which part
                   jobprof_diff_tables(profile, device)   per device, beside jobprof_rank_facts

A hook that raises disables its plugin for the rest of the process; the job and the other
plugins carry on, and the reporter names the plugin once.  So does a result the hook's
contract does not allow (checked by the engine, ``jobprof.engine.manager.CHECKS``).

Hooks are called by pluggy, with pluggy's semantics:

- **Order.** pluggy's: the last registered runs first, ``trylast`` implementations last.
  Built-ins always run before third-party plugins (jobprof registers their plain
  implementations ``tryfirst`` and ignores ``tryfirst`` on a third-party one), so a built-in
  claims its streams and writer files first; the first plugin to return a stream or a file
  owns it.  Third-party plugins load by entry-point name (then ``sys.path``) and so run in
  reverse of that order: a plugin loaded later can override an earlier one's answer to
  ``jobprof_aic_metrics``.
- **firstresult.** ``jobprof_aic_metrics`` is ``firstresult``: pluggy stops at the first
  implementation that returns something other than None; the later ones are not called.
- **Wrappers.** A new-style wrapper, ``@hookimpl(wrapper=True)``, runs around the other
  implementations of a hook (pluggy's own order among wrappers).  What it receives from
  ``yield`` is the list of :class:`Answer` (plugin, checked value) the implementations
  returned, or for a firstresult hook the one Answer or None; what it returns replaces it.  It
  may drop or reorder answers and add its own (``Answer(<its plugin name>, value)``, checked
  like an implementation's).  A wrapper that raises, or returns anything else, is disabled
  and the inner result passes through unchanged.  Old-style ``hookwrapper=True`` is refused::

      @hookimpl(wrapper=True)
      def jobprof_report_sections(profile):
          answers = yield
          return [a for a in answers if a.plugin != "noisy"]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

if TYPE_CHECKING:
    from jobprof.plugin.results import DiffTable, Section
    from jobprof.plugin.session import PluginSession
    from jobprof.plugin.timeline import Timeline
    from jobprof.plugin.values import Config, ExportContext, Iteration, MetricSet, PartSource, WriterSpec
    from jobprof.plugin.views import Profile

PROJECT = "jobprof"
hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate plugin functions with this: ``@jobprof.plugin.hookspec.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)


@attrs.frozen
class Answer:
    """One implementation's non-None result, as a hook wrapper sees it: who answered, and the
    value after the hook's contract check (e.g. a generator of WriterSpec already listed)."""

    plugin: str
    value: Any


@hookspec
def jobprof_options_schema() -> Mapping[str, Any] | None:
    """Return the JSON Schema fragment for the option keys this plugin reads.

    Called at start-up, right after plugins are loaded and before PROFILING_OPTIONS is
    validated (again, if another plugin's fragment is rejected and the schema is recomposed).
    The fragment is a Draft 2020-12 object schema with ``properties`` (one entry
    per key) and optionally ``allOf`` (cross-key rules).  A key the core already knows (the
    msprof keys) is refined, and the plugin is listed as the one collecting it; a new key is
    added.  Fragments may reference the core's ``#/$defs/switch`` (on/off/"") and
    ``#/$defs/level`` (on/off/l0/l1/l2/"").  Give each property a ``default``.

    Example::

        @hookimpl
        def jobprof_options_schema():
            return {"properties": {"gpu_temp": {"$ref": "#/$defs/switch", "default": "off"}}}
    """


@hookspec
def jobprof_configure(config: Config) -> bool | None:
    """Decide whether the plugin takes part in this run.

    Called once the options are valid, with the frozen effective :class:`~jobprof.plugin.Config`,
    and again by the exporter (``jobprof export`` too) to know whose writers to ask: a pure
    function of ``config``.  Return ``False`` to stay inactive (no session hooks are called on
    an inactive plugin, its ``jobprof_writers`` is not asked); ``True`` or ``None`` means active.

    Example::

        @hookimpl
        def jobprof_configure(config):
            return config.is_on("gpu_temp")
    """


@hookspec
def jobprof_session_start(session: PluginSession) -> None:
    """Install collectors.  Called once, when the profiled program has imported torch; in
    dynamic mode (``PROFILING_MODE=dynamic``) once per capture instead, at an iteration boundary
    in the middle of the run, with a session of its own (its ``jobprof_session_end`` follows
    at the capture's end): collectors must work on objects the program made before.

    ``session.config`` holds the options; keep per-run state on the session with
    ``session.attach(name, obj)`` (plugins hold no global state).  Collectors must never raise
    into or print from the training loop.

    Example::

        @hookimpl
        def jobprof_session_start(session):
            session.attach("gpu_temp", TemperatureSampler(period_s=0.1))
    """


@hookspec
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> Mapping[str, list] | None:
    """Hand over the raw records collected during ``iteration``.

    Called once per finished iteration, in order, usually on the training thread right after
    the iteration ends (keep it cheap: no file I/O, no formatting).  When iterations are found
    from ``backward()`` or forward calls they are confirmed in bursts (up to 16 calls back to
    back, or at exit from the atexit/SIGTERM path), so select records by the iteration's
    ``start_ns``/``end_ns`` rather than taking "everything since the last call".  Return
    ``{stream_name: [record, ...]}`` with JSON-serialisable records; the core stores them
    atomically under ``device_<id>/data/`` and passes them to writers.  A stream belongs to the
    first plugin that returns it (built-ins are called first).

    To keep the training thread free, a stream's value may instead be a zero-argument callable
    returning that list: the core calls it on the ``jobprof-sink`` thread within 0.1 s (and
    before ``jobprof_session_end`` at exit), iteration by iteration, in order.  Meanwhile the
    collector keeps collecting, so the callable must select by the iteration's times and be
    safe against the threads that feed the collector.  If it raises, the plugin is disabled.

    Example::

        @hookimpl
        def jobprof_iteration_end(session, iteration):
            sampler = session.attached("gpu_temp")
            return {"gpu_temp": sampler.take_between(iteration.start_ns, iteration.end_ns)}
            # or, deferred to the sink thread:
            # return {"gpu_temp": functools.partial(sampler.take_until, iteration.end_ns)}
    """


@hookspec
def jobprof_session_end(session: PluginSession) -> None:
    """Uninstall collectors.  Called once at exit, on SIGTERM or after an uncaught exception.

    Records of an unfinished iteration are dropped; every finished one was already handed over.
    Also called on a plugin that fails mid-run, just before it is disabled, so its collectors
    do not outlive it.

    Example::

        @hookimpl
        def jobprof_session_end(session):
            session.attached("gpu_temp").stop()
    """


@hookspec
def jobprof_writers(config: Config | None) -> Iterable[WriterSpec] | None:
    """Describe the per-iteration files the plugin renders from raw records.

    Called by the exporter, in the profiled process and by ``jobprof export`` (then with the
    config recorded in ``info.json``), only for a plugin whose ``jobprof_configure(config)``
    does not answer False (the core asks it there too), and by ``jobprof plugins`` with
    ``config=None`` (list every file the plugin can write).  Return
    :class:`~jobprof.plugin.WriterSpec` objects.

    Example::

        @hookimpl
        def jobprof_writers(config):
            return [WriterSpec("gpu_temp", "csv", render=render_csv)]
    """


@hookspec(firstresult=True)
def jobprof_aic_metrics(name: str) -> MetricSet | None:
    """Return the metric set of the ``aic_metrics`` group called ``name``, or None.

    Called by the exporter once per export (in the profiled process when the session starts,
    and by ``jobprof export``) with the group the options chose (``PipeUtilization`` when
    ``aic_metrics`` is present but empty).  A ``firstresult`` hook: the first plugin that
    answers (built-ins are asked first) owns the group, and pluggy calls no later one.
    The set's ``columns`` are appended to every ``op_summary`` row; its ``values(task,
    machine)`` fills them for one task (see :class:`~jobprof.plugin.MetricSet`).  A group
    nobody answers is reported once and gets no columns.  Called whether or not the plugin is
    configured active, like ``jobprof_writers``.

    Example::

        @hookimpl
        def jobprof_aic_metrics(name):
            if name == "Intensity":
                return MetricSet("Intensity", ["arith_intensity"], needs_shapes=True,
                                 values=lambda task, machine: [task.flops / task.bytes_moved])
    """


@hookspec
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    """Add this plugin's tracks to the iteration's master timeline, ``msprof_*.json``.

    Called by the exporter once per iteration (in the profiled process and by ``jobprof
    export``), after the writers.  ``ctx`` is the same :class:`~jobprof.plugin.ExportContext` the
    writers get; return nothing when your stream is absent.  Ask ``timeline.process(name,
    label)`` for a pid (the same name gives the same pid, so plugins can share a process),
    name tracks with ``timeline.thread(pid, tid, name)`` and ``timeline.add(events)``: Chrome
    trace events whose ``ts`` comes from ``ctx.to_us`` and ``dur`` from ``ctx.dur_us`` (the
    time rule of ``jobprof.plugin.clock``).  Events on one (pid, tid) must nest, and tids stay below
    ``jobprof.plugin.timeline.PID_BASE`` (the track rule there).
    The file is written only if some plugin added an event.

    Example::

        @hookimpl
        def jobprof_timeline(ctx, timeline):
            temps = ctx.records("gpu_temp")
            if temps:
                pid = timeline.process("GPU temperature")
                timeline.add({"name": "temp", "ph": "C", "pid": pid, "tid": 0,
                              "ts": ctx.to_us(t["ns"]), "args": {"C": t["celsius"]}} for t in temps)
    """


@hookspec
def jobprof_iteration_spans(iteration: Iteration, streams: Mapping[str, list]) -> Mapping[str, list] | None:
    """Return where one iteration's time went, as ``{category: [(start_ns, end_ns), ...]}``.

    Called once per stored iteration with its raw streams: in the profiled job, on its
    exporter thread, as an iteration with operators is rendered (the facts file written at exit
    keeps the result), and by ``jobprof summary`` / ``report`` for the others; so it must be a
    pure function of its arguments.  Times are the profiled process's ``monotonic_ns``.  The
    core paints the iteration with these spans into the breakdown of
    :mod:`jobprof.analysis.breakdown`.  Categories it understands:
    ``data_wait`` (the loop waited for input), ``compute`` (operators ran), ``communication``
    (collectives were in flight), ``communication_blocking`` (collectives the loop is known to
    have waited for; used when nobody reports ``compute``), ``forward_backward`` and
    ``refresh`` (the step's phases).  Return None when the plugin has nothing to say.

    Example::

        @hookimpl
        def jobprof_iteration_spans(iteration, streams):
            waits = [(r["t0"], r["t1"]) for r in streams.get("my_loader", ())]
            return {"data_wait": waits} if waits else None
    """


@hookspec
def jobprof_iteration_facts(iteration: Iteration, streams: Mapping[str, list]) -> Any:
    """Return this plugin's small digest of one iteration, for its :func:`jobprof_rank_facts`.

    The map step below ``jobprof_rank_facts``, for facts that need the operator windows
    (``ops``, ``op_memory``), whose decoding costs as much as rendering them: the exporter calls
    it on each iteration with operators as it renders it (in the profiled job and in ``jobprof
    export``, the streams already decoded) and keeps the answer, so the facts written after
    decode no window again.  Read the digests back in ``jobprof_rank_facts`` with
    ``profile.iteration_facts(<plugin name>, device, <this function>)``, which calls the function
    itself on an iteration nothing kept.  A pure function of its arguments; return JSON-ready
    data, a few hundred bytes (the job keeps one per iteration until it exits), or None for an
    iteration without your data.

    Example::

        @hookimpl
        def jobprof_iteration_facts(iteration, streams):
            ops = streams.get("ops") or []
            return {"mm_ns": sum(r.dur for r in ops if r.name == "aten::mm")} if ops else None
    """


@hookspec
def jobprof_rank_facts(profile: Profile, device: int) -> Any:
    """Return this plugin's aggregates of one device, for its report sections to combine.

    The map half of the analysis commands' map/reduce: called once per device, on a
    :class:`~jobprof.plugin.Profile` that holds that device alone, wherever the device
    is reduced: in the command's process, a worker process (``--jobs``), a Dask worker
    (``--engine dask``), or by the exporter (the session's exit export and ``jobprof export``),
    which keeps every plugin's answer in the device's facts file so that later commands read no
    raw data.  Return JSON-ready data (dicts with ``str`` keys, lists, str, int, float, bool,
    None) computed from this device alone, or None when it has none of your data.  Your
    :func:`jobprof_report_sections` reads it back with ``profile.facts(<plugin name>, device,
    <this function>)``, which calls the function itself where no facts were gathered.  Keep it
    small (aggregates, not records): a 1,000-rank summary holds every device's answer at once.

    Example::

        @hookimpl
        def jobprof_rank_facts(profile, device):
            temps = [r["celsius"] for r in profile.records("gpu_temp", device)]
            return {"max_c": max(temps), "samples": len(temps)} if temps else None
    """


@hookspec
def jobprof_report_sections(profile: Profile) -> Iterable[Section] | None:
    """Return tables describing a profile, for ``jobprof summary``, ``report`` and ``diff``.

    Called once per command with a :class:`~jobprof.plugin.Profile` (read-only view of a
    ``PROF_`` directory that follows the user's ``--rank`` / ``--iterations``).  Return
    :class:`~jobprof.plugin.Section` objects (each with a stable ``key`` and optional
    :class:`~jobprof.plugin.Finding` objects: numbered statements with their evidence), or None.

    Example::

        @hookimpl
        def jobprof_report_sections(profile):
            temps = [r["celsius"] for r in profile.records("gpu_temp")]
            hot = [Finding("gpu_hot", f"the GPU reached {max(temps)} C", {"max_c": max(temps)})]
            return [Section("GPU temperature", ["max"], [[max(temps)]], key="gpu_temp",
                            findings=hot)] if temps else None
    """


@hookspec
def jobprof_diff_tables(profile: Profile, device: int) -> Iterable[DiffTable] | None:
    """Return this plugin's tables for ``jobprof diff``: counts per key on one device.

    Called once per device wherever its facts are computed, as ``jobprof_rank_facts`` is: at the
    job's exit and by ``jobprof export`` (the tables are kept in the device's facts file, so
    ``jobprof diff`` reads no raw data), or by ``jobprof diff`` for a device without a valid facts
    file, with a :class:`~jobprof.plugin.Profile` of that device (it follows
    ``--rank`` / ``--iterations``).
    Return :class:`~jobprof.plugin.DiffTable` objects (each with a stable ``key``, its
    key ``columns`` and one :class:`~jobprof.plugin.DiffCount` per key: calls, time,
    optionally bytes and a per-iteration series), or None.  The core pools the ranks, normalises
    per iteration of one rank, compares A with B (``slower`` / ``faster`` / ``unchanged`` /
    ``new`` / ``gone``) and shows the table in the text and under ``key`` in ``--json``; a key
    belongs to the first plugin that returns it.  Return a table (``present=False``, no rows)
    on a device without your data, so the diff can say which side lacks it
    (``absent_note``, ``one_sided_note``).  Report files you cannot read with
    ``profile.problem(text)``.

    Example::

        @hookimpl
        def jobprof_diff_tables(profile, device):
            calls, ns = {}, {}
            for r in profile.records("gpu_kernels", device):
                calls[r["name"]] = calls.get(r["name"], 0) + 1
                ns[r["name"]] = ns.get(r["name"], 0) + r["end_ns"] - r["start_ns"]
            return [DiffTable("kernels", "Kernels per iteration of one rank ({shown} of {total})",
                              ["kernel"], ["kernel"],
                              {(k,): DiffCount(calls[k], ns[k]) for k in calls}, present=bool(calls),
                              one_sided_note="only one side has kernel data")]
    """


@hookspec
def jobprof_breakdown_sources() -> Iterable[PartSource] | None:
    """Name the parts of the iteration breakdown this plugin measures.

    Called by ``jobprof summary`` / ``report`` once per command.  Return
    :class:`~jobprof.plugin.PartSource` objects, one per part of
    ``jobprof.analysis.breakdown.PARTS`` whose spans this plugin reports (through
    ``jobprof_iteration_spans``), or None.  When such a part is N/A on a rank, the summary's
    "missing" list says why, with the plugin's name: "<plugin> was off" when the run did not
    have it active (``info.json``), else "<plugin> was on but <unseen>".

    Example::

        @hookimpl
        def jobprof_breakdown_sources():
            return [PartSource("data_wait", "no DataLoader was seen")]
    """
