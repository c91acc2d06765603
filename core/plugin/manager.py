"""Finds plugins through entry points, loads them, and calls hooks with failure isolation.

Built-in plugins come in through the same ``jobprof`` entry-point group as third-party ones.
A plugin that fails to import, implements a hook that does not exist (``check_pending``),
raises inside a hook (``SystemExit`` included) or returns something the hook's contract does
not allow is disabled and reported by name, once; nothing it does can stop the job.

Name clashes: when two distributions register the same entry-point name, the built-in one
(distribution ``jobprof``) wins, otherwise the first on ``sys.path``; the other is failed.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import attrs
import pluggy

from jobprof.files.rawstore import ITERATION_STREAM, PROFILER_STREAM
from jobprof.ops.opcapture import STREAM as OPS_STREAM
from jobprof.plugin import hookspec
from jobprof.plugin.reporter import REPORTER, Reporter
from jobprof.plugin.types import MetricSet, PluginRecord, Section, WriterSpec

GROUP = "jobprof"
DISABLE_ENV = "JOBPROF_DISABLE_PLUGINS"
BUILTIN_DIST = "jobprof"
#: the core's own raw streams (iterations, operators); no plugin may write them
CORE_STREAMS = frozenset({ITERATION_STREAM, OPS_STREAM, PROFILER_STREAM})
_STREAM_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_HOOKS = frozenset(n for n in dir(hookspec) if n.startswith("jobprof_"))


class ContractError(Exception):
    """A hook returned something its specification does not allow."""


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


def disabled_names(environ: os._Environ | Mapping[str, str] = os.environ) -> set[str]:
    return {n.strip() for n in environ.get(DISABLE_ENV, "").split(",") if n.strip()}


class PluginManager:
    """The pluggy manager plus what jobprof knows about each plugin's health."""

    def __init__(self, reporter: Reporter = REPORTER) -> None:
        self.pm = pluggy.PluginManager(hookspec.PROJECT)
        self.pm.add_hookspecs(hookspec)
        self.reporter = reporter
        self._records: dict[str, PluginRecord] = {}
        self._seen: set[tuple[str, str]] = set()  # (entry-point name, distribution) loaded
        self._streams: dict[str, str] = {}  # raw stream -> plugin that returns it
        # (writer name, extension) -> plugin; the master timeline is the core's own
        self._files: dict[tuple[str, str], str] = {("msprof", "json"): "jobprof (core)"}
        self._lock = threading.RLock()  # fail() also runs on the sink thread
        self.inactive: set[str] = set()
        self._valid_streams: set[tuple[str, tuple]] = set()  # (plugin, stream names) checked
        self._impl_cache: dict[tuple[str, bool, int], list[tuple[str, Callable, tuple]]] = {}
        #: set by the session: cleanup to run on a plugin object before it is unregistered
        self.on_fail: Callable[[object], None] | None = None

    # -- loading ---------------------------------------------------------------------------
    def load_entry_points(self, environ: os._Environ | Mapping[str, str] = os.environ) -> None:
        """Load every ``jobprof`` entry point not listed in JOBPROF_DISABLE_PLUGINS.

        Blocked plugins are never imported.  Calling it again loads nothing twice.
        """
        blocked = disabled_names(environ)
        try:
            found = [(ep, *_dist_of(ep)) for ep in entry_points(group=GROUP)]
        except Exception as exc:  # unreadable metadata somewhere on sys.path
            self.reporter.warning(f"cannot list plugins: {_short_error(exc)}")
            return
        # stable sort: built-ins first within a name, then sys.path order
        found.sort(key=lambda item: (item[0].name, item[1] != BUILTIN_DIST))
        for ep, dist, version in found:
            if (ep.name, dist) in self._seen:
                continue
            self._seen.add((ep.name, dist))
            record = PluginRecord(ep.name, dist, version, "active")
            holder = self._records.get(ep.name)
            if ep.name in blocked:
                key = ep.name if holder is None else f"{ep.name} ({dist})"
                self._records[key] = attrs.evolve(record, status="disabled",
                                                  error=f"listed in {DISABLE_ENV}")
                continue
            if holder is not None:
                key = f"{ep.name} ({dist})"
                self._records[key] = record
                self.fail(key, f"the name '{ep.name}' is already taken by "
                               f"{holder.distribution} {holder.version}".rstrip())
                continue
            self._records[ep.name] = record
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:
                self.fail(ep.name, f"cannot import '{ep.value}': {_short_error(exc)}")
                continue
            try:
                self.register(plugin, ep.name)
            except (Exception, SystemExit) as exc:
                self.fail(ep.name, str(exc) if isinstance(exc, ValueError) else _short_error(exc))

    def register(self, plugin: object, name: str) -> None:
        """Register one plugin object; a hook with no matching spec fails it (check_pending).

        Raises ValueError with a one-line reason when the plugin cannot be registered (the
        caller then fails it); nothing of it stays registered.
        """
        self._impl_cache.clear()
        if self.pm.has_plugin(name):
            raise ValueError(f"a plugin named '{name}' is already registered")
        if self.pm.get_name(plugin) is not None:
            raise ValueError(f"the same object is already registered as '{self.pm.get_name(plugin)}'")
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise ValueError(_validation_reason(exc)) from None
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError:
            unknown = sorted({c.name for c in self.pm.get_hookcallers(plugin) or [] if not c.has_spec()})
            self.pm.unregister(name=name)
            raise ValueError(f"implements unknown hook(s): {_suggest(unknown)}") from None
        wrappers = sorted({c.name for c in self.pm.get_hookcallers(plugin) or []
                           for impl in c.get_hookimpls()
                           if impl.plugin is plugin and (impl.wrapper or impl.hookwrapper)})
        if wrappers:  # call() runs implementations one by one: a wrapper would never wrap
            self.pm.unregister(name=name)
            raise ValueError(f"hook wrappers are not supported: {', '.join(wrappers)}")
        self._records.setdefault(name, PluginRecord(name, "(local)", "", "active"))
        implemented = {c.name for c in self.pm.get_hookcallers(plugin) or []}
        for hook in sorted(_HOOKS - implemented):
            if callable(getattr(plugin, hook, None)):  # a forgotten @hookimpl: warn, keep the rest
                self.reporter.warning(f"plugin '{name}': {hook} is not marked with @hookimpl "
                                      "and is never called")

    def fail(self, name: str, error: str) -> None:
        """Disable a plugin for the rest of the process and say so once (idempotent).

        During a session, the plugin's own ``jobprof_session_end`` runs first (best effort), so
        collectors it installed do not outlive it.
        """
        with self._lock:
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                if self.on_fail is not None:
                    try:
                        self.on_fail(plugin)
                    except BaseException:
                        pass  # it already failed once; its cleanup may fail too
                self.pm.unregister(name=name)
                self._impl_cache.clear()
            record = self._records.get(name)
            if record is not None and record.status == "failed":
                return  # the first error is the one reported
            if record is not None:
                self._records[name] = attrs.evolve(record, status="failed", error=error)
            self._impl_cache.clear()
        self.reporter.warning(f"plugin '{name}' disabled: {error}")

    # -- calling ---------------------------------------------------------------------------
    def _impls(self, hook_name: str, only_active: bool) -> list[tuple[str, Callable, tuple]]:
        # cached: jobprof_iteration_end goes through here on the training thread every step;
        # registering or failing a plugin, or changing `inactive`, gives a new key / clears it
        key = (hook_name, only_active, len(self.inactive))
        impls = self._impl_cache.get(key)
        if impls is None:
            caller = getattr(self.pm.hook, hook_name)
            impls = [(impl.plugin_name, impl.function, impl.argnames)
                     for impl in reversed(caller.get_hookimpls())  # pluggy's own calling order
                     if not (only_active and impl.plugin_name in self.inactive)]
            self._impl_cache[key] = impls
        return impls

    def call(self, hook_name: str, only_active: bool = False,
             **kwargs: Any) -> list[tuple[str, Any]]:
        """Call one hook on every plugin, isolating failures.  Returns (plugin, result) pairs.

        Implementations get only the arguments they declare (pluggy semantics).  Results of
        the hooks in :data:`CHECKS` are validated and normalised (iterables become lists).
        """
        if hook_name not in _HOOKS:
            raise AttributeError(f"no hook named {hook_name!r}")
        returned = []
        for name, function, argnames in self._impls(hook_name, only_active):
            args = {arg: kwargs[arg] for arg in argnames}  # a KeyError here is a core bug
            try:
                returned.append((name, function(**args)))
            except (Exception, SystemExit) as exc:
                self.fail(name, f"{hook_name} raised {_short_error(exc)}{_where(exc)}")
        check = CHECKS.get(hook_name)
        checked: dict[int, Any] = {}
        # validate built-ins first, then in load order: the first plugin claims a stream/file
        order = range(len(returned)) if len(returned) < 2 else \
            sorted(range(len(returned)), key=lambda i: self._priority(returned[i][0]))
        for i in order:
            name, result = returned[i]
            if result is None or not self.pm.has_plugin(name):
                continue
            try:
                checked[i] = check(self, name, result) if check else result
            except ContractError as exc:
                self.fail(name, f"{hook_name} returned {exc}")
            except (Exception, SystemExit) as exc:  # e.g. a generator raising while listed
                self.fail(name, f"{hook_name} raised {_short_error(exc)}{_where(exc)}")
        return [(returned[i][0], checked[i]) for i in sorted(checked)
                if self.pm.has_plugin(returned[i][0])]

    def metric_set(self, name: str | None) -> tuple[str, MetricSet] | None:
        """The plugin answering ``jobprof_aic_metrics(name)`` first (built-ins first), and its
        set; None when ``name`` is None or nobody answers."""
        if not name:
            return None
        answers = self.call("jobprof_aic_metrics", name=name)
        answers.sort(key=lambda pair: self._priority(pair[0]))
        return answers[0] if answers else None

    def handover(self, session: Any, iteration: Any) -> list[tuple[str, Mapping[str, Any]]]:
        """``jobprof_iteration_end`` on every active plugin: the training thread's hot path.

        The same isolation and result contract as :meth:`call`, without its generic costs:
        the callers are built once (positional, only the arguments each plugin declares) and
        sorted so that built-ins claim streams first.
        """
        key = ("<handover>", True, len(self.inactive))
        plan = self._impl_cache.get(key)
        if plan is None:
            impls = sorted(self._impls("jobprof_iteration_end", True), key=lambda i: self._priority(i[0]))
            plan = self._impl_cache[key] = [(name, _positional(fn, argnames))  # type: ignore[assignment]
                                            for name, fn, argnames in impls]
        out = []
        for name, caller in plan:  # type: ignore[misc]
            try:
                result = caller(session, iteration)
                if result is not None:
                    out.append((name, _check_streams(self, name, result)))
            except ContractError as exc:
                self.fail(name, f"jobprof_iteration_end returned {exc}")
            except (Exception, SystemExit) as exc:
                self.fail(name, f"jobprof_iteration_end raised {_short_error(exc)}{_where(exc)}")
        return out

    def _priority(self, name: str) -> tuple[bool, int]:
        key = ("<priority>", name, len(self._records))  # asked per hook call: cached
        cached = self._impl_cache.get(key)  # type: ignore[arg-type]
        if cached is None:
            cached = self._impl_cache[key] = self._compute_priority(name)  # type: ignore[index]
        return cached  # type: ignore[return-value]

    def _compute_priority(self, name: str) -> tuple[bool, int]:
        record = self._records.get(name)
        order = list(self._records).index(name) if record is not None else len(self._records)
        return (record is None or record.distribution != BUILTIN_DIST, order)

    # -- introspection ---------------------------------------------------------------------
    def records(self) -> list[PluginRecord]:
        return list(self._records.values())

    def record(self, name: str) -> PluginRecord | None:
        return self._records.get(name)

    def update(self, name: str, **changes: Any) -> None:
        with self._lock:
            self._records[name] = attrs.evolve(self._records[name], **changes)
            self._impl_cache.clear()

    def is_active(self, name: str) -> bool:
        """True while the plugin is loaded, not failed, and took part in this run."""
        record = self._records.get(name)
        return record is not None and record.status == "active" and name not in self.inactive

    def stream_owner(self, stream: str) -> str | None:
        """The plugin whose jobprof_iteration_end returned ``stream`` (None: not seen yet)."""
        return self._streams.get(stream)

    def active(self) -> list[str]:
        return [n for n, r in self._records.items()
                if r.status == "active" and n not in self.inactive]

    def active_set(self) -> frozenset[str]:
        """:meth:`active` as a frozenset, cached (asked for on every iteration)."""
        key = ("<active>", False, len(self.inactive))
        cached = self._impl_cache.get(key)
        if cached is None:
            cached = self._impl_cache[key] = frozenset(self.active())  # type: ignore[assignment]
        return cached  # type: ignore[return-value]


