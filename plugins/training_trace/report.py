"""What the step trace tells ``jobprof summary``: the phases of each iteration.

The per-rank iteration table itself is the core's (``jobprof.analysis.summary``), painted from these spans.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobprof.plugin import FORWARD_BACKWARD, REFRESH, Iteration
from jobprof.plugins.training_trace.writer import STREAM, fp_bp


def phase_spans(iteration: Iteration, streams: Mapping[str, list[Any]]) -> dict[str, list] | None:
    """FP Start .. BP End and BP End .. the iteration's end, with marked points preferred."""
    if STREAM not in streams:
        return None
    fp, bp = fp_bp(iteration, streams[STREAM])
    out: dict[str, list] = {}
    if fp is not None and bp is not None and bp >= fp:
        out[FORWARD_BACKWARD] = [(fp, bp)]
    if bp is not None:
        out[REFRESH] = [(bp, iteration.end_ns)]
    return out
