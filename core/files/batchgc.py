"""The cyclic garbage collector's thresholds for the processes that read profiles back.

Reading an iteration builds hundreds of thousands of containers (a Kineto window decoded into
dicts and lists, its records, the rendered rows) that stay alive until the iteration is
written, so CPython's default thresholds (700, 10, 10) run a full collection every few
iterations, each traversing everything alive: measured on 30 iterations of a transformer's
operator tier, 20 full collections took 1.3 s of a 3.3 s ``jobprof export`` (orjson decoded
at 32 MB/s instead of 100).  What these processes make is freed by reference counting (the
export breaks its one cycle, ``ExportContext.memo``), so a collection seldom finds anything;
it still runs, only less often.  Never called in a profiled job: its collector is the
program's.
"""

from __future__ import annotations

import gc

#: a young collection every 50,000 net allocations, the middle one every 20 of those, a full one
#: every 100 middle ones (and only when the survivors grew by a quarter, CPython's own rule)
THRESHOLDS = (50_000, 20, 100)


def tune() -> None:
    """Set :data:`THRESHOLDS`, at a command's or worker's start (never in the profiled job)."""
    gc.set_threshold(*THRESHOLDS)
