"""kineto: each iteration also as a trace in PyTorch profiler's own JSON format.

Option ``kineto_trace``: ``"on"`` / ``"off"`` (default ``"off"``).  It collects nothing: it
renders, per iteration, ``device_<id>/timeline/kineto_<dev>_<model>_<iter>.json`` from the raw
streams the other plugins keep, in the format ``torch.profiler``'s ``export_chrome_trace``
writes (``schemaVersion``, ``deviceProperties``, ``distributedInfo`` {backend, rank,
world_size}, ``traceEvents``, ``traceName``, ``displayTimeUnit``, ``baseTimeNanoseconds``), plus
a ``jobprof`` key saying what is in the file.  Perfetto (ui.perfetto.dev) and chrome://tracing
open one file as is; Holistic Trace Analysis (``HolisticTraceAnalysis``) reads a folder holding
one file per rank: ``jobprof kineto PROF_DIR`` gathers them (``<out>/iteration_<n>/``), then
``TraceAnalysis(trace_dir=".../iteration_<n>")``.

What each source adds:

==================  ========================================================================
iteration (core)    ``ProfilerStep#<n>`` (``user_annotation``) on the training thread, spanning
                    the iteration exactly; ``n = jobprof iteration - 1`` (torch.profiler counts
                    steps from 0, jobprof iterations from 1)
training_trace      ``Data Aug Bound``, ``FP_BP``, ``Iteration Refresh`` slices on the track
                    ``thread <t> (jobprof step phases)``
task_trace (ops)    every operator record as torch.profiler writes it: ``cpu_op`` (with
                    ``Input Dims`` / ``Input type`` / ``Input Strides`` unless task_trace is
                    ``l0``), ``user_annotation`` (record_function blocks), and on CUDA
                    ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` / ``gpu_user_annotation`` with
                    ``device``, ``stream``, ``correlation`` and ``cuda_runtime`` launches
                    (written, not verified on a GPU here)
hccl                each collective as a ``user_annotation`` ``jobprof:<op>`` from its start to
                    its end (async completion included) with torch's record_param_comms
                    argument names (``Collective name``, ``In msg nelems``, ``Group size``,
                    ``dtype``, ``Process Group Name`` / ``Ranks``, ``Rank``) on
                    ``thread <t> (jobprof collectives)``
msproftx            ``jobprof.mstx`` / NVTX ranges (``user_annotation``) and markers (``i``) on
                    ``thread <t> (jobprof mstx)``; record_function blocks come from the ops
                    stream when it is there
dp                  ``next(loader<k>)`` waits (and main-process fetch / collate), and each
                    worker's fetch / collate on the worker's own pid
==================  ========================================================================

CPU-only jobs: HTA's temporal breakdown counts GPU kernels only (events with a ``stream``
argument).  jobprof's device tasks of a CPU-only job are its op_summary rows (top-level
operators run on the CPU), so each one is written a second time as a ``kernel`` on a pseudo
device: ``pid = 1000000000 + device id`` (process ``jobprof pseudo device <id>``), ``tid`` and
``stream`` = the OS thread that ran it, ``device`` = the device id, ``correlation`` shared with
its ``cpu_op`` (as a CUDA kernel shares one with its launch), and ``"jobprof pseudo device":
true`` in its args.  The file's ``jobprof.device_tasks`` says ``cpu_pseudo_device`` (or
``cuda``, or ``none`` without operator records), ``jobprof.note`` says it in words.  HTA then
reads "kernel time" as the span of the iteration's operators and "compute" as the time the CPU
ran them; it classifies ``c10d::`` operators as compute (it knows only NCCL kernel names).

Not in the files: ``deviceProperties`` is ``[]`` (torch writes that for CPU; GPU properties are
not recorded), and ``distributedInfo`` is left out of a job that is not distributed, as torch
does (HTA then takes rank 0).  ``ts`` is µs since ``baseTimeNanoseconds``, the job's time base
(``jobprof.plugin.clock``): the same in every rank's file, so the ranks' files share one time axis, and
small enough that every ns survives a reader's conversion.

task_trace off: the files still have ProfilerStep, the step phases, collectives, markers and
DataLoader waits; the plugin says once at start that operators and device work are missing.
"""

from __future__ import annotations

from typing import Any

from jobprof.plugin import Config, PluginSession, WriterSpec, hookimpl
from jobprof.plugins.kineto.writer import SPEC

KEY = "kineto_trace"


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {KEY: {
        "$ref": "#/$defs/switch", "default": "off",
        "description": "also a PyTorch-profiler-format trace per iteration (HTA, Perfetto)"}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on(KEY)


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    if not session.config.is_on("task_trace"):
        session.reporter.info("kineto_trace: task_trace is off, so the Kineto-format traces hold "
                              "ProfilerStep, step phases, collectives and markers but no operators "
                              "or device work (turn task_trace on for those)")


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [SPEC]
