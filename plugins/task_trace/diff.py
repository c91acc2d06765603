"""task_trace's table for ``jobprof diff``: every operator type (OP Type, Core Type) of a device,
added up over its selected ``op_statistic`` files (all operator types, not only the summary's
top ones), one file per iteration with operator data."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobprof.plugin import DiffCount, DiffTable

if TYPE_CHECKING:
    from jobprof.plugin import Profile

STATISTIC = "op_statistic"


def read_op_statistic(profile: Profile,
                      paths: Iterable[Path]) -> tuple[dict[tuple[str, str], list[Any]], int]:
    """``{(OP Type, Core Type): [calls, total µs, [µs in each file holding it]]}`` over ``paths``,
    and the number of files read (an operator type absent from a file spent 0 µs there)."""
    groups: dict[tuple[str, str], list[Any]] = {}
    files = 0
    for path in paths:
        try:
            found = _op_statistic(profile, path)
        except (OSError, ValueError, csv.Error) as exc:  # one unreadable file: the others count
            profile.problem(f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}: left out")
            continue
        for key, (count, total) in found.items():
            g = groups.setdefault(key, [0, 0.0, []])
            g[0] += count
            g[1] += total
            g[2].append(total)
        files += 1
    return groups, files


def _op_statistic(profile: Profile, path: Path) -> dict[tuple[str, str], tuple[int, float]]:
    """One op_statistic file's (OP Type, Core Type) -> (calls, total µs); ValueError names what is
    wrong with a file that is not one."""
    found: dict[tuple[str, str], tuple[int, float]] = {}
    with profile.open_text(path) as handle:
        reader = csv.DictReader(handle)
        missing = {"OP Type", "Core Type", "Count", "Total Time(us)"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"not an op_statistic file (no column {', '.join(sorted(missing))})")
        for row in reader:
            try:
                count, total = int(row["Count"]), float(row["Total Time(us)"])
            except (TypeError, ValueError):
                continue  # an N/A cell (or a short row): nothing measured to add
            if count < 0 or not math.isfinite(total):
                continue
            key = (str(row["OP Type"]), str(row["Core Type"]))
            before = found.get(key, (0, 0.0))
            found[key] = (before[0] + count, before[1] + total)
    return found


def operator_tables(profile: Profile, device: int) -> list[DiffTable]:
    """The device's operator table; always returned (with no files, ``present`` is False), so
    the diff can say that a side has no operator data."""
    groups, files = read_op_statistic(profile, profile.summary_files(device, STATISTIC))
    return [DiffTable(
        "operators",
        "Operator types per iteration of one rank (A: {a}, B: {b} op_statistic files; "
        "{shown} of {total} by |Δ ms|)",
        ("op_type", "core_type"), ("OP Type", "Core Type"),
        {key: DiffCount(calls, total, series=per_file) for key, (calls, total, per_file) in groups.items()},
        present=files > 0, covered=files, time_unit="us", per_call=True,
        count_key="op_statistic_files",
        absent_note="no op_statistic files (task_trace off?): no operator comparison",
        partial_note="{missing} of {iterations} iterations have no op_statistic file (killed before "
                     "export? run `jobprof export`); operators are per iteration with one",
        null_when_absent=False, verdict="no operator type changed beyond noise", order=10)]
