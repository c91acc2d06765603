"""task_memory's own records, read only by task_memory: each raw shape decoded here, once, and
read by its field names everywhere else.

The raw shapes stay as written (compact, and the golden files depend on them): the step tier's
samples (``memory_samples``: a dict per sample, :meth:`MemorySampler.take`), the module calls
(``memory_modules``: ``[start_ns, end_ns, thread, path]`` lists, the core's recorder), and the
rank facts' rows (JSON lists: ``series``' 9 slots, ``[name, bytes]`` holders, ``[name, bytes,
iterations]`` survivors).  ``NamedTuple`` throughout: module calls come by the thousand per
iteration and a NamedTuple decodes ~1.4x faster than an attrs class, and a row is a tuple the
facts' JSON writes back as the same list (``list(row)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from jobprof.plugin import decoded


class MemorySample(NamedTuple):
    """One sample of the step tier (``memory_samples``; bytes, monotonic ns): the process's
    resident set (``rss``, -1 without procfs) and high-water mark, and on CUDA (else None) the
    caching allocator's counters of ``device``.  ``before``: the last sample taken before the
    iteration (the marks its peak is judged against)."""

    ns: int
    rss: int = -1
    hwm: int = -1
    allocated: int | None = None
    reserved: int | None = None
    max_allocated: int | None = None
    device: int | None = None
    before: bool = False

    @classmethod
    def from_raw(cls, raw: Any) -> MemorySample | None:
        """The sample of a raw one (None when it has no time: a raw store may hold anything)."""
        if not isinstance(raw, dict):
            return None
        get = raw.get
        ns = get("ns")
        if not isinstance(ns, int):
            return None
        return cls(ns, get("rss", -1), get("hwm", -1), get("allocated"), get("reserved"),
                   get("max_allocated"), get("device"), bool(get("before")))

    def to_raw(self) -> dict[str, Any]:
        """The raw sample, key for key as :meth:`MemorySampler.take` writes it."""
        raw: dict[str, Any] = {"ns": self.ns, "rss": self.rss, "hwm": self.hwm}
        if self.allocated is not None:
            raw.update(allocated=self.allocated, reserved=self.reserved, max_allocated=self.max_allocated,
                       device=self.device)
        if self.before:
            raw["before"] = True
        return raw


def memory_samples(items: Iterable[Any]) -> list[MemorySample]:
    """The samples of a raw ``memory_samples`` stream (others left out); samples already
    decoded pass as they are."""
    return decoded(items, MemorySample)


class ModuleCall(NamedTuple):
    """One module call of ``memory_modules`` (the core's recorder): on thread ``tid``, the
    module ``path`` in its root model (``Net.encoder.0``) ran from ``start_ns`` to ``end_ns``."""

    start_ns: int
    end_ns: int
    tid: int
    path: str

    @classmethod
    def from_raw(cls, raw: Any) -> ModuleCall | None:
        if isinstance(raw, list) and len(raw) == 4 and isinstance(raw[3], str):
            return cls(*raw)
        return None


def module_calls(raw: Iterable[Any]) -> list[ModuleCall]:
    """The module calls of a raw ``memory_modules`` stream (others left out)."""
    return [c for c in map(ModuleCall.from_raw, raw) if c is not None]


class Holder(NamedTuple):
    """Who held memory at a peak: an operator (and module) and its live bytes."""

    name: str
    bytes: int

    @classmethod
    def of(cls, rows: Iterable[Any] | None) -> list[Holder]:
        """The holders of a digest's or facts' ``[name, bytes]`` rows."""
        return [cls(*row) for row in rows or ()]


class Survivor(NamedTuple):
    """An operator whose allocations of the last iterations were never freed: ``bytes`` still
    live, made in ``iterations`` of them."""

    name: str
    bytes: int
    iterations: int

    @classmethod
    def of(cls, rows: Iterable[Any] | None) -> list[Survivor]:
        return [cls(*row) for row in rows or ()]


class SeriesRow(NamedTuple):
    """One iteration of a device's memory series (rank facts' ``series``; bytes, None where not
    known): the allocator's peak ``allocated`` / ``reserved`` and its count at the ``end``, the
    process's peak and end RSS (``rss_exact``: the peak is the kernel's high-water mark, not a
    sample), and the largest ``holder`` at the peak."""

    iteration: int
    allocated: int | None
    reserved: int | None
    rss_peak: int | None
    end: int | None
    rss_end: int | None
    holder: str | None
    holder_bytes: int | None
    rss_exact: bool = False

    @classmethod
    def of(cls, rows: Iterable[Any]) -> list[SeriesRow]:
        """The rows of a facts' ``series`` (JSON lists, or rows already decoded)."""
        return [cls(*row) for row in rows]


def digest_rss(digest: Mapping[str, Any]) -> tuple[int | None, int | None, bool]:
    """(peak RSS, end RSS, exact) of an iteration digest (its ``rss``: ``[peak, end, exact]``)."""
    peak, end, exact = digest.get("rss") or (None, None, False)
    return peak, end, exact
