"""task_trace: every task of each iteration (op_summary, op_statistic, task_time CSV and JSON)
and the host, device, flow and overlap layers of the master timeline.

Option ``task_trace`` (``task_time`` is its newer name; the core folds it in): ``on``/``l1``
records each operator's input shapes, dtypes and strides; ``l0`` records timing only (cheaper
capture, less raw data): the Input/Output Shapes, Data Types and Formats columns are N/A.
Deviation from msprof: at ``l0`` msprof also leaves OP Type N/A; jobprof fills it, because it
is the operator name without its namespace and costs nothing to record.

A task (an op_summary row) is what ran on the device (see :mod:`jobprof.plugin.opview`): on a CUDA
job each kernel, memcpy and memset; on a CPU-only job each top-level dispatcher operator
(``aten::linear`` called from Python is one task, its inner ``aten::addmm`` is not).

op_summary columns and their PyTorch source (CPU-only job / CUDA job):

==================  ===========================================================================
Device_id           CPU: ``LOCAL_RANK`` (0 alone) / CUDA: the process's device index
Model ID            4294967295 (step mode: eager execution, iteration = training step)
Task ID             1-based sequence number of the task on its stream within the iteration
Stream ID           CPU: the OS thread id that executed the operator / CUDA: the CUDA stream
Op Name             CPU: the operator (``aten::mm``) / CUDA: the kernel name (memcpy/memset kind)
OP Type             the operator name without namespace (``mm``); CUDA: of the operator that
                    launched the kernel (the kernel's own name when no operator is known)
OP State            N/A per iteration (one iteration cannot tell); the CANN 8 layout measures it:
                    ``static`` when the operator ran with these shapes in every iteration it
                    ran in, else ``dynamic`` (jobprof.analysis.cann8, docs/msprof-tools.md)
Task Type           the engine that ran it: ``CPU``, ``CUDA``, ``MEMCPY``, ``MEMSET``,
                    ``COMMUNICATION`` (``c10d::`` operators, NCCL kernels)
Task Start Time(us) start, epoch µs (Kineto timestamp), exact, with msprof's trailing TAB
Task Duration(us)   the operator's / kernel's duration (Kineto)
Task Wait Time(us)  max(0, start - end of the previous task of the device), 0 for the first
Block Dim           CPU: N/A (no launch grid) / CUDA: blocks in the kernel grid (x*y*z, Kineto
                    kernel metadata); N/A for memcpy/memset
Mix Block Dim       N/A: the second block count of Ascend's mixed cube+vector kernels
HF32 Eligible       N/A: per-operator HF32 (Ascend's reduced-precision float32 mode) eligibility;
                    PyTorch records no per-operator TF32 decision
Input Shapes        tensor arguments' shapes (Kineto record_shapes), ``;`` between tensors, ``,``
                    between dims; non-tensor arguments left out (see ``formats``); CUDA: the
                    launching operator's inputs
Input Data Types    torch dtype names (``float32``, ``bfloat16``, ``int64``...)
Input Formats       memory layout from the strides: ``contiguous``, ``channels_last``,
                    ``channels_last_3d`` or ``strided``
Output Shapes       from the operator's semantics (``Task.outputs``, jobprof.plugin.opmath) where known,
Output Data Types   else N/A (Kineto records no outputs)
Output Formats      N/A: output strides are not recorded
Context ID          N/A: Ascend's sub-task context of an operator split over several contexts
==================  ===========================================================================

then the ``aic_metrics`` group's columns when one was chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    JSON,
    Config,
    DiffTable,
    ExportContext,
    PluginSession,
    Section,
    Spans,
    Streams,
    WriterSpec,
    hookimpl,
)
from jobprof.plugins.task_trace.diff import operator_tables
from jobprof.plugins.task_trace.report import compute_spans, rank_facts, top_sections
from jobprof.plugins.task_trace.summary import render_op_statistic, render_op_summary, render_task_time_csv
from jobprof.plugins.task_trace.trace import DEFAULT_LIMIT, LIMIT_KEY, add_to_master, render_task_time_json

if TYPE_CHECKING:
    from jobprof.plugin import Profile, Timeline


def enabled(config: Config | None) -> bool:
    """``config`` None (listing every file) counts as on."""
    return config is None or config.is_on("task_trace")


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {
        "task_trace": {
            "default": "on",
            "description": "op_summary, op_statistic, task_time files; l0: timing only (no shapes)"},
        LIMIT_KEY: {
            "type": "integer", "minimum": 1000, "maximum": 1_000_000_000, "default": DEFAULT_LIMIT,
            "description": "Operator-tier events one iteration may put in its master timeline (and "
                           "tasks in its task_time timeline); an iteration over it keeps the first "
                           "ones in time order, marks the cut in the file, says so once and records "
                           "it in info.json. The CSVs always keep every task."}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on("task_trace")


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    session.request_ops(shapes=session.config.level("task_trace") != "l0")


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [
        WriterSpec("op_summary", "csv", render_op_summary,
                   "one row per task: ids, times, inputs, aic_metrics columns"),
        WriterSpec("op_statistic", "csv", render_op_statistic,
                   "tasks grouped by OP Type and Core Type: count, total/min/avg/max, ratio"),
        WriterSpec("task_time", "csv", render_task_time_csv, "one row per task: stream, id, start, stop"),
        WriterSpec("task_time", "json", render_task_time_json, "device tasks, one track per stream"),
    ]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    if enabled(ctx.config):
        add_to_master(ctx, timeline)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return top_sections(profile)


@hookimpl
def jobprof_iteration_spans(streams: Streams) -> Spans | None:
    return compute_spans(streams)


@hookimpl
def jobprof_diff_tables(profile: Profile, device: int) -> list[DiffTable]:
    return operator_tables(profile, device)
