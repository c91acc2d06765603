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


def ranges(numbers: Iterable[int]) -> list[str]:
    """Runs of consecutive numbers: ``[1, 2, 3, 5]`` -> ``["1-3", "5"]``."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(numbers):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return out


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
