"""``jobprof plugins``: list plugins with their distribution, status, option keys and files."""

from __future__ import annotations

import argparse
import json

import attrs
from tabulate import tabulate

from jobprof.cli._common import new_manager


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list plugins: distribution, status, option keys, files")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from jobprof.engine import options

    manager, _ = new_manager()
    manager.load_entry_points()
    keys: dict[str, list[str]] = {}
    for name, fragment in manager.options_schemas():
        keys[name] = sorted(fragment.get("properties", {}))
    files: dict[str, list[str]] = {}
    for name, specs in manager.writers(None):
        files[name] = [f"{s.folder}/{s.name}_<dev>_<model>_<iter>.{s.extension}" for s in specs]
    # metric groups write no file of their own: they add op_summary columns
    groups = list(options.METRIC_GROUPS)
    for _, fragment in manager.options_schemas():
        groups += fragment.get("properties", {}).get("aic_metrics", {}).get("enum", [])
    for group in dict.fromkeys(groups):
        answer = manager.aic_metrics(group)  # firstresult: the group's owner only
        if answer is not None:
            name, metric_set = answer
            files.setdefault(name, []).append(f"op_summary columns: aic_metrics={group} "
                                              f"({len(metric_set.columns)} columns)")
    for name in keys.keys() | files.keys():
        record = manager.record(name)
        if record is not None and record.status == "active":
            manager.update(name, option_keys=keys.get(name, ()), files=files.get(name, ()))
    records = manager.records()
    if args.json:
        print(json.dumps([attrs.asdict(r) for r in records], indent=2))
        return 0
    rows = [[r.name, r.distribution, r.version, r.status + (f": {r.error}" if r.error else ""),
             ", ".join(r.option_keys) or "-", "\n".join(r.files) or "-"] for r in records]
    print(tabulate(rows, headers=["plugin", "distribution", "version", "status", "option keys", "files"]))
    return 0
