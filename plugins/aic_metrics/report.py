"""The aic_metrics section of ``jobprof summary`` / ``report``: the chosen group per operator type.

``op_summary`` holds the group's columns per task; this view answers "which operator types are
compute-bound, which memory-bound" without opening a CSV.  Per operator type (``OP Type``),
over the selected ranks and iterations:

* ``calls`` and ``time (ms)``: the tasks' count and summed duration;
* a ratio or bandwidth column: the **time-weighted mean** of the tasks' values (weights: their
  durations), which for ``x_ratio = x_time / duration`` is exactly ``sum(x_time) /
  sum(duration)``, the share of the type's time the unit needed at the measured peak;
* a data column (``(KB)``): the sum;
* ``memory_bound``: recomputed from the type's aggregated ratios with the contract's formula
  (a mean of quotients would not be one);
* unit times (``..._time(us)``) and the duration column (``aicore_time(us)``) are left out:
  they are the ratios times ``time`` (op_summary has them per task).

A value is shown only where every call of the type had one; a type where some calls had none
shows ``N/A`` with the count in a note (never a mean of the measurable part presented as the
whole).  Columns with no source on this machine (N/A for every task) are named in a note, not
shown as a column of N/A.  Every value is derived, not counted by hardware: FLOPs and bytes from
the recorded input shapes over the machine's measured peaks (the calibration); ``jobprof
plugins`` and docs/plugins/aic_metrics.md give each column's source.

Map/reduce: :func:`rank_facts` reduces one device's operator stream (``jobprof_rank_facts``);
:func:`aic_metrics_sections` pools the devices' facts and reads no raw record.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, OPS_STREAM, OpView, Section

if TYPE_CHECKING:
    from collections.abc import Mapping

    from jobprof.plugin import Profile
    from jobprof.plugins.aic_metrics._group import Group

#: operator types shown, most time first
TOP = 12
#: the duration column every time-based group repeats (the task's Task Duration)
DURATION_COLUMN = "aicore_time(us)"


def chosen_group(profile: Profile, device: int, groups: Mapping[str, Group]) -> Group | None:
    """The group of ``groups`` the device's options chose, or None (off, or another plugin's)."""
    name = profile.options(device).get("aic_metrics")
    return groups.get(name) if isinstance(name, str) else None


def _kind(column: str) -> str:
    """How a column pools over the calls of a type: ``sum``, ``mean`` (time-weighted) or
    ``skip`` (a unit time, the duration: the ratios times the time)."""
    if column == DURATION_COLUMN or column.endswith("(us)"):
        return "skip"
    if column.endswith("(KB)"):
        return "sum"
    return "mean"


def _number(cell: Any) -> float | None:
    if isinstance(cell, (int, float)):
        return float(cell)
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None  # N/A


def _empty(columns: list[str]) -> dict[str, Any]:
    return {"calls": 0, "dur_ns": 0, "values": {c: [0.0, 0] for c in columns}}


def rank_facts(profile: Profile, device: int, groups: Mapping[str, Group]) -> dict[str, Any] | None:
    """This device's group values per operator type: ``{"group", "columns", "types": {type:
    {"calls", "dur_ns", "values": {column: [sum (weighted by ns for a mean), calls with a
    value]}}}}``; None when none of ``groups`` was chosen or no operator ran."""
    group = chosen_group(profile, device, groups)
    if group is None:
        return None
    machine: Mapping[str, Any] = profile.info(device).get("jobprof", {}).get("calibration") or {}
    columns = [c for c in group.columns if _kind(c) != "skip"]
    where = [group.columns.index(c) for c in columns]
    weighted = [_kind(c) == "mean" for c in columns]
    types: dict[str, dict[str, Any]] = {}
    for _, streams in profile.streams(device):
        records = streams.get(OPS_STREAM)
        if not records:
            continue
        for task in OpView(records).tasks:
            row = group.values(task, machine)
            agg = types.get(task.op_type)
            if agg is None:
                agg = types[task.op_type] = _empty(columns)
            agg["calls"] += 1
            agg["dur_ns"] += task.dur
            values = agg["values"]
            for column, k, mean in zip(columns, where, weighted, strict=True):
                value = _number(row[k])
                if value is not None:
                    cell = values[column]
                    cell[0] += value * task.dur if mean else value
                    cell[1] += 1
    if not types:
        return None
    return {"group": group.name, "columns": columns, "types": types}


def _pool(profile: Profile, groups: Mapping[str, Group]) -> tuple[str, list[str], dict[str, Any]] | None:
    """The devices' facts summed: (group, columns, types); None without any, or when the devices
    chose different groups (then each would need its own table: the first one is shown)."""
    pooled: dict[str, dict[str, Any]] = {}
    group, columns = "", []
    for device in profile.devices:
        facts = profile.facts("aic_metrics", device, partial(rank_facts, groups=groups))
        if not facts:
            continue
        if not group:
            group, columns = facts["group"], facts["columns"]
        elif facts["group"] != group:
            continue
        for name, agg in facts["types"].items():
            into = pooled.setdefault(name, _empty(columns))
            into["calls"] += agg["calls"]
            into["dur_ns"] += agg["dur_ns"]
            for column, (total, n) in agg["values"].items():
                into["values"][column][0] += total
                into["values"][column][1] += n
    return (group, columns, pooled) if pooled else None


def _value(agg: dict[str, Any], column: str) -> float | None:
    total, n = agg["values"][column]
    if n < agg["calls"]:
        return None
    if _kind(column) == "sum":
        return total
    return total / agg["dur_ns"] if agg["dur_ns"] else None


def _memory_bound(agg: dict[str, Any]) -> float | None:
    mte2, mac, vec = (_value(agg, c) for c in ("mte2_ratio", "mac_ratio", "vec_ratio"))
    if mte2 is None or mac is None or vec is None or max(mac, vec) <= 0:
        return None
    return mte2 / max(mac, vec)


def aic_metrics_sections(profile: Profile, groups: Mapping[str, Group]) -> list[Section]:
    pooled = _pool(profile, groups)
    if pooled is None:
        return []
    group, columns, types = pooled
    measured = [c for c in columns if any(agg["values"][c][1] for agg in types.values())]
    unmeasured = [c for c in columns if c not in measured]
    total_ns = sum(agg["dur_ns"] for agg in types.values()) or 1
    ranked = sorted(types.items(), key=lambda kv: (-kv[1]["dur_ns"], kv[0]))
    rows, partial = [], []
    for name, agg in ranked[:TOP]:
        cells: list[Any] = [name, agg["calls"], f"{agg['dur_ns'] / 1e6:.3f}",
                            f"{100 * agg['dur_ns'] / total_ns:.1f}"]
        for column in measured:
            value = _memory_bound(agg) if column == "memory_bound" else _value(agg, column)
            cells.append(NA if value is None else f"{value:.3f}")
            n = agg["values"][column][1]
            if 0 < n < agg["calls"]:
                partial.append(f"{name} {column}: {n} of {agg['calls']} calls")
        rows.append(cells)
    notes = [f"{group} (aic_metrics), per operator type over the selected ranks and iterations, most time "
             "first; every value is derived (FLOPs and bytes from input shapes over the machine's measured "
             "peaks), not a hardware count: `jobprof plugins` gives each column's source",
             "ratios and bandwidths: time-weighted means over the calls (a ratio is then the type's unit "
             "time / its time); (KB): sums; memory_bound from the pooled ratios; per task in op_summary",
             "a ratio above 1: the operator beat the calibration's short best run (not clamped); N/A: the "
             "operator's FLOPs or bytes do not follow from its inputs here, or no peak was measured for "
             "its dtype"]
    if len(ranked) > TOP:
        notes.append(f"{len(ranked) - TOP} more operator types (op_summary lists every task)")
    if unmeasured:
        notes.append(f"no source on this machine (N/A for every task): {', '.join(unmeasured)}")
    if partial:
        notes.append("N/A where only some calls had a value: " + "; ".join(partial[:6])
                     + (f"; {len(partial) - 6} more" if len(partial) > 6 else ""))
    headers = ["op type", "calls", "time (ms)", "% time", *measured]
    return [Section(f"aic_metrics: {group} per operator type", headers, rows, notes, key="aic_metrics",
                    columns=["op_type", "calls", "time_ms", "time_pct", *[_slug(c) for c in measured]])]


def _slug(column: str) -> str:
    return column.replace("(", "_").replace(")", "").replace("/", "_per_").lower()
