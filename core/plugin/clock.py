"""Clock anchors and the time axis of every timeline file.

Events are stamped with ``time.monotonic_ns()`` (integer ns) and converted at export.  The rule
every timeline writer follows (:class:`TimeAxis`):

* ``ts`` is **µs since the job's time base** (``time_base_ns``: an epoch instant in whole
  seconds, taken once by the process that names the job's PROF_ folder and inherited by every
  other process of the job through ``JOBPROF_TIME_BASE_NS``; recorded in info.json).  Values
  stay below ~10**12 µs for any job shorter than 11 days, where a double holds every ns exactly,
  so a reader that turns µs into ns with ``llround(ts * 1000)`` (Perfetto) or keeps doubles
  (Chrome) recovers the integer ns.  Epoch µs (~1.7e15) would resolve only 0.25 µs.
* ``dur`` is ``(end_ns - start_ns) / 1000`` from the two integer ns, never a difference of two
  rounded ``ts``: then ``ts + dur`` is the end in ns for the reader too, and spans that nest
  in ns nest in the file.
* All ranks of a job share the base, so per-iteration files of different ranks, ``merge`` and
  the CANN 8 layout share one axis; the wall clock of a ``ts`` is ``time_base_ns + ts * 1000``.
* CSV files keep msprof's absolute epoch µs with 3 decimals (:meth:`ClockAnchor.stamp`).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any

import attrs


@attrs.frozen
class ClockAnchor:
    """One instant read on the wall clock and the monotonic clocks of this process."""

    epoch_ns: int
    monotonic_ns: int
    monotonic_raw_ns: int

    @classmethod
    def now(cls) -> ClockAnchor:
        before = time.monotonic_ns()
        # whole microseconds, as start_info records it, so offline export converts identically
        epoch = time.time_ns() // 1000 * 1000
        after = time.monotonic_ns()
        raw_clock = getattr(time, "CLOCK_MONOTONIC_RAW", None)
        raw = time.clock_gettime_ns(raw_clock) if raw_clock is not None else after
        return cls(epoch, (before + after) // 2, raw)

    def to_epoch_ns(self, monotonic_ns: int) -> int:
        """Epoch nanoseconds of a ``time.monotonic_ns()`` value from the same boot."""
        return self.epoch_ns + (monotonic_ns - self.monotonic_ns)

    def to_us(self, monotonic_ns: int) -> float:
        """Epoch microseconds as a float (about 0.25 us resolution at today's epoch).

        ``int / int``: correctly rounded (an int above 2**53 divided by ``1000.0`` would be
        rounded to 256 ns first)."""
        return self.to_epoch_ns(monotonic_ns) / 1000

    def stamp(self, monotonic_ns: int) -> str:
        """Exact epoch microseconds with 3 decimals, as CSV files print them."""
        ns = self.to_epoch_ns(monotonic_ns)
        return f"{ns // 1000}.{ns % 1000:03d}"

    def info(self, prefix: str) -> dict[str, Any]:
        """msprof's start_info / end_info body (``prefix`` is ``Begin`` or ``End``)."""
        wall = dt.datetime.fromtimestamp(self.epoch_ns / 1e9)
        return {
            f"collectionDate{prefix}": wall.strftime("%Y-%m-%d %H:%M:%S.%f"),
            f"collectionTime{prefix}": str(self.epoch_ns // 1000),
            "clockMonotonicRaw": str(self.monotonic_raw_ns),
            # jobprof's own anchor: the clock every raw timestamp was taken with
            "clockMonotonic": str(self.monotonic_ns),
        }

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> ClockAnchor:
        # "0" is a time: only a missing begin falls back to the end
        begin = info.get("collectionTimeBegin")
        epoch_us = int(begin if begin not in (None, "") else info["collectionTimeEnd"])
        return cls(epoch_us * 1000, int(info["clockMonotonic"]), int(info.get("clockMonotonicRaw", 0)))


#: the job's time base (epoch ns), exported by the process that names the PROF_ folder
TIME_BASE_ENV = "JOBPROF_TIME_BASE_NS"
_SECOND = 1_000_000_000


def wall_minus_monotonic_ns(samples: int = 5) -> int:
    """``time.time_ns() - time.monotonic_ns()`` at one instant, to a few hundred ns.

    A single difference of two calls is off by however long the thread was preempted between
    them (tens of us to ms on a loaded machine), which shifts a whole window of Kineto events
    against the records taken on the monotonic clock.  Each sample brackets the wall read by
    two monotonic reads; the tightest bracket wins and its midpoint is used.
    """
    best_gap, best = -1, 0
    for _ in range(samples):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        gap = after - before
        if best_gap < 0 or gap < best_gap:
            best_gap, best = gap, wall - (before + after) // 2
    return best


def own_base(anchor: ClockAnchor) -> int:
    """The base of a process that inherited none: its anchor's second (also the fallback for
    profiles written before the base was recorded)."""
    return anchor.epoch_ns // _SECOND * _SECOND


def job_base(anchor: ClockAnchor, environ: Any = os.environ, inherit: bool = True) -> int:
    """This job's time base: the inherited one (``inherit``: the process joins a job named
    before it), else this process's own, exported to its children."""
    text = environ.get(TIME_BASE_ENV, "") if inherit else ""
    if text.isdigit():
        return int(text)
    base = own_base(anchor)
    environ[TIME_BASE_ENV] = str(base)
    return base


@attrs.frozen
class TimeAxis:
    """The timeline time rule (module docstring) for one recording process."""

    anchor: ClockAnchor
    base_ns: int

    @property
    def offset_ns(self) -> int:
        """Add to a monotonic ns to get ns since the base (for bulk conversion)."""
        return self.anchor.epoch_ns - self.anchor.monotonic_ns - self.base_ns

    def us(self, monotonic_ns: int) -> float:
        """``ts``: µs since the base of a raw timestamp (int / int: correctly rounded)."""
        return (monotonic_ns + self.offset_ns) / 1000

    @staticmethod
    def dur(start_ns: int, end_ns: int) -> float:
        """``dur`` of a span from its integer ends."""
        return (end_ns - start_ns) / 1000


def ts_ns(value: float | str) -> int:
    """A timeline ``ts`` or ``dur`` (µs, a number or msprof's decimal string) in integer ns, as
    Perfetto reads it (``llround(v * 1000)``): exact for a file written by the rule above."""
    return round(float(value) * 1000)
