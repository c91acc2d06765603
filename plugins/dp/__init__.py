"""dp: what the input pipeline costs each step, from every DataLoader in the job.

The loop's side (request, wait, batches already buffered, which worker produced the batch) is
recorded by patching the DataLoader iterator classes; the workers' side (sample fetch and
collate times) comes from the dataset fetchers inside the workers, sent to the owning process
over a datagram channel.  Writes ``dp_<dev>_<model>_<iter>.csv`` and adds a ``DataLoader``
process to the master timeline.

Switch: ``"dp": "on"``; left unset it follows ``aicpu`` (msprof collects data-preprocessing
data with AI CPU data), and ``"dp": "off"`` turns it off even then.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    DATA_WAIT,
    JSON,
    Config,
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
from jobprof.plugins.dp.loader import LoaderCollector
from jobprof.plugins.dp.report import dp_sections, rank_facts, wait_spans
from jobprof.plugins.dp.writer import STREAM, add_to_master, render_csv

if TYPE_CHECKING:
    from jobprof.plugin import Profile, Timeline


def enabled(config: Config) -> bool:
    value = config.get("dp", "")
    return value == "on" or (value in ("", None) and config.is_on("aicpu"))


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {"dp": {
        "$ref": "#/$defs/switch", "default": "",
        "description": "DataLoader timings (dp files); unset: follows aicpu"}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return enabled(config)


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    import torch

    collector = LoaderCollector()
    session.attach(STREAM, collector)
    collector.install(torch)


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut:
    # built on the core's sink thread: the training thread only creates the partial
    return {STREAM: partial(session.attached(STREAM).take, iteration.end_ns)}


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    collector = session.attached(STREAM)
    collector.uninstall()
    lost = sum(collector.dropped.values())
    if collector.overflow:
        session.reporter.warning(f"dp: {collector.overflow} DataLoader record(s) were not kept: more than "
                                 "100,000 were waiting for an iteration to end")
    if lost:
        session.reporter.warning(f"dp: {lost} DataLoader worker record(s) were dropped because the "
                                 "profiled process read them too slowly; the loop-side records are complete")
    channel = collector.channel
    if channel is not None and channel.refused:
        who = channel.first_refused
        first = f"uid {who.uid}, pid {who.pid}" if who is not None and who.pid is not None else "unknown"
        session.reporter.warning(
            f"dp: refused {channel.refused} connection(s) to the DataLoader channel from processes "
            f"that are not this job's workers (first: {first}); nothing they sent was recorded")
    bad = (channel.malformed if channel is not None else 0) + collector.invalid
    if bad:
        session.reporter.warning(f"dp: {bad} malformed DataLoader worker record(s) were dropped")


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [WriterSpec("dp", "csv", render_csv,
                       "DataLoader events: request/dequeue in the loop, fetch/collate in workers")]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    add_to_master(ctx, timeline)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return dp_sections(profile)


@hookimpl
def jobprof_iteration_spans(streams: Streams) -> Spans | None:
    return wait_spans(streams)


@hookimpl
def jobprof_breakdown_sources() -> list[PartSource]:
    return [PartSource(DATA_WAIT, "no DataLoader was seen")]
