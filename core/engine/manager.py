"""Finds plugins through entry points, loads them, and calls hooks through pluggy with failure isolation.

:class:`PluginManager` is a ``pluggy.PluginManager`` (the model is conda's
``CondaPluginManager``): hooks are called by pluggy (``self.hook.jobprof_x(...)``), so pluggy's
semantics hold (``firstresult``, new-style ``wrapper=True`` implementations).  Each registered
implementation runs behind an isolating proxy that :meth:`PluginManager._hookexec` hands to
pluggy instead of the raw ``HookImpl``: a plugin that raises inside a hook (``SystemExit``
included) or returns something the hook's contract does not allow (:data:`CHECKS`) is disabled
and reported by name, once, and its proxy answers None; nothing it does can stop the job or
the other plugins.  A plain implementation's proxy returns an :class:`~jobprof.plugin.hookspec.Answer`
(plugin name, checked value), so the typed methods (one per hook, tox 4 style: :meth:`writers`,
:meth:`aic_metrics`, ...) know who answered what.

Order: pluggy's own.  pluggy calls ``tryfirst`` implementations, then plain ones, then
``trylast`` ones, the last registered first within each tier.  jobprof registers every plain
implementation of a built-in plugin ``tryfirst`` (:meth:`parse_hookimpl_opts`) and ignores
``tryfirst`` on a third-party plain implementation: built-ins always run first (they claim
their streams and files first and answer a ``firstresult`` hook first), then third-party
plugins, the last loaded first (pluggy's override order), ``trylast`` ones last.

Also disabled at registration: a plugin that fails to import, implements a hook that does not
exist (``check_pending``), or uses an old-style ``hookwrapper=True``.  Name clashes: when two
distributions register the same entry-point name, the built-in one (distribution ``jobprof``)
wins, otherwise the first on ``sys.path``; the other is failed.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import threading
import traceback
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, cast

import attrs
import pluggy

from jobprof.engine import moved
from jobprof.plugin import hookspec
from jobprof.plugin.hookspec import Answer
from jobprof.plugin.records import ITERATION_STREAM, OP_MEMORY_STREAM, OPS_STREAM, PROFILER_STREAM
from jobprof.plugin.reporter import REPORTER, Reporter
from jobprof.plugin.results import DiffTable, Section
from jobprof.plugin.values import MetricSet, PartSource, PluginRecord, WriterSpec

if TYPE_CHECKING:
    from jobprof.plugin.timeline import Timeline
    from jobprof.plugin.values import Config, ExportContext, Iteration, Streams
    from jobprof.plugin.views import Profile

GROUP = "jobprof"
DISABLE_ENV = "JOBPROF_DISABLE_PLUGINS"
BUILTIN_DIST = "jobprof"
#: the core's own raw streams (iterations, operators, jobprof's own time); no plugin may write them
CORE_STREAMS = frozenset({ITERATION_STREAM, OPS_STREAM, PROFILER_STREAM, OP_MEMORY_STREAM})
_STREAM_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_HOOKS = frozenset(n for n in dir(hookspec) if n.startswith("jobprof_"))
_HANDOVER = "jobprof_iteration_end"

HookImpl = pluggy.HookImpl


class ContractError(Exception):
    """A hook returned something its specification does not allow."""


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


def disabled_names(environ: os._Environ | Mapping[str, str] = os.environ) -> set[str]:
    return {n.strip() for n in environ.get(DISABLE_ENV, "").split(",") if n.strip()}


@attrs.frozen
class _Isolated:
    """What pluggy's ``_multicall`` reads of a ``HookImpl``, with ``function`` replaced by the
    isolating proxy (conda's ``_HookImplWrapper`` idea, built once per implementation)."""

    impl: HookImpl
    function: Callable[..., Any]

    @property
    def argnames(self) -> tuple[str, ...]:
        return self.impl.argnames

    @property
    def kwargnames(self) -> tuple[str, ...]:
        return getattr(self.impl, "kwargnames", ())

    @property
    def wrapper(self) -> bool:
        return self.impl.wrapper

    @property
    def hookwrapper(self) -> bool:
        return self.impl.hookwrapper

    @property
    def plugin_name(self) -> str:
        return self.impl.plugin_name

    @property
    def plugin(self) -> object:
        return self.impl.plugin


@attrs.frozen
class _Plan:
    """Derived state, rebuilt when :attr:`PluginManager._version` moves (one explicit counter,
    bumped on every register, unregister, failure, deactivation and record change)."""

    version: int
    #: :meth:`PluginManager.active` as a frozenset (asked for on every iteration)
    active: frozenset[str]
    #: jobprof_iteration_end's callers in pluggy's order, ``(plugin, caller(session, iteration))``;
    #: None when an active plugin wraps that hook: then it goes through pluggy
    handover: tuple[tuple[str, Callable[[Any, Any], Any]], ...] | None


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, with isolation, result contracts and what jobprof knows about each
    plugin's health."""

    def __init__(self, reporter: Reporter = REPORTER) -> None:
        super().__init__(hookspec.PROJECT)
        self.add_hookspecs(hookspec)
        self.reporter = reporter
        self._records: dict[str, PluginRecord] = {}
        self._seen: set[tuple[str, str]] = set()  # (entry-point name, distribution) loaded
        self._streams: dict[str, str] = {}  # raw stream -> plugin that returns it
        # (writer name, extension) -> plugin; the master timeline is the core's own
        self._files: dict[tuple[str, str], str] = {("msprof", "json"): "jobprof (core)"}
        self._lock = threading.RLock()  # fail() also runs on the sink thread
        self._inactive: frozenset[str] = frozenset()  # configured out of this run (deactivate)
        self._valid_streams: set[tuple[str, tuple]] = set()  # (plugin, stream names) checked
        #: the isolating proxy of every registered implementation (replaced, never mutated)
        self._isolated: dict[HookImpl, _Isolated] = {}
        self._version = 0
        self._plan = _Plan(-1, frozenset(), None)
        self._registering_builtin = False  # read by parse_hookimpl_opts during register()
        #: set by the session: cleanup to run for a plugin (by name) before it is unregistered
        self.on_fail: Callable[[str], None] | None = None

    def _changed(self) -> None:
        self._version += 1

    # -- loading ---------------------------------------------------------------------------
    def load_entry_points(self, environ: os._Environ | Mapping[str, str] = os.environ) -> None:
        """Load every ``jobprof`` entry point not listed in JOBPROF_DISABLE_PLUGINS.

        Built-ins first, then the others by name (``sys.path`` order within a name): this is
        the order hooks run in.  Blocked plugins are never imported.  Calling it again loads
        nothing twice.
        """
        moved.install()  # plugins written against the old module paths still import
        blocked = disabled_names(environ)
        try:
            known: dict[int, tuple[str, str]] = {}
            found = [(ep, *_dist_of(ep, known)) for ep in entry_points(group=GROUP)]
        except Exception as exc:  # unreadable metadata somewhere on sys.path
            self.reporter.warning(f"cannot list plugins: {_short_error(exc)}")
            return
        # stable sort: built-ins first, then by name, then sys.path order
        found.sort(key=lambda item: (item[1] != BUILTIN_DIST, item[0].name))
        for ep, dist, version in found:
            if (ep.name, dist) in self._seen:
                continue
            self._seen.add((ep.name, dist))
            record = PluginRecord(ep.name, dist, version, "active")
            holder = self._records.get(ep.name)
            if ep.name in blocked:
                key = ep.name if holder is None else f"{ep.name} ({dist})"
                self._set_record(key, attrs.evolve(record, status="disabled",
                                                   error=f"listed in {DISABLE_ENV}"))
                continue
            if holder is not None:
                key = f"{ep.name} ({dist})"
                self._set_record(key, record)
                self.fail(key, f"the name '{ep.name}' is already taken by "
                               f"{holder.distribution} {holder.version}".rstrip())
                continue
            self._set_record(ep.name, record)
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:
                self.fail(ep.name, f"cannot import '{ep.value}': {_short_error(exc)}")
                continue
            try:
                self.register(plugin, ep.name)
            except (Exception, SystemExit) as exc:
                self.fail(ep.name, str(exc) if isinstance(exc, ValueError) else _short_error(exc))

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        """pluggy's options, with built-ins first: a built-in plugin's plain implementations
        are ``tryfirst``; a third-party plain implementation cannot be (its ``trylast`` stays).
        Wrappers keep their own options."""
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None or opts.get("wrapper") or opts.get("hookwrapper"):
            return opts
        if self._registering_builtin:
            return cast(pluggy.HookimplOpts, {**opts, "tryfirst": True, "trylast": False})
        return cast(pluggy.HookimplOpts, {**opts, "tryfirst": False})

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register one plugin object; a hook with no matching spec fails it (check_pending).

        Raises ValueError with a one-line reason when the plugin cannot be registered (the
        caller then fails it); nothing of it stays registered.
        """
        name = name or self.get_canonical_name(plugin)
        if self.has_plugin(name):
            raise ValueError(f"a plugin named '{name}' is already registered")
        if self.get_name(plugin) is not None:
            raise ValueError(f"the same object is already registered as '{self.get_name(plugin)}'")
        record = self._records.get(name)
        self._registering_builtin = record is not None and record.distribution == BUILTIN_DIST
        try:
            super().register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise ValueError(_validation_reason(exc)) from None
        finally:
            self._registering_builtin = False
        callers = self.get_hookcallers(plugin) or []
        try:
            self.check_pending()
        except pluggy.PluginValidationError:
            unknown = sorted({c.name for c in callers if not c.has_spec()})
            self.unregister(name=name)
            raise ValueError(f"implements unknown hook(s): {_suggest(unknown)}") from None
        old_style = sorted({c.name for c in callers for impl in c.get_hookimpls()
                            if impl.plugin is plugin and impl.hookwrapper})
        if old_style:
            self.unregister(name=name)
            raise ValueError(f"old-style hook wrappers (hookwrapper=True) are not supported, "
                             f"use wrapper=True: {', '.join(old_style)}")
        isolated = dict(self._isolated)
        for caller in callers:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    isolated[impl] = _Isolated(impl, self._isolate(caller, impl))
        self._isolated = isolated
        if name not in self._records:
            self._set_record(name, PluginRecord(name, "(local)", "", "active"))
        self._changed()
        implemented = {c.name for c in callers}
        for hook in sorted(_HOOKS - implemented):
            if callable(getattr(plugin, hook, None)):  # a forgotten @hookimpl: warn, keep the rest
                self.reporter.warning(f"plugin '{name}': {hook} is not marked with @hookimpl "
                                      "and is never called")
        return name

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any | None:
        removed = super().unregister(plugin, name)
        if removed is not None:
            self._isolated = {impl: iso for impl, iso in self._isolated.items() if impl.plugin is not removed}
            self._changed()
        return removed

    def fail(self, name: str, error: str) -> None:
        """Disable a plugin for the rest of the process and say so once (idempotent).

        During a session, the plugin's own ``jobprof_session_end`` runs first (best effort,
        through :attr:`on_fail`), so collectors it installed do not outlive it.
        """
        with self._lock:
            if self.get_plugin(name) is not None:
                if self.on_fail is not None:
                    try:
                        self.on_fail(name)
                    except BaseException:
                        pass  # it already failed once; its cleanup may fail too
                self.unregister(name=name)
            record = self._records.get(name)
            if record is not None and record.status == "failed":
                return  # the first error is the one reported
            if record is not None:
                self._set_record(name, attrs.evolve(record, status="failed", error=error))
        self.reporter.warning(f"plugin '{name}' disabled: {error}")

    def deactivate(self, name: str) -> None:
        """Leave a plugin out of this run's session hooks (its ``jobprof_configure`` said False).

        It stays loaded: ``jobprof_writers`` and ``jobprof_aic_metrics`` still reach it."""
        with self._lock:
            self._inactive = self._inactive | {name}
            self._changed()

    def hookimpl(self, plugin: str, hook_name: str) -> HookImpl | None:
        """The plugin's own (plain) implementation of one hook, as pluggy holds it; None if it
        has none.  ``function`` is the plugin's, not isolated; ``argnames`` what it accepts."""
        caller = getattr(self.hook, hook_name, None)
        if caller is None:
            return None
        return next((impl for impl in caller.get_hookimpls()
                     if impl.plugin_name == plugin and not impl.wrapper), None)

    # -- calling ---------------------------------------------------------------------------
    def _hookexec(self, hook_name: str, methods: Sequence[HookImpl], kwargs: Mapping[str, object],
                  firstresult: bool) -> object | list[object]:
        # pluggy's single entry point for every call: it runs the isolating proxies instead
        isolated = self._isolated
        proxies = cast("Sequence[HookImpl]", [isolated.get(m, m) for m in methods])
        return super()._hookexec(hook_name, proxies, kwargs, firstresult)

    def _isolate(self, caller: pluggy.HookCaller, impl: HookImpl) -> Callable[..., Any]:
        """The proxy pluggy calls instead of ``impl.function``."""
        hook_name, name, function = caller.name, impl.plugin_name, impl.function
        if impl.wrapper:
            firstresult = bool(caller.spec and caller.spec.opts.get("firstresult"))
            return self._isolate_wrapper(hook_name, name, function, firstresult)
        check = CHECKS.get(hook_name)

        def isolated(*args: Any, **kwargs: Any) -> Answer | None:
            try:
                result = function(*args, **kwargs)
                if result is None:
                    return None
                return Answer(name, check(self, name, result) if check else result)
            except ContractError as exc:
                self.fail(name, f"{hook_name} returned {exc}")
            except (Exception, SystemExit) as exc:  # a generator raising while listed, too
                self.fail(name, f"{hook_name} raised {_short_error(exc)}{_where(exc)}")
            return None

        return isolated

    def _isolate_wrapper(self, hook_name: str, name: str, function: Callable[..., Any],
                         firstresult: bool) -> Callable[..., Generator[None, Any, Any]]:
        """A new-style wrapper behind a wrapper: what the plugin's generator raises, or a
        result not shaped like the hook's (a list of Answers; one Answer or None for a
        firstresult hook), fails the plugin and lets the inner result through unchanged."""
        check = CHECKS.get(hook_name)

        def isolated(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
            try:
                teardown = function(*args, **kwargs)
                next(teardown)
            except StopIteration:
                self.fail(name, f"{hook_name} wrapper did not yield")
                return (yield)
            except (Exception, SystemExit) as exc:
                self.fail(name, f"{hook_name} raised {_short_error(exc)}{_where(exc)}")
                return (yield)
            try:
                inner = yield
            except BaseException:  # only a core bug or KeyboardInterrupt gets here
                teardown.close()
                raise
            try:
                teardown.send(inner)
            except StopIteration as stop:
                try:
                    return _wrapped_result(self, name, stop.value, inner, firstresult, check)
                except ContractError as exc:
                    self.fail(name, f"{hook_name} wrapper returned {exc}")
                except (Exception, SystemExit) as exc:
                    self.fail(name, f"{hook_name} raised {_short_error(exc)}{_where(exc)}")
                return inner
            except (Exception, SystemExit) as exc:
                self.fail(name, f"{hook_name} raised {_short_error(exc)}{_where(exc)}")
                return inner
            teardown.close()
            self.fail(name, f"{hook_name} wrapper yielded twice")
            return inner

        return isolated

    def _answers(self, hook_name: str, only_active: bool, skip: Iterable[str] = (),
                 **kwargs: Any) -> list[tuple[str, Any]]:
        """One hook through pluggy, as ``(plugin, checked value)`` pairs in calling order; the
        plugins named in ``skip`` are not called."""
        answers = self._caller(hook_name, only_active, skip)(**kwargs)
        if answers is None:
            return []
        if isinstance(answers, Answer):  # a firstresult hook
            answers = [answers]
        return [(a.plugin, a.value) for a in answers if self.has_plugin(a.plugin)]

    def _caller(self, hook_name: str, only_active: bool, skip: Iterable[str] = ()) -> pluggy.HookCaller:
        """The hook without the inactive plugins (``only_active``) and those named in ``skip``."""
        names = [*(self._inactive if only_active else ()), *skip]
        left_out = [p for n in names if (p := self.get_plugin(n)) is not None]
        caller: pluggy.HookCaller = getattr(self.hook, hook_name)
        return self.subset_hook_caller(hook_name, left_out) if left_out else caller

    # -- one typed method per hook (tox 4 style), in lifecycle order --------------------------
    def options_schemas(self) -> list[tuple[str, Mapping[str, Any]]]:
        """``jobprof_options_schema`` of every loaded plugin: ``(plugin, fragment)`` pairs."""
        return self._answers("jobprof_options_schema", False)

    def configure(self, config: Config) -> list[tuple[str, bool]]:
        """``jobprof_configure(config)`` of every loaded plugin: ``(plugin, answer)`` pairs;
        the caller :meth:`deactivate`\\ s those that answered False."""
        return self._answers("jobprof_configure", False, config=config)

    def session_start(self, session: Any) -> None:
        """``jobprof_session_start(session)`` on every active plugin."""
        self._caller("jobprof_session_start", True)(session=session)

    def iteration_end(self, session: Any, iteration: Iteration) -> list[tuple[str, Mapping[str, Any]]]:
        """``jobprof_iteration_end`` on every active plugin: the training thread's hot path.

        Returns ``(plugin, {stream: records})`` pairs, streams checked and owned.  The same
        order, isolation and contract as a call through pluggy, without ``_multicall``'s
        generic costs: the plan (positional callers, built once per :attr:`_version`) calls
        the implementations directly, unless some active plugin wraps the hook.
        """
        plan = self._current().handover
        if plan is None:
            return self._answers(_HANDOVER, True, session=session, iteration=iteration)
        out = []
        for name, caller in plan:
            try:
                result = caller(session, iteration)
                if result is not None:
                    out.append((name, _check_streams(self, name, result)))
            except ContractError as exc:
                self.fail(name, f"{_HANDOVER} returned {exc}")
            except (Exception, SystemExit) as exc:
                self.fail(name, f"{_HANDOVER} raised {_short_error(exc)}{_where(exc)}")
        return out

    def session_end(self, session: Any) -> None:
        """``jobprof_session_end(session)`` on every active plugin."""
        self._caller("jobprof_session_end", True)(session=session)

    def writers(self, config: Config | None) -> list[tuple[str, list[WriterSpec]]]:
        """``jobprof_writers(config)`` of every loaded plugin that takes part in a run with
        ``config``: those whose ``jobprof_configure(config)`` answers False are not asked (asked
        here, not taken from this process's session: ``jobprof export`` configures nothing and
        each device has its own options).  ``config`` None (``jobprof plugins``): every plugin."""
        off = [] if config is None else [name for name, on in self.configure(config) if on is False]
        return self._answers("jobprof_writers", False, skip=off, config=config)

    def aic_metrics(self, name: str | None) -> tuple[str, MetricSet] | None:
        """The plugin answering ``jobprof_aic_metrics(name)`` first (a firstresult hook: the
        others are not called; built-ins are asked first), and its set; None when ``name`` is
        None or nobody answers."""
        if not name:
            return None
        answers = self._answers("jobprof_aic_metrics", False, name=name)
        return answers[0] if answers else None

    #: the name the exporter and benchmarks know :meth:`aic_metrics` by
    metric_set = aic_metrics

    def timeline(self, ctx: ExportContext, timeline: Timeline) -> None:
        """``jobprof_timeline(ctx, timeline)`` on every active plugin."""
        self._caller("jobprof_timeline", True)(ctx=ctx, timeline=timeline)

    def iteration_spans(self, iteration: Iteration,
                        streams: Streams) -> list[tuple[str, dict[str, list[tuple[int, int]]]]]:
        """``jobprof_iteration_spans`` of every loaded plugin: ``(plugin, {category: spans})``."""
        return self._answers("jobprof_iteration_spans", False, iteration=iteration, streams=streams)

    def iteration_facts(self, iteration: Iteration, streams: Streams) -> list[tuple[str, Any]]:
        """``jobprof_iteration_facts`` of every loaded plugin: ``(plugin, digest)``, as JSON
        gives it back."""
        return self._answers("jobprof_iteration_facts", False, iteration=iteration, streams=streams)

    def rank_facts(self, profile: Profile, device: int) -> list[tuple[str, Any]]:
        """``jobprof_rank_facts(profile, device)`` of every loaded plugin: ``(plugin, facts)``,
        the facts as JSON gives them back (tuples read as lists), whichever way they travel."""
        return self._answers("jobprof_rank_facts", False, profile=profile, device=device)

    def report_sections(self, profile: Profile) -> list[tuple[str, list[Section]]]:
        """``jobprof_report_sections(profile)`` of every loaded plugin: ``(plugin, sections)``."""
        return self._answers("jobprof_report_sections", False, profile=profile)

    # -- derived state ---------------------------------------------------------------------
    def _current(self) -> _Plan:
        plan = self._plan
        if plan.version == self._version:
            return plan
        version = self._version  # read first: a change meanwhile makes the next call rebuild
        active = frozenset(self.active())
        caller: pluggy.HookCaller = getattr(self.hook, _HANDOVER)
        impls = [i for i in reversed(caller.get_hookimpls()) if i.plugin_name in active]  # pluggy's order
        handover = None if any(i.wrapper for i in impls) else tuple(
            (i.plugin_name, _positional(i.function, i.argnames, getattr(i, "kwargnames", ())))
            for i in impls)
        self._plan = plan = _Plan(version, active, handover)
        return plan

    def _set_record(self, name: str, record: PluginRecord) -> None:
        self._records[name] = record
        self._changed()

    # -- introspection ---------------------------------------------------------------------
    @property
    def inactive(self) -> frozenset[str]:
        """Plugins configured out of this run (read-only: change it with :meth:`deactivate`)."""
        return self._inactive

    def records(self) -> list[PluginRecord]:
        return list(self._records.values())

    def record(self, name: str) -> PluginRecord | None:
        return self._records.get(name)

    def update(self, name: str, **changes: Any) -> None:
        with self._lock:
            self._set_record(name, attrs.evolve(self._records[name], **changes))

    def is_active(self, name: str) -> bool:
        """True while the plugin is loaded, not failed, and took part in this run."""
        record = self._records.get(name)
        return record is not None and record.status == "active" and name not in self._inactive

    def stream_owner(self, stream: str) -> str | None:
        """The plugin whose jobprof_iteration_end returned ``stream`` (None: not seen yet)."""
        return self._streams.get(stream)

    def active(self) -> list[str]:
        return [n for n, r in self._records.items()
                if r.status == "active" and n not in self._inactive]

    def active_set(self) -> frozenset[str]:
        """:meth:`active` as a frozenset, cached (asked for on every iteration)."""
        return self._current().active

    def diff_tables(self, profile: Profile, device: int) -> list[tuple[str, list[DiffTable]]]:
        """``jobprof_diff_tables(profile, device)`` of every loaded plugin: ``(plugin, tables)``."""
        return self._answers("jobprof_diff_tables", False, profile=profile, device=device)

    def breakdown_sources(self) -> list[tuple[str, list[PartSource]]]:
        """``jobprof_breakdown_sources()`` of every loaded plugin: ``(plugin, sources)``."""
        return self._answers("jobprof_breakdown_sources", False)


# -- result contracts ----------------------------------------------------------------------
def _check_schema(manager: PluginManager, plugin: str, result: Any) -> Mapping[str, Any]:
    from jobprof.engine import options

    if not isinstance(result, Mapping):
        raise ContractError(f"{type(result).__name__}, not a JSON Schema object")
    problem = options.fragment_problem(result)
    if problem:
        raise ContractError(problem)
    return result


def _check_streams(manager: PluginManager, plugin: str, result: Any) -> Mapping[str, list]:
    # per step on the training thread: a dict of streams that passed before costs no more than
    # this (no ABC isinstance: that was a third of this function's time, issue 48)
    if type(result) is dict:
        known = (plugin, tuple(result))
        if known in manager._valid_streams and all(type(r) is list or callable(r) for r in result.values()):
            return result
    elif not isinstance(result, Mapping):
        raise ContractError(f"{type(result).__name__}, not {{stream: [records]}}")
    known = (plugin, tuple(result))
    with manager._lock:
        for stream, records in result.items():
            if not isinstance(stream, str) or not _STREAM_RE.match(stream) or stream in CORE_STREAMS:
                raise ContractError(f"stream name {stream!r} (must match {_STREAM_RE.pattern}, "
                                    f"not one of the core's {sorted(CORE_STREAMS)})")
            if not isinstance(records, list) and not callable(records):
                raise ContractError(f"{type(records).__name__} for stream '{stream}', not a list "
                                    "(or a callable returning one)")
            owner = manager._streams.setdefault(stream, plugin)
            if owner != plugin:
                raise ContractError(f"stream '{stream}', which belongs to plugin '{owner}'")
        manager._valid_streams.add(known)
    return result


def _check_writers(manager: PluginManager, plugin: str, result: Any) -> list[WriterSpec]:
    specs = _as_list(result, WriterSpec)
    with manager._lock:
        for spec in specs:
            owner = manager._files.setdefault((spec.name, spec.extension), plugin)
            if owner != plugin:
                raise ContractError(f"writer '{spec.name}.{spec.extension}', which belongs to "
                                    f"plugin '{owner}'")
    return specs


def _check_metrics(manager: PluginManager, plugin: str, result: Any) -> MetricSet:
    if not isinstance(result, MetricSet):
        raise ContractError(f"{type(result).__name__}, not a MetricSet")
    return result


def _check_sections(manager: PluginManager, plugin: str, result: Any) -> list[Section]:
    return _as_list(result, Section)


def _check_spans(manager: PluginManager, plugin: str, result: Any) -> dict[str, list[tuple[int, int]]]:
    if not isinstance(result, Mapping):
        raise ContractError(f"{type(result).__name__}, not a mapping of category to spans")
    out = {}
    for category, spans in result.items():
        try:
            out[str(category)] = [(int(a), int(b)) for a, b in spans]
        except (TypeError, ValueError) as exc:
            raise ContractError(f"spans of {category!r} are not (start_ns, end_ns) pairs ({exc})") from exc
    return out


def _as_list(result: Any, kind: type) -> list:
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, Iterable):
        raise ContractError(f"{type(result).__name__}, not a list of {kind.__name__}")
    items = list(result)  # a generator runs here, inside the isolation
    wrong = [type(item).__name__ for item in items if not isinstance(item, kind)]
    if wrong:
        raise ContractError(f"{wrong[0]} in a list of {kind.__name__}")
    return items


