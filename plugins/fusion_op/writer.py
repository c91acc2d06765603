"""The fusion_op CSV (docs/msprof.md section 3): one file per compiled graph, in the iteration it was
compiled in, one row per kernel of the graph."""

from __future__ import annotations

from collections.abc import Iterable

from jobprof.plugin import NA, CompiledGraphRecord, ExportContext, FusedKernel, records_of

HEADER = ["Device_id", "Model Name", "Model ID", "Fusion Op", "Original Ops", "Memory Input(KB)",
          "Memory Output(KB)", "Memory Weight(KB)", "Memory Workspace(KB)", "Memory Total(KB)"]


def kb(value: int | None) -> str:
    return NA if value is None else f"{value / 1024:.3f}"


def memory_cells(kernel: FusedKernel) -> list[str]:
    """Input, Output, Weight, Workspace and Total (their sum; N/A when a part is not known)."""
    parts = [kernel.input_bytes, kernel.output_bytes, kernel.weight_bytes, kernel.workspace_bytes]
    total = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
    return [kb(p) for p in parts] + [kb(total)]


def rows(ctx: ExportContext, graph: CompiledGraphRecord) -> Iterable[list[object]]:
    for kernel in graph.kernels:
        yield [ctx.device_id, graph.model_name, graph.model_id, kernel.name,
               ",".join(kernel.original_ops) or NA, *memory_cells(kernel)]


def render_csv(ctx: ExportContext) -> dict[int, str] | None:
    """{model id: CSV} for the graphs compiled in this iteration; None when none was."""
    new = [g for g in records_of(ctx, CompiledGraphRecord) if g.first_iteration == ctx.iteration.index]
    if not new:
        return None
    return {graph.model_id: ctx.csv(HEADER, list(rows(ctx, graph))) for graph in new}
