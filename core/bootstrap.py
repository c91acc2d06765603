"""Start-up when PROFILING_MODE=true: plugins, options, session, and the wait for torch.

Imports only jobprof's own light dependencies (pluggy, attrs, jsonschema); torch is never
imported here; the session installs its collectors when the program imports torch.
"""

from __future__ import annotations

import atexit
import os
import sys

import attrs
import jsonschema

from jobprof import _state, options
from jobprof.manager import PluginManager
from jobprof.reporter import REPORTER
from jobprof.session import Session
from jobprof.torch_import import when_imported

STRICT_ENV = "JOBPROF_STRICT"


def prepare(manager: PluginManager, environ: os._Environ | dict = os.environ,
            text: str | None = None) -> tuple[options.Outcome, options.Composed]:
    """Load plugins, compose the schema and validate the options (shared with ``jobprof check``)."""
    manager.load_entry_points(environ)
    composed = compose_with(manager)
    source = "--options"
    if text is None:
        text, source = options.read_text(environ)
    outcome = options.load(text, composed, source)
    unavailable = sorted(r.name for r in manager.records() if r.status != "active")
    if unavailable:  # an unknown key may belong to a plugin that is not running here
        outcome = attrs.evolve(outcome, problems=tuple(
            attrs.evolve(p, message=f"{p.message} (plugins not loaded in this process: "
                                    f"{', '.join(unavailable)}; the key may be theirs)")
            if p.message.startswith("unknown option key") else p for p in outcome.problems))
    if outcome.config is not None:
        for name, active in manager.call("jobprof_configure", config=outcome.config):
            if active is False:
                manager.inactive.add(name)
    return outcome, composed


def compose_with(manager: PluginManager) -> options.Composed:
    """Compose the options schema; a plugin with an invalid fragment is failed, not fatal."""
    while True:
        fragments = manager.call("jobprof_options_schema")
        try:
            return options.compose(fragments)
        except jsonschema.SchemaError as exc:
            culprit = next((name for name, _ in fragments if f"plugin '{name}'" in exc.message), None)
            if culprit is None:
                raise
            manager.fail(culprit, exc.message.split(": ", 1)[1])


def uncollected(outcome: options.Outcome, composed: options.Composed) -> list[str]:
    """Keys the user switched on explicitly that no active plugin collects."""
    config, out = outcome.config, set()
    for key in config.explicit:
        key = "task_trace" if key == "task_time" else key  # the alias collects as task_trace
        if key not in ("output", "storage_limit") and key not in composed.owners and config.is_on(key):
            out.add(key)
    return sorted(out)


def start(environ: os._Environ | dict = os.environ) -> Session | None:
    """Entry point from the autoload; returns the session, or None when running unprofiled."""
    if _state.SESSION is not None:
        return _state.SESSION
    manager = PluginManager()
    outcome, composed = prepare(manager, environ)
    for warning in outcome.warnings:
        REPORTER.once_per_job("warning", warning)
    if outcome.config is None:
        strict = environ.get(STRICT_ENV, "") not in ("", "0")
        consequence = ("exiting (JOBPROF_STRICT is set)" if strict
                       else "the job runs unprofiled (set JOBPROF_STRICT=1 to fail instead)")
        REPORTER.options_problems(list(outcome.problems), outcome.source, consequence)
        if strict:
            sys.stderr.flush()
            os._exit(2)
        return None
    missing = uncollected(outcome, composed)
    if missing:
        REPORTER.once_per_job("warning", f"no installed plugin collects {', '.join(missing)}; "
                              "those options are accepted and ignored")
    session = Session(outcome.config, manager, composed.owners)
    _state.SESSION = session
    atexit.register(session.finish, "exit")
    when_imported("torch", session.torch_ready)
    return session