def _check_facts(manager: PluginManager, plugin: str, result: Any) -> Any:
    # the same value in this process, a worker's and a facts file: what JSON gives back
    try:
        return json.loads(json.dumps(result, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ContractError(f"facts that are not JSON ({exc})") from None


#: result validators by hook: they raise ContractError, which fails the plugin by name
CHECKS: dict[str, Callable[[PluginManager, str, Any], Any]] = {
    "jobprof_options_schema": _check_schema,
    "jobprof_iteration_end": _check_streams,
    "jobprof_writers": _check_writers,
    "jobprof_report_sections": _check_sections,
    "jobprof_rank_facts": _check_facts,
    "jobprof_iteration_facts": _check_facts,
    "jobprof_iteration_spans": _check_spans,
    "jobprof_aic_metrics": _check_metrics,
    "jobprof_diff_tables": lambda manager, plugin, result: _as_list(result, DiffTable),
    "jobprof_breakdown_sources": lambda manager, plugin, result: _as_list(result, PartSource),
}


def _wrapped_result(manager: PluginManager, wrapper: str, result: Any, inner: Any, firstresult: bool,
                    check: Callable[[PluginManager, str, Any], Any] | None) -> Any:
    """What a wrapper returned, checked: the inner Answers it kept (any order) and Answers of
    its own, whose values pass the hook's contract in the wrapper's name."""
    if firstresult:
        if result is None or result is inner:
            return result
        answers = [result]
    elif isinstance(result, list):
        answers = result
    else:
        raise ContractError(f"{type(result).__name__}, not a list of Answer")
    kept = {id(a) for a in (inner if isinstance(inner, list) else [inner])}
    out = []
    for answer in answers:
        if not isinstance(answer, Answer):
            raise ContractError(f"{type(answer).__name__}, not an Answer")
        if id(answer) not in kept:
            if answer.plugin != wrapper:
                raise ContractError(f"an answer in the name of plugin '{answer.plugin}'")
            answer = Answer(wrapper, check(manager, wrapper, answer.value) if check else answer.value)
        out.append(answer)
    return out[0] if firstresult else out


# -- helpers -------------------------------------------------------------------------------
def _positional(function: Callable, argnames: tuple[str, ...],
                kwargnames: tuple[str, ...] = ()) -> Callable[[Any, Any], Any]:
    """A ``(session, iteration)`` caller of an implementation that declares ``argnames``
    (and, pluggy >= 1.6, keyword parameters with defaults ``kwargnames``)."""
    names = tuple(n for n in kwargnames if n in ("session", "iteration"))  # others: not given
    if not names:
        if argnames == ("session", "iteration"):
            return function
        if argnames == ("iteration",):
            return lambda session, iteration: function(iteration)
        if argnames == ("session",):
            return lambda session, iteration: function(session)
        if not argnames:
            return lambda session, iteration: function()

    def generic(session: Any, iteration: Any) -> Any:
        given = {"session": session, "iteration": iteration}
        return function(*[given[n] for n in argnames], **{n: given[n] for n in names})

    return generic


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


def _suggest(unknown: list[str]) -> str:
    out = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(_HOOKS), n=1)
        out.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return ", ".join(out) or "?"


def _validation_reason(exc: pluggy.PluginValidationError) -> str:
    """pluggy's multi-line message, as one line: the hook definition and what is wrong."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    definition = next((ln.split(": ", 1)[1] for ln in lines
                       if ln.startswith("hookimpl definition")), "")
    reason = lines[-1] if lines else type(exc).__name__
    return f"{definition}: {reason}" if definition else reason


def _dist_of(ep: EntryPoint, known: dict[int, tuple[str, str]]) -> tuple[str, str]:
    """The entry point's distribution name and version; ``known`` (by distribution object: the
    entry points of one distribution share it) keeps it to one read of each METADATA file, which
    the email parser reads (two per plugin took 70 ms of a profiled job's start-up)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "(unknown)", ""
    found = known.get(id(dist))
    if found is None:
        try:
            metadata = dist.metadata
            found = (metadata["Name"] or "(unknown)", metadata["Version"] or "")
        except Exception:
            found = ("(unknown)", "")
        known[id(dist)] = found
    return found
