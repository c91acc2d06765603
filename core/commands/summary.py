"""``jobprof summary``: the report sections of a profile, as tables or JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import attrs
from tabulate import tabulate

from jobprof.commands._common import new_manager
from jobprof.profile import Profile
from jobprof.types import Section


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("summary", help="print the report sections of a profile")
    p.add_argument("prof_dir", type=Path, help="a PROF_* directory, or an output folder holding one")
    p.add_argument("--json", action="store_true", help="print the sections as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    manager, _ = new_manager()
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
