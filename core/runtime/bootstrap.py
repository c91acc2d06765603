"""Start-up when PROFILING_MODE=true: plugins, options, session, and the wait for torch.

Imports only jobprof's own light dependencies (pluggy, attrs, jsonschema); torch is never
imported here; the session installs its collectors when the program imports torch.
"""

from __future__ import annotations

import atexit
import os
import sys

from jobprof.plugin.configure import prepare, uncollected
from jobprof.plugin.manager import PluginManager
from jobprof.plugin.reporter import REPORTER
from jobprof.runtime import _state, exits
from jobprof.runtime.session import Session
from jobprof.runtime.torch_import import when_imported

STRICT_ENV = "JOBPROF_STRICT"


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
    # os._exit and exec skip atexit: the session ends before them
    exits.install(session.finish, session.pid)
    when_imported("torch", session.torch_ready)
    return session
