"""training_trace: the step trace (FP Start, BP End, Iteration End, Data Aug Bound, Reduce).

The core finds iterations and the automatic FP/BP times; this plugin resolves ``fp_point`` /
``bp_point`` to modules, keeps one small record per iteration, and writes ``step_trace``
CSV and JSON files.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    Config,
    ExportContext,
    Iteration,
    PluginSession,
    Spans,
    Streams,
    StreamsOut,
    WriterSpec,
    hookimpl,
)
from jobprof.plugins.training_trace.points import PointCollector
from jobprof.plugins.training_trace.report import phase_spans
from jobprof.plugins.training_trace.writer import STREAM, add_to_master, render_csv, render_json

if TYPE_CHECKING:
    from jobprof.plugin import Timeline


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {
        "properties": {
            "training_trace": {"default": "off"},
            "fp_point": {"default": "", "description": "module name (qualified path or class name)"},
            "bp_point": {"default": "", "description": "module name (qualified path or class name)"},
        }
    }


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on("training_trace")


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    collector = PointCollector(session.config.get("fp_point", ""), session.config.get("bp_point", ""))
    session.attach(STREAM, collector)
    session.on_root_module(collector.on_root)


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut:
    # built on the core's sink thread: the training thread only creates the partial
    return {STREAM: partial(session.attached(STREAM).take, iteration)}


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    collector = session.attached(STREAM)
    collector.remove()
    for note in collector.unmatched():
        session.reporter.warning(note)


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [
        WriterSpec("step_trace", "csv", render_csv,
                   "one row per iteration: FP/BP, refresh, data bound, reduces"),
        WriterSpec("step_trace", "json", render_json, "Chrome-trace events of the step trace"),
    ]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    if ctx.records(STREAM) or (ctx.config is not None and ctx.config.is_on("training_trace")):
        add_to_master(ctx, timeline)


@hookimpl
def jobprof_iteration_spans(iteration: Iteration, streams: Streams) -> Spans | None:
    return phase_spans(iteration, streams)