# -- result contracts ----------------------------------------------------------------------
def _check_schema(manager: PluginManager, plugin: str, result: Any) -> Mapping[str, Any]:
    import jsonschema  # imported only where options are composed anyway

    if not isinstance(result, Mapping):
        raise ContractError(f"{type(result).__name__}, not a JSON Schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(dict(result))
    except jsonschema.SchemaError as exc:
        raise ContractError(f"an invalid JSON Schema: {exc.message}") from None
    dangling = _dangling_refs(result)
    if dangling:  # jsonschema would only fail when the key is used, inside options.load
        raise ContractError(f"a schema with $ref(s) that resolve to nothing: {', '.join(dangling)}")
    return result


def _dangling_refs(fragment: Mapping[str, Any]) -> list[str]:
    """``$ref``s of a fragment that do not resolve in the composed options schema."""
    from jobprof import schemas

    core = schemas.load("options")
    merged = {**core, "$defs": {**core.get("$defs", {}), **dict(fragment.get("$defs", {}))},
              "properties": {**core.get("properties", {}), **dict(fragment.get("properties", {}))}}
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(fragment)
    out = []
    for ref in refs:
        pointer = ref[len(core.get("$id", "")):] if ref.startswith(core.get("$id", "#")) else ref
        if not pointer.startswith("#") or _resolve(merged, pointer[1:]) is _MISSING:
            out.append(ref)
    return sorted(set(out))


_MISSING = object()


def _resolve(document: Any, pointer: str) -> Any:
    """JSON Pointer (RFC 6901, URI-fragment form) lookup; _MISSING when it leads nowhere."""
    from urllib.parse import unquote

    node = document
    for part in pointer.split("/")[1:] if pointer else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _check_streams(manager: PluginManager, plugin: str, result: Any) -> Mapping[str, list]:
    if not isinstance(result, Mapping):
        raise ContractError(f"{type(result).__name__}, not {{stream: [records]}}")
    known = (plugin, tuple(result))  # per step on the training thread: skip what passed before
    if known in manager._valid_streams and all(type(r) is list or callable(r) for r in result.values()):
        return result
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


#: result validators by hook: they raise ContractError, which fails the plugin by name
CHECKS: dict[str, Callable[[PluginManager, str, Any], Any]] = {
    "jobprof_options_schema": _check_schema,
    "jobprof_iteration_end": _check_streams,
    "jobprof_writers": _check_writers,
    "jobprof_report_sections": _check_sections,
    "jobprof_iteration_spans": _check_spans,
    "jobprof_aic_metrics": _check_metrics,
}


# -- helpers -------------------------------------------------------------------------------
def _positional(function: Callable, argnames: tuple[str, ...]) -> Callable[[Any, Any], Any]:
    """A ``(session, iteration)`` caller of an implementation that declares ``argnames``."""
    if argnames == ("session", "iteration"):
        return function
    if argnames == ("iteration",):
        return lambda session, iteration: function(iteration)
    if argnames == ("session",):
        return lambda session, iteration: function(session)
    if not argnames:
        return lambda session, iteration: function()
    return lambda session, iteration: function(**{name: {"session": session, "iteration": iteration}[name]
                                                  for name in argnames})


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


def _dist_of(ep: EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "(unknown)", ""
    try:
        return dist.metadata["Name"] or "(unknown)", dist.version or ""
    except Exception:
        return "(unknown)", ""
