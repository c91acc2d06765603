"""Clock anchors: events are stamped with ``time.monotonic_ns()`` and converted at export."""

from __future__ import annotations

import datetime as dt
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
        epoch_us = int(info.get("collectionTimeBegin") or info.get("collectionTimeEnd"))
        return cls(epoch_us * 1000, int(info["clockMonotonic"]), int(info.get("clockMonotonicRaw", 0)))
