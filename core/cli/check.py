"""``jobprof check``: validate PROFILING_OPTIONS and show the effective config."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tabulate import tabulate

from jobprof.cli._common import new_manager


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate PROFILING_OPTIONS (or --options); show the effective config")
    p.add_argument("--options", help="options JSON to check instead of $PROFILING_OPTIONS")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobprof.engine import configure, options
    from jobprof.plugin.reporter import escape

    # problem lines are escaped already; a terminal that takes ASCII only gets the rest
    # (a non-ASCII key, say) as backslash escapes instead of a UnicodeEncodeError
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    manager, _ = new_manager()
    text = args.options
    if text is not None and not text.strip():
        text = options.read_text({})[0]  # empty options mean msprof's default set, as in a job
    outcome, composed = configure.prepare(manager, os.environ, text)
    mode = os.environ.get("PROFILING_MODE")
    notes = list(outcome.warnings)
    if args.options is None and mode not in ("true", "dynamic"):
        shown = repr(mode) if mode is not None else "unset"
        notes.append(f"PROFILING_MODE is {shown}: a job started now would not be profiled")
    if outcome.config is not None and outcome.config.get("trigger") and mode != "dynamic":
        notes.append("trigger works with PROFILING_MODE=dynamic only (docs/dynamic.md)")
    if outcome.config is not None:
        missing = set(configure.uncollected(outcome, composed))
        notes += [f"{k} is on but no installed plugin collects it" for k in sorted(missing)]
    if args.json:
        print(json.dumps({
            "valid": outcome.config is not None,
            "source": outcome.source,
            "problems": [{"path": p.path, "message": p.message,
                          **({"value": p.value} if p.has_value else {})} for p in outcome.problems],
            "config": dict(outcome.config.values) if outcome.config else None,
            "explicit": sorted(outcome.config.explicit) if outcome.config else [],
            "collected_by": dict(composed.owners),
            "notes": notes,
        }, indent=2, default=str))
        return 0 if outcome.config is not None else 1
    if outcome.config is None:  # problems go where every command's errors go: stderr
        print(f"{outcome.source}: invalid ({len(outcome.problems)} problem(s))", file=sys.stderr)
        for problem in outcome.problems:
            print(f"  {problem.render()}", file=sys.stderr)
        return 1
    config = outcome.config
    rows = [[key, json.dumps(value), "set" if key in config.explicit else "default",
             composed.owners.get(key, "core" if key in ("output", "storage_limit") else "-")]
            for key, value in sorted(config.values.items())]
    print(f"{outcome.source}: valid")
    print(tabulate(rows, headers=["key", "value", "from", "collected by"]))
    for note in notes:
        print(f"note: {escape(note)}", file=sys.stderr)
    return 0
