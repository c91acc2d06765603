"""l2's own records, read only by l2: each raw shape decoded here, once, and read by its field
names everywhere else.

The raw shapes stay as written: a counter record is the list the dispatch mode appends on the
training thread (``[start_ns, end_ns, thread_id, "aten::mm", delta_0, delta_1, ...]``,
:mod:`jobprof.plugins.l2.counting`: no object is built on the hot path), the counter set one
dict per iteration (``{"events": [...], "source": ...}``).  ``NamedTuple``: one counter record
per operator, and a NamedTuple decodes ~1.4x faster than an attrs class (~0.33 against
~0.48 us a row, measured on 200,000 rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from jobprof.plugin import decoded


class CounterRecord(NamedTuple):
    """One operator's counter deltas (``l2`` stream): the outermost dispatch of ``name`` on
    thread ``tid`` from ``start_ns`` to ``end_ns`` (monotonic ns), its counters' deltas in the
    counter set's event order."""

    start_ns: int
    end_ns: int
    tid: int
    name: str
    values: list[int]

    @property
    def accesses(self) -> int:
        """With a cache event set (``LLC``, ``CACHE_GENERIC``): the cache accesses."""
        return self.values[0]

    @property
    def misses(self) -> int:
        """With a cache event set: the cache misses."""
        return self.values[1]

    @classmethod
    def from_raw(cls, raw: Any) -> CounterRecord | None:
        """The record of a raw one, or None when it is not shaped as the dispatch mode writes it."""
        if not isinstance(raw, list) or len(raw) < 4:
            return None
        return cls(raw[0], raw[1], raw[2], raw[3], raw[4:])

    def to_raw(self) -> list[Any]:
        return [self.start_ns, self.end_ns, self.tid, self.name, *self.values]


def counter_records(items: Iterable[Any]) -> list[CounterRecord]:
    """The records of a raw ``l2`` stream (others left out); records already decoded pass as
    they are."""
    return decoded(items, CounterRecord)


class CounterSetRecord(NamedTuple):
    """What the iteration's counter records count (``l2_events`` stream, one record per
    iteration): the ``events`` (perf's names, in the records' value order) and their
    ``source``: ``LLC`` / ``CACHE_GENERIC`` (cache events: accesses, misses) or ``software``
    (the diagnostic: not cache events)."""

    events: tuple[str, ...]
    source: str | None

    @classmethod
    def from_raw(cls, raw: Any) -> CounterSetRecord | None:
        if not isinstance(raw, dict):
            return None
        events, source = raw.get("events"), raw.get("source")
        if not isinstance(events, list) or not (source is None or isinstance(source, str)):
            return None
        return cls(tuple(events), source)

    @classmethod
    def of(cls, items: Iterable[Any]) -> CounterSetRecord | None:
        """The iteration's counter set (its stream's first record), or None."""
        for raw in items:
            return cls.from_raw(raw)
        return None

    def to_raw(self) -> dict[str, Any]:
        return {"events": list(self.events), "source": self.source}
