"""task_memory: what each operator allocates, every iteration's peak, and what was live at an OOM.

Two depths, one switch (``"task_memory": "on"``):

* **step tier** (always, cheap): the process's RSS and high-water mark sampled every 20 ms and at
  each iteration's hand-over, and on CUDA the caching allocator's counters
  (:mod:`jobprof.plugins.task_memory.sampler`): ``memory_record`` rows ``Process RSS`` (and
  ``PyTorch (sampled)`` on CUDA), each iteration's peak RSS;
* **operator tier** (when the operator capture runs: ``task_trace``, ``aicpu``, ...): every
  allocation and free of PyTorch's allocators as Kineto records them with memory profiling,
  the core stream ``op_memory``: ``operator_memory`` (one row per allocation, named by its
  operator, msprof's columns and empty/negative rules), ``memory_record`` rows ``PyTorch``, the
  exact peak per iteration and what held it.

Also a memory counter track in the master timeline, a ``jobprof summary`` / ``report`` section
(peak per rank and iteration, holders at the peak, a chart) with findings (creep, fragmentation,
one operator holding the peak, an OOM), and OOM forensics (:mod:`jobprof.plugins.task_memory.oom`).
Nothing the program can read is reset (no ``reset_peak_memory_stats``, no ``clear_refs``).
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    JSON,
    Config,
    ExportContext,
    Iteration,
    PluginSession,
    Section,
    Streams,
    StreamsOut,
    WriterSpec,
    hookimpl,
)
from jobprof.plugins.task_memory import oom
from jobprof.plugins.task_memory.report import iteration_digest, rank_facts, sections
from jobprof.plugins.task_memory.sampler import END_SLACK_NS, MemorySampler
from jobprof.plugins.task_memory.writer import (
    MODULES,
    SAMPLES,
    add_to_master,
    render_memory_record,
    render_operator_memory,
)

if TYPE_CHECKING:
    from jobprof.plugin import Profile, Timeline

NAME = "task_memory"
#: iteration methods whose hand-over happens at the iteration's end, on the training thread
ON_TIME = frozenset({"optimizer_step", "explicit"})


class _State:
    """The plugin's per-run objects (kept on the session)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.sampler = MemorySampler(torch)
        self.last_index = 0
        self.history = ""  # what was done about the CUDA allocator's history


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {"task_memory": {"default": "off"}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on("task_memory")


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    import torch

    state = _State(torch)
    session.attach(NAME, state)
    session.request_op_memory()
    state.sampler.start()
    session.set_info(NAME, {"rss": state.sampler.rss_source, "period_ms": 20})


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut:
    state: _State = session.attached(NAME)
    sampler = state.sampler
    sampler.note_device()
    if sampler.cuda_device is not None and not state.history:
        state.history = oom.start_history(state.torch)
        session.set_info(NAME, {**(session.get_info(NAME) or {}), "cuda_history": state.history})
    # the end state of the iteration when the program has not run since its end: the optimizer
    # step and jobprof.step() hand an iteration over as it ends (what jobprof did meanwhile is
    # its own), or the hand-over follows closely; else a sample of the next one
    late = time.monotonic_ns() - iteration.end_ns
    on_time = iteration.method in ON_TIME or 0 <= late <= END_SLACK_NS
    sampler.sample(cuda=True, at=iteration.end_ns - 1 if on_time else None)
    state.last_index = iteration.index
    streams: dict[str, Any] = {SAMPLES: partial(sampler.take, iteration)}
    calls = session.module_calls()
    if calls is not None:  # the operator tier records allocations: name their modules
        streams[MODULES] = partial(calls.take, iteration)
    return streams


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    state: _State = session.attached(NAME)
    died = oom.died_of_oom()
    rss, hwm = state.sampler.current() if died is not None else (-1, -1)
    state.sampler.stop()
    if died is None:
        return
    try:
        cuda = oom.cuda_digest(state.torch, state.sampler.cuda_device)
    except Exception as exc:
        cuda = {"error": f"the allocator's snapshot failed: {type(exc).__name__}: {exc}"}
    session.set_info("memory_oom", oom.digest(died, state.last_index + 1, rss, hwm, cuda))


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [
        WriterSpec(
            "operator_memory",
            "csv",
            render_operator_memory,
            "one row per allocation an operator made (operator tier): size, when, how long, "
            "the allocator's totals at both ends",
        ),
        WriterSpec(
            "memory_record",
            "csv",
            render_memory_record,
            "the allocator's totals after each allocation and free, and the process's RSS (sampled)",
        ),
    ]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    add_to_master(ctx, timeline)


@hookimpl
def jobprof_iteration_facts(iteration: Iteration, streams: Streams) -> JSON:
    return iteration_digest(iteration, streams)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return sections(profile)
