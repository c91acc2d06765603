"""Which part of a profile a command looks at: ``--iterations 5-20`` and ``--rank R``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

#: the upper bound of an open range (``--iterations 5-``)
OPEN = 2**62
_RANGE = re.compile(r"^\s*(\d+)?\s*(-)?\s*(\d+)?\s*$")


def _iterations(text: str | None) -> tuple[int, int] | None:
    if text is None or text == "":
        return None
    match = _RANGE.match(text)
    if not match or not (match.group(1) or match.group(3)):
        raise ValueError(f"--iterations {text!r}: expected N, A-B, A- or -B (iterations count from 1)")
    first, dash, last = match.groups()
    low = int(first) if first else 1
    high = (int(last) if last else OPEN) if dash else low
    if low < 1 or high < low:
        raise ValueError(f"--iterations {text!r}: the range is empty")
    return low, high


def window(iterations: tuple[int, int]) -> str:
    """``(5, 20)`` -> ``"5-20"``; an open range ``(5, OPEN)`` -> ``"5-"``."""
    low, high = iterations
    return f"{low}-" if high >= OPEN else f"{low}-{high}"


#: an inclusive run of numbers, ``(first, last)``
Run = tuple[int, int]


def merged(runs: Iterable[Run]) -> list[Run]:
    """Inclusive runs sorted, overlapping and adjacent ones joined (never expanded to numbers:
    a stray index of 2**62 must not cost memory)."""
    out: list[Run] = []
    for first, last in sorted(runs):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def runs(numbers: Iterable[int]) -> list[Run]:
    """Runs of consecutive numbers: ``{1, 2, 3, 7}`` -> ``[(1, 3), (7, 7)]``."""
    return merged((n, n) for n in numbers)


def run_texts(found: Iterable[Iterable[int]]) -> list[str]:
    """Runs as text: ``[(1, 5), (9, 9)]`` -> ``["1-5", "9"]``."""
    return [f"{first}-{last}" if last > first else str(first) for first, last in found]


def ranges(numbers: Iterable[int]) -> list[str]:
    """Runs of consecutive numbers as text: ``[1, 2, 3, 5]`` -> ``["1-3", "5"]``."""
    return run_texts(runs(numbers))


def narrowed(described: Mapping[str, str | Iterable[int] | None], sep: str = ", ",
             rank_sep: str = ",") -> str:
    """A model's ``selection`` (:meth:`Selection.describe`) as text, ``"iterations 5-20, ranks 0,1"``;
    empty when nothing was narrowed."""
    return sep.join(f"{k} {v if k == 'iterations' else rank_sep.join(map(str, v))}"
                    for k, v in described.items() if v is not None)


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

    def describe(self) -> dict[str, str | list[int] | None]:
        """The selection as ``summary --json`` shows it."""
        its = window(self.iterations) if self.iterations is not None else None
        return {"iterations": its, "ranks": sorted(self.ranks) if self.ranks is not None else None}


ALL = Selection()
