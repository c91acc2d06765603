"""Start-up when PROFILING_MODE=true: plugins, options, session, and the wait for torch.

Imports only jobprof's own light dependencies (pluggy, attrs, jsonschema); torch is never
imported here; the session installs its collectors when the program imports torch.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

import attrs

from jobprof.engine import options
from jobprof.engine.configure import prepare, uncollected
from jobprof.engine.manager import PluginManager
from jobprof.plugin.reporter import REPORTER
from jobprof.plugin.values import Config
from jobprof.runtime import _state, exits
from jobprof.runtime.session import Session
from jobprof.runtime.torch_import import when_imported

STRICT_ENV = "JOBPROF_STRICT"


def start(environ: os._Environ | dict = os.environ, dynamic: bool = False,
          started_ns: int | None = None) -> Session | None:
    """Entry point from the autoload; returns the session, or None when running unprofiled.

    ``dynamic`` (``PROFILING_MODE=dynamic``): the session runs the step tier only, and a
    :class:`~jobprof.runtime.dynamic.Controller` captures the rest on request.  ``started_ns``
    (``time.monotonic_ns()`` as the autoload began): the time to here, jobprof's imports, plugins
    and options, goes in info.json as ``bootstrap_ms``."""
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
    trigger = outcome.config.get("trigger")
    if dynamic:
        session = _dynamic_session(outcome.config, environ)
        if session is None:
            return None
    else:
        if trigger:
            REPORTER.once_per_job("warning", "option trigger works in PROFILING_MODE=dynamic only; "
                                  "ignored (this job is profiled whole)")
        session = Session(outcome.config, manager, composed.owners)
    _state.SESSION = session
    if started_ns is not None:
        session.info["bootstrap_ms"] = round((time.monotonic_ns() - started_ns) / 1e6, 3)
    atexit.register(session.finish, "exit")
    # os._exit and exec skip atexit: the session ends before them
    exits.install(session.finish, session.pid)
    when_imported("torch", session.torch_ready)
    return session


def _dynamic_session(config: Config, environ: os._Environ | dict) -> Session | None:
    """The job's session in dynamic mode: its own plugins are the step tier's only."""
    from jobprof.runtime.dynamic import Controller, step_tier_options

    text, _ = options.read_text(environ)
    given = json.loads(text) if text.strip() else dict(options.MSPROF_DEFAULT)
    manager = PluginManager()
    outcome, composed = prepare(manager, environ, text=json.dumps(step_tier_options(given)))
    if outcome.config is None:  # cannot be: a subset of options that passed
        REPORTER.options_problems(list(outcome.problems), outcome.source, "the job runs unprofiled")
        return None
    # the job's own options as given, for info.json and for `jobprof check`
    step_config = attrs.evolve(outcome.config, explicit=config.explicit, source=config.source)
    session = Session(step_config, manager, composed.owners)
    session.quiet = not manager.active()
    session.dynamic = Controller(session, given, config.get("trigger"), REPORTER)
    return session
