"""Registration and configuration: load the plugins, compose the options schema from their
fragments, validate the options, and let each plugin decide whether it is active.

Shared by the job's start-up (``jobprof.runtime.bootstrap``) and ``jobprof check``; it starts
nothing and imports no torch.
"""

from __future__ import annotations

import os

import attrs

from jobprof.engine import options
from jobprof.engine.manager import PluginManager


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
        for name, active in manager.configure(outcome.config):
            if active is False:
                manager.deactivate(name)
    return outcome, composed


def compose_with(manager: PluginManager) -> options.Composed:
    """Compose the options schema; a plugin with an invalid fragment is failed, not fatal."""
    while True:
        fragments = manager.options_schemas()
        try:
            return options.compose(fragments)
        except options.SchemaProblem as exc:
            culprit = next((name for name, _ in fragments if f"plugin '{name}'" in exc.message), None)
            if culprit is None:
                raise
            manager.fail(culprit, exc.message.split(": ", 1)[1])


#: the core's keys that choose how, not what, to collect
NOT_COLLECTED = frozenset({"output", "storage_limit", "export", "task_trace_every", "trigger"})


def uncollected(outcome: options.Outcome, composed: options.Composed) -> list[str]:
    """Keys the user switched on explicitly that no active plugin collects."""
    config, out = outcome.config, set()
    assert config is not None  # both callers pass a valid outcome (they check config first)
    for key in config.explicit:
        key = "task_trace" if key == "task_time" else key  # the alias collects as task_trace
        if key not in NOT_COLLECTED and key not in composed.owners and config.is_on(key):
            out.add(key)
    return sorted(out)
