"""What analysis plugins answer: findings and report sections (``jobprof summary`` / ``report``)
and diff tables (``jobprof diff``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from jobprof.plugin.converters import row_tuples, str_tuple

__all__ = [
    "COMMUNICATION",
    "COMMUNICATION_BLOCKING",
    "COMPUTE",
    "DATA_WAIT",
    "DIFF_CORE_KEYS",
    "DIFF_ROW_KEYS",
    "FORWARD_BACKWARD",
    "PROFILER",
    "REFRESH",
    "DiffCount",
    "DiffTable",
    "Finding",
    "Section",
    "slug",
]

# -- the iteration breakdown: the span categories jobprof_iteration_spans answers --------------
PROFILER = "profiler"
DATA_WAIT = "data_wait"
COMPUTE = "compute"
COMMUNICATION = "communication"
COMMUNICATION_BLOCKING = "communication_blocking"
FORWARD_BACKWARD = "forward_backward"
REFRESH = "refresh"



def _findings(values: Iterable[Finding]) -> tuple[Finding, ...]:
    return tuple(values)


def _evidence(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return dict(mapping)



def slug(text: str) -> str:
    """A stable machine key for a human header: ``"total ms"`` -> ``"total_ms"``."""
    return re.sub(r"[^0-9a-z]+", "_", text.lower().replace("%", " pct ").replace("µ", "u")).strip("_")


@attrs.frozen
class Finding:
    """One numbered statement of the report's Findings, with the numbers it rests on.

    ``key`` is stable (``"data_bound"``, ``"straggler"``); ``evidence`` holds the values the text
    quotes, so ``jobprof summary --json`` readers and tests can check them.
    """

    key: str
    text: str
    evidence: Mapping[str, Any] = attrs.field(factory=dict, converter=_evidence)
    #: 1 (worth a look) .. 3 (the first thing to fix); orders the Findings list
    weight: int = 1


@attrs.frozen
class Section:
    """A table for ``jobprof summary`` and the HTML report, with the findings it supports.

    ``key`` names the section in ``summary --json`` (a slug of the title when not given);
    ``columns`` are the rows' machine keys (slugs of ``headers`` when not given).
    """

    title: str
    headers: tuple[str, ...] = attrs.field(converter=str_tuple)
    rows: tuple[tuple[Any, ...], ...] = attrs.field(converter=row_tuples)
    notes: tuple[str, ...] = attrs.field(converter=str_tuple, factory=tuple)
    key: str = attrs.field(default="")
    findings: tuple[Finding, ...] = attrs.field(converter=_findings, factory=tuple)
    columns: tuple[str, ...] = attrs.field(converter=str_tuple, factory=tuple)
    #: columns (machine keys) the HTML report draws as lines over the first column, which holds
    #: an iteration number (e.g. a value per iteration); empty: no chart
    chart: tuple[str, ...] = attrs.field(converter=str_tuple, factory=tuple)

    def __attrs_post_init__(self) -> None:
        # derived defaults on a frozen class: set once, here
        if not self.key:
            object.__setattr__(self, "key", slug(self.title.split("(")[0]))
        if not self.columns:
            object.__setattr__(self, "columns", tuple(slug(h) for h in self.headers))




#: the diff model's own keys (``jobprof.diff/1``): no table may be called one of them
DIFF_CORE_KEYS = frozenset({"schema", "a", "b", "scope", "ranks", "thresholds", "verdict", "counts",
                            "iteration", "notes"})
#: keys of a diff table row the core computes: no key column may be called one of them
DIFF_ROW_KEYS = frozenset({"rank", "a", "b", "delta_calls_per_iteration", "delta_ms_per_iteration",
                           "delta_pct", "change", "delta_mb_per_iteration"})
_DIFF_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def _diff_key(instance: Any, attribute: Any, value: str) -> None:
    if not _DIFF_KEY.match(value) or value in DIFF_CORE_KEYS:
        raise ValueError(f"DiffTable key {value!r} (must match {_DIFF_KEY.pattern}, not one of the diff "
                         f"model's own keys {sorted(DIFF_CORE_KEYS)})")


def _diff_columns(instance: Any, attribute: Any, value: tuple[str, ...]) -> None:
    if not value or any(not _DIFF_KEY.match(c) or c in DIFF_ROW_KEYS for c in value):
        raise ValueError(f"DiffTable columns {list(value)} (one or more, each matching {_DIFF_KEY.pattern}, "
                         f"none of {sorted(DIFF_ROW_KEYS)})")


def _diff_names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _diff_rows(rows: Mapping[Any, DiffCount]) -> Mapping[tuple[str, ...], DiffCount]:
    return MappingProxyType({tuple(key): count for key, count in rows.items()})


@attrs.frozen
class DiffCount:
    """What one key of a :class:`DiffTable` (an operator type, a collective) added up to on one
    device, over the iterations the table covers.

    ``time`` is in the table's ``time_unit``; ``bytes`` the bytes it moved (for a table with
    ``sizes``); ``series`` its time in each covered iteration that holds it (iterations without
    it count 0): given, the verdict also asks the median iteration to move the same way.
    """

    calls: int
    time: float
    bytes: int | None = None
    series: tuple[float, ...] | None = attrs.field(
        default=None, converter=lambda s: None if s is None else tuple(s))


@attrs.frozen
class DiffTable:
    """One device's table for ``jobprof diff`` (``jobprof_diff_tables``): counts per key, which
    the core normalises per iteration of one rank and compares A against B.

    ``key`` names the table in ``diff --json`` (a list of rows, or null / ``[]`` when a side has
    no data, see ``null_when_absent``) and in its ``counts``; ``columns`` are the rows' key
    fields (JSON keys) and ``headers`` their text headers.  ``title`` is the text table's title,
    a ``str.format`` template with ``{shown}`` / ``{total}`` (rows shown, rows in all) and ``{a}``
    / ``{b}`` (the sides' covered iterations, with ``count_key``).

    ``present``: the device has this kind of data at all (a table is compared when both sides
    have it somewhere).  ``covered``: the iterations the rows add up over (e.g. files read);
    None means every selected iteration of the rank.  ``time_unit`` is ``"ns"`` or ``"us"``.
    ``per_call`` adds µs per call and Δ calls to the text; ``sizes`` adds MB per iteration.

    What a side says about it: ``count_key`` / ``present_key`` add the covered iterations /
    ``present`` to the side's summary in the JSON; ``absent_note`` is noted for a side without
    the data, ``partial_note`` (a template with ``{missing}`` and ``{iterations}``) for a side
    whose covered iterations are fewer than its iterations, both after the side's name;
    ``one_sided_note`` once when only one side has the data.  ``verdict``: the table's top change
    is named in the verdict (the first such table, by ``order``), and this text says so when
    nothing changed.  ``order`` places it among the other tables (text and JSON).
    """

    key: str = attrs.field(validator=_diff_key)
    title: str
    columns: tuple[str, ...] = attrs.field(converter=_diff_names, validator=_diff_columns)
    headers: tuple[str, ...] = attrs.field(converter=_diff_names)
    rows: Mapping[tuple[str, ...], DiffCount] = attrs.field(converter=_diff_rows, factory=dict)
    present: bool = True
    covered: int | None = None
    time_unit: str = attrs.field(default="ns", validator=attrs.validators.in_(("ns", "us")))
    per_call: bool = False
    sizes: bool = False
    count_key: str | None = None
    present_key: str | None = None
    absent_note: str | None = None
    partial_note: str | None = None
    one_sided_note: str | None = None
    null_when_absent: bool = True
    verdict: str | None = None
    order: int = 100

    def __attrs_post_init__(self) -> None:
        if len(self.headers) != len(self.columns):
            raise ValueError(f"DiffTable {self.key!r}: {len(self.headers)} header(s) for "
                             f"{len(self.columns)} column(s)")
        wrong = [k for k, v in self.rows.items() if len(k) != len(self.columns)
                 or not all(isinstance(part, str) for part in k) or not isinstance(v, DiffCount)]
        if wrong:
            raise ValueError(f"DiffTable {self.key!r}: row {wrong[0]!r} is not a key of "
                             f"{len(self.columns)} string(s) with a DiffCount")

    def to_plain(self) -> dict[str, Any]:
        """The table as plain JSON values (a device's facts keep it: ``jobprof diff`` then reads
        no raw record); :meth:`from_plain` gives the same table back."""
        plain = attrs.asdict(self, filter=lambda a, _: a.name != "rows")
        plain["rows"] = [[list(key), c.calls, c.time, c.bytes, None if c.series is None else list(c.series)]
                         for key, c in self.rows.items()]
        return plain

    @classmethod
    def from_plain(cls, plain: Mapping[str, Any]) -> DiffTable:
        """The table :meth:`to_plain` wrote; ValueError / TypeError / KeyError when ``plain``
        is not one."""
        rows = {tuple(key): DiffCount(calls, time, size, series) for key, calls, time, size, series
                in plain["rows"]}
        return cls(**{k: v for k, v in plain.items() if k != "rows"}, rows=rows)
