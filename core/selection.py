"""Which part of a profile a command looks at: ``--iterations 5-20`` and ``--rank R``."""

from __future__ import annotations

import re

import attrs

_RANGE = re.compile(r"^\s*(\d+)?\s*(-)?\s*(\d+)?\s*$")


def _iterations(text: str | None) -> tuple[int, int] | None:
    if text is None or text == "":
        return None
    match = _RANGE.match(text)
    if not match or not (match.group(1) or match.group(3)):
        raise ValueError(f"--iterations {text!r}: expected N, A-B, A- or -B (iterations count from 1)")
    first, dash, last = match.groups()
    low = int(first) if first else 1
    high = (int(last) if last else 2**62) if dash else low
    if low < 1 or high < low:
        raise ValueError(f"--iterations {text!r}: the range is empty")
    return low, high


@attrs.frozen
class Selection:
    """Iterations (inclusive, 1-based) and ranks to keep; None keeps all."""

    iterations: tuple[int, int] | None = attrs.field(default=None, converter=lambda v: (
        _iterations(v) if isinstance(v, str) or v is None else tuple(v)))
    ranks: frozenset[int] | None = attrs.field(default=None, converter=lambda v: (
        None if v is None else frozenset(v)))

    def has_iteration(self, index: int) -> bool:
        return self.iterations is None or self.iterations[0] <= index <= self.iterations[1]

    def has_rank(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def describe(self) -> dict[str, object]:
        """The selection as ``summary --json`` shows it."""
        its = None
        if self.iterations is not None:
            low, high = self.iterations
            its = f"{low}-" if high >= 2**62 else f"{low}-{high}"
        return {"iterations": its, "ranks": sorted(self.ranks) if self.ranks is not None else None}


ALL = Selection()
