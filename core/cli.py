"""The ``jobprof`` command: check options, list plugins, export and summarise profiles."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from tabulate import tabulate

from jobprof import __version__, bootstrap, export, options
from jobprof.manager import PluginManager
from jobprof.profile import Profile, find_prof_dir
from jobprof.reporter import Reporter
from jobprof.types import Section


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobprof", description=__doc__)
    parser.add_argument("--version", action="version", version=f"jobprof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="validate PROFILING_OPTIONS (or --options); show the effective config")
    p.add_argument("--options", help="options JSON to check instead of $PROFILING_OPTIONS")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plugins", help="list plugins: distribution, status, option keys, files")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("export", help="re-render timeline/ and summary/ files from raw data (idempotent)")
    p.add_argument("prof_dir", type=Path, help="a PROF_* directory, or an output folder holding one")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("summary", help="print the report sections of a profile")
    p.add_argument("prof_dir", type=Path, help="a PROF_* directory, or an output folder holding one")
    p.add_argument("--json", action="store_true", help="print the sections as JSON")
    p.set_defaults(func=cmd_summary)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, NotADirectoryError) as exc:
        print(f"jobprof: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `jobprof plugins --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _manager() -> tuple[PluginManager, Reporter]:
    reporter = Reporter()
    return PluginManager(reporter), reporter


def cmd_check(args: argparse.Namespace) -> int:
    manager, _ = _manager()
    text = args.options
    if text is not None and not text.strip():
        text = options.read_text({})[0]  # empty options mean msprof's default set, as in a job
    outcome, composed = bootstrap.prepare(manager, os.environ, text)
    mode = os.environ.get("PROFILING_MODE")
    notes = list(outcome.warnings)
    if args.options is None and mode != "true":
        shown = repr(mode) if mode is not None else "unset"
        notes.append(f"PROFILING_MODE is {shown}: a job started now would not be profiled")
    if outcome.config is not None:
        missing = set(bootstrap.uncollected(outcome, composed))
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
    if outcome.config is None:
        print(f"{outcome.source}: invalid ({len(outcome.problems)} problem(s))")
        for problem in outcome.problems:
            print(f"  {problem.render()}")
        return 1
    config = outcome.config
    rows = [[key, json.dumps(value), "set" if key in config.explicit else "default",
             composed.owners.get(key, "core" if key in ("output", "storage_limit") else "-")]
            for key, value in sorted(config.values.items())]
    print(f"{outcome.source}: valid")
    print(tabulate(rows, headers=["key", "value", "from", "collected by"]))
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    manager, _ = _manager()
    manager.load_entry_points()
    keys: dict[str, list[str]] = {}
    for name, fragment in manager.call("jobprof_options_schema"):
        keys[name] = sorted(fragment.get("properties", {}))
    files: dict[str, list[str]] = {}
    for name, specs in manager.call("jobprof_writers", config=None):
        files[name] = [f"{s.folder}/{s.name}_<dev>_<model>_<iter>.{s.extension}" for s in specs]
    # metric groups write no file of their own: they add op_summary columns
    groups = list(options.METRIC_GROUPS)
    for _, fragment in manager.call("jobprof_options_schema"):
        groups += fragment.get("properties", {}).get("aic_metrics", {}).get("enum", [])
    for group in dict.fromkeys(groups):
        for name, metric_set in manager.call("jobprof_aic_metrics", name=group):
            files.setdefault(name, []).append(f"op_summary columns: aic_metrics={group} "
                                              f"({len(metric_set.columns)} columns)")
    for name in keys.keys() | files.keys():
        if manager.record(name) is not None and manager.record(name).status == "active":
            manager.update(name, option_keys=keys.get(name, ()), files=files.get(name, ()))
    records = manager.records()
    if args.json:
        print(json.dumps([attrs.asdict(r) for r in records], indent=2))
        return 0
    rows = [[r.name, r.distribution, r.version, r.status + (f": {r.error}" if r.error else ""),
             ", ".join(r.option_keys) or "-", "\n".join(r.files) or "-"] for r in records]
    print(tabulate(rows, headers=["plugin", "distribution", "version", "status", "option keys", "files"]))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    prof = find_prof_dir(args.prof_dir)
    manager, _ = _manager()
    manager.load_entry_points()
    devices = export.device_dirs(prof)
    if not devices:
        print(f"jobprof: error: {prof} has no device_<id> folders", file=sys.stderr)
        return 1
    status = 0
    for device_dir in devices:
        show = _progress(device_dir.name)
        result = export.export_device(device_dir, manager, show)
        if show is not None:
            sys.stderr.write("\r\033[K")
        finished = any(device_dir.glob("end_info.*"))
        print(f"{device_dir}: {result.iterations} iteration(s), {result.files} file(s)"
              + ("" if finished else " (no end_info: the job did not finish; rendered what was saved)"))
        for problem in result.problems:
            print(f"  problem: {problem}", file=sys.stderr)
            status = 1
    return status


def cmd_summary(args: argparse.Namespace) -> int:
    manager, _ = _manager()
    manager.load_entry_points()
    profile = Profile(args.prof_dir)
    sections: list[Section] = [s for _, found in manager.call("jobprof_report_sections", profile=profile)
                               for s in found]
    if args.json:
        print(json.dumps({"prof_dir": str(profile.path), "sections": [attrs.asdict(s) for s in sections]},
                         indent=2, default=str))
        return 0
    print(f"{profile.path}  (devices: {', '.join(map(str, profile.devices)) or 'none'})")
    for section in sections:
        print(f"\n{section.title}")
        print(tabulate(section.rows, headers=section.headers))
        for note in section.notes:
            print(f"  note: {note}")
    if not sections:
        print("no data: no plugin reported anything for this profile")
    return 0


def _progress(label: str) -> Any:
    """A one-line progress counter on a terminal; silent otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(done: int) -> None:
        if done % 50 == 0:
            sys.stderr.write(f"\r{label}: {done} iterations exported")
            sys.stderr.flush()

    return show


if __name__ == "__main__":
    raise SystemExit(main())
