"""Lanes: spread one track's spans over as few tracks as needed so that each track nests.

Spans can partially overlap on one thread or one process group (start A, start B, end A,
end B: marker ranges by id, asynchronous collectives); a Chrome trace track cannot show that,
so B goes to lane 1.  Lane 0 is the track itself.  Shared by the plugins that draw such spans.
"""

from __future__ import annotations

from collections.abc import Sequence

#: lane k of native thread t is drawn as tid ``t + k * LANE_STRIDE``: Linux thread ids stay
#: below 2**22 (the largest pid_max), so no lane can collide with another thread's id
LANE_STRIDE = 1 << 22


def assign_lanes(spans: Sequence[tuple[int, int]]) -> list[int]:
    """The lane of each ``(start, end)`` span: on every lane, spans nest or are disjoint.

    Greedy in (start, longest first) order: each span takes the lowest lane whose innermost
    still-open span contains it.  Touching spans (one ends where the next starts) share a lane.
    """
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], -spans[i][1]))
    lanes = [0] * len(spans)
    open_ends: list[list[int]] = []  # per lane: the ends of its enclosing spans, innermost last
    for i in order:
        start, end = spans[i]
        for lane, stack in enumerate(open_ends):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lanes[i] = lane
                break
        else:
            open_ends.append([end])
            lanes[i] = len(open_ends) - 1
    return lanes


def lane_tid(thread: int, lane: int) -> int:
    return thread + lane * LANE_STRIDE


def lane_name(track: str, lane: int) -> str:
    """``track`` itself for lane 0, else ``"<track> (lane <k>)"``."""
    return track if lane == 0 else f"{track} (lane {lane})"
