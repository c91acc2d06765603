"""fusion_op: what torch.compile fused, per compiled graph
(``summary/fusion_op_<dev>_<model id>_<iter>.csv``, docs/msprof.md section 3).

On Ascend the file lists, per graph, each fused operator and the original operators it
replaced.  Here a graph is one Inductor graph (a forward, backward or inference graph of a
compiled frame) and its rows are the kernels Inductor generated for it (``cpp_fused_*`` on
CPU, ``triton_*_fused_*`` on CUDA) and the library calls it kept (``extern_kernels.mm``, one
row per call site):

==================  ===================================================================
Model Name          ``<frame qualname>#<fwd|bwd|inf><compile id>`` (``MLP.forward#fwd0/0``;
                    a recompile is ``#fwd0/1``, a graph break's resume function its own frame)
Model ID            CRC-32 of the Model Name: the same on every rank, run and iteration
Fusion Op           the kernel's name as Inductor wrote it
Original Ops        the ATen operators it replaced (``aten::addmm``): in graph order from
                    Inductor's own provenance comment (extern and Triton kernels); for C++
                    kernels, which get no comment, from the name Inductor builds out of the
                    same operators (``config.cpp.descriptive_names="original_aten"``, the
                    default), which is alphabetical.  N/A when the name lists none.
Memory Input(KB)    distinct buffers the kernel's first call reads (from the wrapper's
                    ``empty_strided`` / ``get_args`` shapes and dtypes; parameters excluded)
Memory Output(KB)   distinct buffers it writes
Memory Weight(KB)   parameters and buffers among its inputs (Inductor's ``static_input_idxs``)
Memory Workspace    a Triton kernel's workspace argument; 0 for a C++ kernel (Inductor passes
                    none); N/A for extern kernels (the library's scratch is not visible)
Memory Total(KB)    the four summed; N/A when one is N/A.  Symbolic (dynamic) shapes: N/A.
==================  ===================================================================

A graph's file is written once, in the iteration it was compiled (or loaded from Inductor's
cache) in: ``fusion_op_<dev>_<model id>_<that iteration>.csv``.  A recompile is a new graph with
its own id, so it gets its own file in the iteration it happened in.  The operator tier reads
the same records (:class:`jobprof.plugin.CompiledGraphRecord`): tasks run inside a
graph's ``## Call CompiledFxGraph <key> ##`` range carry its Model ID in op_summary and
task_time, and the master timeline shows each kernel's original operators in ``args``.

Switch (``fusion_op``): ``on`` (the default while task_trace is on), ``off``, or ``kernels``,
which also times every C++ kernel (Inductor's ``config.cpp.enable_kernel_profile``: the
generated code gains a ``RECORD_FUNCTION`` per kernel, so it is a different compile, and the
kernels then appear in op_summary with OP Type ``Fused(<ops joined by +>)``, family ``Fused``).
Without ``kernels``, C++ kernels are not timed one by one on CPU: the graph's time is its call
range and its extern calls.  On CUDA the Triton kernels are device tasks either way
(UNVERIFIED on a GPU so far).
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    JSON,
    CompiledGraphRecord,
    Config,
    Iteration,
    PluginSession,
    Section,
    StreamsOut,
    WriterSpec,
    hookimpl,
)
from jobprof.plugins.fusion_op.capture import MAX_GRAPHS, GraphCapture, counters
from jobprof.plugins.fusion_op.records import CompileCountersRecord
from jobprof.plugins.fusion_op.report import compiled_sections, rank_facts
from jobprof.plugins.fusion_op.writer import render_csv

if TYPE_CHECKING:
    from jobprof.plugin import Profile

KEY = "fusion_op"
KERNELS = "kernels"


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {KEY: {
        "type": "string", "enum": ["on", "off", KERNELS, ""], "default": "on",
        "description": "Compiled graphs (torch.compile): kernels and the ATen operators each fused "
                       "(fusion_op files); 'kernels' also times each C++ kernel (a different compile). "
                       "On by default while task_trace is on."}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    # its data joins the operator tier: on by default only with it, on whenever asked for
    return config.is_on(KEY) and (KEY in config.explicit or config.is_on("task_trace"))


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    capture = GraphCapture()
    session.attach(KEY, capture)
    kernels = session.config.get(KEY) == KERNELS

    def inductor_loaded(module: Any) -> None:  # imported at the first compile, before codegen
        capture.install(module)
        if kernels:
            _kernel_profile(session)

    session.when_imported("torch._inductor.output_code", inductor_loaded)


def _kernel_profile(session: PluginSession) -> None:
    config = sys.modules.get("torch._inductor.config")
    cpp = getattr(config, "cpp", None)
    if cpp is None or not hasattr(cpp, "enable_kernel_profile"):
        session.reporter.warning("fusion_op: this torch has no config.cpp.enable_kernel_profile; "
                                 "C++ kernels are not timed one by one")
        return
    session.attach("fusion_op.kernel_profile", cpp.enable_kernel_profile)
    cpp.enable_kernel_profile = True


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut | None:
    capture: GraphCapture | None = session.attached(KEY)
    if capture is None:
        return None
    # the wrapper sources are read on the sink thread; a job that compiles nothing gets neither
    # stream in its raw lines (an empty deferred list is dropped by the sink)
    streams: dict[str, Any] = {CompiledGraphRecord.STREAM: partial(capture.take, iteration.index)}
    counts = counters(capture)
    if counts:
        streams[CompileCountersRecord.STREAM] = counts
    return streams


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    capture: GraphCapture | None = session.attached(KEY)
    if capture is None:
        return
    capture.remove()
    graphs = capture.identities()
    if graphs:  # a job that compiled nothing gets no section
        session.set_info(KEY, {"graphs": graphs, "kernel_profile": session.config.get(KEY) == KERNELS})
    before = session.attached("fusion_op.kernel_profile")
    if before is not None:
        config = sys.modules.get("torch._inductor.config")
        if config is not None:
            config.cpp.enable_kernel_profile = before
    if capture.errors:
        session.reporter.warning(f"fusion_op: {capture.errors} compiled graph(s) could not be read; "
                                 "their kernels are missing from fusion_op")
    if capture.dropped:
        session.reporter.warning(f"fusion_op: {capture.dropped} compiled graph(s) past the first "
                                 f"{MAX_GRAPHS} were not kept")


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [WriterSpec("fusion_op", "csv", render_csv,
                       "one file per compiled graph (torch.compile), in the iteration it was compiled: "
                       "its kernels and the ATen operators each replaced")]


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return compiled_sections(profile)
