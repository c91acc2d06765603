"""hccl: every torch.distributed collective and point-to-point operation -> hccl files.

Captured at the ``c10d`` dispatcher operators (see :mod:`.capture`), so DistributedDataParallel's
bucket all-reduces issued from C++ are there as well as every ``dist.*`` call, synchronous or
``async_op=True``.  Per operation: name, process group (name and global ranks), rank size,
dtype, element count, bytes, start, duration, and the nccl-tests algorithm and bus bandwidths
(:mod:`.collectives` has the formulas).  Files per iteration: ``hccl_*.json`` (a track per
process group) and ``communication_statistic_*.csv``; the step trace's Reduce pairs and the
master timeline's Communication and Overlap Analysis tracks read the same records.  Works
with task_trace off, at step-tier cost: no other operator is observed.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    JSON,
    Config,
    DiffTable,
    ExportContext,
    Iteration,
    PartSource,
    PluginSession,
    Section,
    Spans,
    Streams,
    StreamsOut,
    WriterSpec,
    hookimpl,
)
from jobprof.plugins.hccl.capture import Capture
from jobprof.plugins.hccl.diff import collective_tables
from jobprof.plugins.hccl.report import communication_sections, communication_spans, rank_facts
from jobprof.plugins.hccl.writer import STATISTIC, STREAM, add_tracks, render_json, render_statistic

if TYPE_CHECKING:
    from jobprof.plugin import Profile, Timeline


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {"hccl": {"default": "off"}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on("hccl")


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    import torch

    if not torch.distributed.is_available():
        session.reporter.warning("hccl: this torch has no torch.distributed; no collective is recorded")
        return
    # NCCL times a collective with CUDA events only when asked before the group exists; the
    # capture also asks each group it sees (gloo ignores both)
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    capture = Capture(torch, session.reporter.warning)
    capture.install()
    session.attach(STREAM, capture)


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut | None:
    capture = session.attached(STREAM)
    if capture is None:
        return None
    # built on the core's sink thread: the training thread only creates the partial
    return {STREAM: partial(capture.take, iteration)}


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    capture = session.attached(STREAM)
    if capture is None:
        return
    capture.uninstall()
    for note in capture.exit_notes():
        session.reporter.warning(note)


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [
        WriterSpec("hccl", "json", render_json, "collectives: a track per process group, an event per "
                   "operation with bytes, dtype, algbw / busbw"),
        WriterSpec(STATISTIC, "csv", render_statistic, "collectives per OP Type: count, total / min / "
                   "avg / max time, share"),
    ]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    add_tracks(ctx, timeline)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return communication_sections(profile)


@hookimpl
def jobprof_iteration_spans(streams: Streams) -> Spans | None:
    return communication_spans(streams)


@hookimpl
def jobprof_diff_tables(profile: Profile, device: int) -> list[DiffTable]:
    return collective_tables(profile, device)


@hookimpl
def jobprof_breakdown_sources() -> list[PartSource]:
    return [PartSource("communication_not_overlapped", "no collective was seen")]
