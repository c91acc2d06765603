"""l2: L2 / last-level cache hit rate per task (``summary/l2_cache_<dev>_<model>_<iter>.csv``).

Where the numbers come from:

* CPU jobs: the last-level-cache counters of the training thread (``perf_event_open``, see
  :mod:`jobprof.ops.perfcounters`): ``LLC-loads`` / ``LLC-load-misses``, else the generic
  ``cache-references`` / ``cache-misses``.  They are read around every operator by a
  TorchDispatchMode on the training thread (:mod:`jobprof.plugins.l2.counting`) and summed per
  op_summary task at export (:mod:`jobprof.plugins.l2.join`).  Hit Rate = (accesses - misses) /
  accesses.  Work torch hands to its intra-op threads is not counted (per-thread counters).
* CUDA jobs: CUPTI's ``lts__t_sector_hit_rate.pct`` per kernel, through the operator capture
  (UNVERIFIED on a GPU so far).
* Victim Rate is always N/A: no source here counts the evictions caused by misses.

Without counters (most VMs expose none, or perf_event_paranoid forbids them) the plugin says
so once on stderr with the reason, records ``{"available": false, "reason": ...}`` under
``l2`` in info.json (``jobprof summary`` shows it), writes no l2_cache file, and the job runs
as usual.  Nothing is estimated in their place.

Cost: with counters, every operator on the training thread goes through a Python
``__torch_dispatch__`` call and two counter reads, and the operator capture then records three
events per operator instead of one (``aten::mm > PythonDispatchMode > aten::mm``).  Measured on
this project's 2-vCPU KVM guest (software events, a loop of small ``torch.add``): the mode and
reads alone cost ~20 us per operator (of which ~7 us is torch's dynamo-disable wrapper around
every ``__torch_dispatch__``, and ~2-4 us per read syscall); in a real profiled run a small
operator took 40-130 us with ``l2`` against 4-15 us with the operator capture alone.  ``l2`` is
an opt-in, costly switch: leave it off when timing matters (operator durations recorded in the
same run include the overhead; the aicpu split counts the outer layer as dispatch).

Limits: the mode is entered at the first root-module forward and left at session end; a user
dispatch mode entered before that forward and exited after it would pop ours instead (torch
pops the top of the mode stack).  Counters are per thread: operators on other threads (a CUDA
job's autograd threads, user threads) are not counted.

Diagnostic: ``JOBPROF_L2_EVENTS=software`` counts the kernel's software events (task-clock,
page-faults) instead, to exercise the whole counter path on machines without cache counters.
The raw ``l2`` stream then holds those values; the CSV shows no rates (they are not cache
events) and every Hit Rate is N/A.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.ops import perfcounters
from jobprof.plugin import JSON, Config, Iteration, PluginSession, Section, StreamsOut, WriterSpec, hookimpl
from jobprof.plugins.l2.counting import OpCounter
from jobprof.plugins.l2.join import CUPTI_METRICS
from jobprof.plugins.l2.report import l2_sections, rank_facts
from jobprof.plugins.l2.writer import EVENTS_STREAM, STREAM, render_csv

if TYPE_CHECKING:
    from jobprof.plugin import Profile

#: diagnostic switch: ``software`` counts task-clock and page-faults instead of cache events
EVENTS_ENV = "JOBPROF_L2_EVENTS"
_SETS = (("LLC", perfcounters.LLC), ("CACHE_GENERIC", perfcounters.CACHE_GENERIC))


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {"l2": {"default": "off"}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on("l2")


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    import torch

    wanted = os.environ.get(EVENTS_ENV, "")
    if wanted not in ("", "software"):
        session.reporter.warning(f"l2: {EVENTS_ENV}={wanted!r} is not known (only 'software'); ignored")
        wanted = ""
    if not wanted and _cuda(torch):
        session.request_ops(cupti_metrics=CUPTI_METRICS)
        session.set_info("l2", {"available": True, "source": "CUPTI", "metrics": list(CUPTI_METRICS)})
        return
    if wanted == "software":
        source, specs = "software", perfcounters.SOFTWARE
        reason = perfcounters.probe(specs)
    else:
        reasons = []
        for source, specs in _SETS:  # noqa: B007 (the set that opens is used below)
            reason = perfcounters.probe(specs)
            if reason is None:
                break
            reasons.append(reason)
        reason = "; ".join(reasons) if reason is not None else None
    if reason is not None:
        session.set_info("l2", {"available": False, "reason": reason})
        session.reporter.warning(f"l2: L2 cache data unavailable: {reason}; no l2_cache files are written "
                                 "(the job is not affected)")
        return
    counter = OpCounter(specs, source)
    session.attach("l2", counter)
    session.set_info("l2", {"available": True, "source": source, "events": counter.events})
    session.request_ops(shapes=False)  # the tasks the counts are joined to

    def on_root(module: Any) -> None:  # the first root forward runs on the training thread
        if counter.installed:
            return
        problem = counter.install()
        if problem is not None:
            session.reporter.warning(f"l2: counters could not be opened on the training thread: {problem}; "
                                     "no L2 data")

    session.on_root_module(on_root)


def _cuda(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut | None:
    counter = session.attached("l2")
    if counter is None or not counter.active:
        return None
    # selected on the sink thread; the training thread only builds the partial
    return {STREAM: partial(counter.take, iteration.start_ns, iteration.end_ns),
            EVENTS_STREAM: [{"events": counter.events, "source": counter.source}]}


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    counter = session.attached("l2")
    if counter is None:
        return
    counter.remove()
    if counter.dropped:
        session.reporter.warning(f"l2: {counter.dropped} operator reading(s) were not kept: more than "
                                 "200,000 were waiting for an iteration to end")
    if counter.unread:
        session.reporter.warning(f"l2: {counter.unread} operator reading(s) had no counts (the kernel had "
                                 "multiplexed the counters out); those operators have no hit rate")


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [WriterSpec("l2_cache", "csv", render_csv,
                       "one row per task: L2 / last-level cache hit rate (N/A without cache counters)")]


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return l2_sections(profile)
