"""Where an iteration's time went: one partition of ``[start, end)`` into six parts.

Plugins report spans by category through ``jobprof_iteration_spans``; this module paints the
iteration with them, first category first, so every nanosecond lands in exactly one part and
the parts add up to the iteration time:

0. ``profiler``: jobprof's own hand-over at the previous iteration's end, on the training thread
   (the core's ``profiler`` stream: the detector's timestamp until the raw line was queued; with
   task_trace on, mostly the profiler-session swap).  Shown so its cost is never mistaken for
   the job's; other per-call costs of the collectors (hooks, probes) are spread inside the parts.
1. ``data_wait``: the loop waited for its DataLoader (dp).
2. ``communication_not_overlapped``: collectives in flight while no operator computed
   (hccl spans minus task_trace's compute spans, as msprof's Overlap Analysis
   ``Communication(Not Overlapped)``); without task_trace, the collectives the loop is known to
   have waited for (``communication_blocking``: synchronous calls, DDP's wait for its last
   buckets).
3. ``forward_backward``: the rest of FP Start .. BP End (forward and backward).
4. ``refresh``: the rest of BP End .. iteration end (the optimizer step: msprof's "refresh").
5. ``free``: everything else (host work outside the phases, e.g. logging, zero_grad).

A part no plugin can see is None (``N/A``), not 0: without dp there is no data wait to show,
and its time stays in the phase it fell in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from jobprof.plugin import results  # the span categories: the hook contract's names
from jobprof.plugin.opview import clip, subtract, union
from jobprof.plugin.values import Iteration

#: the parts, in painting order; their sum is the iteration time
PARTS = ("profiler", "data_wait", "communication_not_overlapped", "forward_backward", "refresh", "free")
LABELS = {"iteration": "iteration", "profiler": "jobprof hand-over", "data_wait": "data wait",
          "communication_not_overlapped": "comm not overlapped", "forward_backward": "FP→BP",
          "refresh": "refresh", "free": "free"}

Spans = list[tuple[int, int]]


def _total(spans: Spans) -> int:
    return sum(b - a for a, b in spans)


def collect(answers: Iterable[Mapping[str, list] | None]) -> dict[str, Spans]:
    """Merge the plugins' hook answers (checked by the manager) into ``{category: spans}``."""
    out: dict[str, Spans] = {}
    for answer in answers:
        for category, spans in (answer or {}).items():
            out.setdefault(category, []).extend(spans)
    return out


def paint(it: Iteration, spans: Mapping[str, Spans]) -> tuple[dict[str, int | None], dict[str, str]]:
    """The iteration's parts in ns (None where unknown) and how each uncertain one was found."""
    start, end = it.start_ns, it.end_ns
    basis: dict[str, str] = {}
    taken: Spans = []

    def take(raw: Spans) -> int:
        nonlocal taken
        mine = subtract(clip(union(raw), start, end), taken)
        taken = union(taken + mine)
        return _total(mine)

    parts: dict[str, int | None] = dict.fromkeys(PARTS)
    if results.PROFILER in spans:
        parts["profiler"] = take(spans[results.PROFILER])
    if results.DATA_WAIT in spans:
        parts["data_wait"] = take(spans[results.DATA_WAIT])
    if results.COMMUNICATION in spans and results.COMPUTE in spans:
        exposed = subtract(clip(union(spans[results.COMMUNICATION]), start, end),
                           clip(union(spans[results.COMPUTE]), start, end))
        parts["communication_not_overlapped"] = take(exposed)
        basis["communication_not_overlapped"] = "compute spans (task_trace)"
    elif results.COMMUNICATION_BLOCKING in spans or results.COMMUNICATION in spans:
        parts["communication_not_overlapped"] = take(spans.get(results.COMMUNICATION_BLOCKING, []))
        basis["communication_not_overlapped"] = "blocking collectives only (no task_trace)"
    fp = spans.get(results.FORWARD_BACKWARD)
    if fp is None and it.fp_start_ns is not None and it.bp_end_ns is not None:
        fp = [(it.fp_start_ns, it.bp_end_ns)]
    if fp is not None:
        parts["forward_backward"] = take(fp)
    refresh = spans.get(results.REFRESH)
    if refresh is None and it.bp_end_ns is not None:
        refresh = [(it.bp_end_ns, end)]
    if refresh is not None:
        parts["refresh"] = take(refresh)
    parts["free"] = (end - start) - _total(taken)
    return parts, basis
