"""One iteration's tasks as ready-made cells, built once and shared by every writer.

The operator-tier files list the same tasks several times (op_summary, task_time CSV and JSON,
the master timeline): each task's strings (stamps, durations, names as CSV cells, JSON name
literals) are built here once per iteration, column by column, and kept in ``ctx.memo``.
Columns only some files need (the tensor cells, the metric values) are built on first use.

Timestamps are converted with the iteration's clock anchor inline (the same integer
arithmetic as ``ExportContext.stamp`` / ``to_us``, without a call per value).
"""

from __future__ import annotations

import json
import marshal
import re
from typing import Any

from jobprof.plugin import NA, ExportContext, opview
from jobprof.plugins.task_trace.formats import input_cells, output_cells

MEMO_KEY = "task_trace.table"
_GRID = re.compile(r'"grid"\s*:\s*\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]')


def csv_cell(text: str) -> str:
    """``text`` as the csv module's QUOTE_MINIMAL writes it (kernel names hold commas)."""
    if "," in text or '"' in text or "\n" in text or "\r" in text:
        return '"' + text.replace('"', '""') + '"'
    return text


def us3(ns: int) -> str:
    """A duration in ns as µs with 3 decimals, exactly."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def block_dim(extra: Any) -> str:
    """Blocks in a CUDA kernel's grid, x*y*z (Ascend's Block Dim: how many blocks the task
    was split into, each run by one core), from Kineto's kernel args; N/A for CPU tasks,
    copies and fills."""
    if not extra:
        return NA
    if isinstance(extra, dict):
        grid = extra.get("grid")
        if isinstance(grid, list) and len(grid) == 3 and all(isinstance(v, int) for v in grid):
            return str(grid[0] * grid[1] * grid[2])
        return NA
    found = _GRID.search(extra if isinstance(extra, str) else json.dumps(extra))
    if found is None:
        return NA
    x, y, z = map(int, found.groups())
    return str(x * y * z)


class Signatures:
    """Tensor cells per distinct call signature (operator, shapes, dtypes, strides).

    An iteration repeats few signatures (every layer of a model calls the same operators on
    the same shapes).  The key is the signature marshalled (version 2: no back-references, so
    equal values give equal bytes), which costs a third of formatting the cells.
    """

    def __init__(self) -> None:
        self._cells: dict[bytes, tuple[tuple[str, str, str], tuple[str, str, str]]] = {}

    def lookup(self, task: opview.Task) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
        """(input CSV cells, output CSV cells) of a task whose operator's inputs were recorded.
        Outputs are a function of the signature (``Task.outputs`` derives them from the
        operator's name and inputs)."""
        host = task.host
        assert host is not None  # the one caller skips tasks without one
        key: bytes | None
        try:
            key = marshal.dumps((host.name, host.shapes, host.dtypes, host.strides), 2)
            found = self._cells.get(key)
        except ValueError:  # a value marshal does not take: format without the cache
            key, found = None, None
        if found is None:
            raw = input_cells(host.shapes or [], host.dtypes or [], host.strides or [])
            out = output_cells(task.outputs)
            found = ((csv_cell(raw[0]), csv_cell(raw[1]), csv_cell(raw[2])),
                     (NA, NA, NA) if out is None else (csv_cell(out[0]), csv_cell(out[1]), csv_cell(out[2])))
            if key is not None:
                self._cells[key] = found
        return found


class TaskTable:
    """Columns (lists, one item per task in start order) of one iteration's tasks."""

    def __init__(self, ctx: ExportContext, view: opview.OpView) -> None:
        self.ctx = ctx
        self.view = view
        tasks = self.tasks = view.tasks
        anchor = ctx.anchor
        offset = anchor.epoch_ns - anchor.monotonic_ns
        starts = [t.start + offset for t in tasks]  # epoch ns
        durs = [t.dur for t in tasks]
        ends = [s + d for s, d in zip(starts, durs, strict=True)]
        self.durs = durs
        self.start_cells = [f"{s // 1000}.{s % 1000:03d}\t" for s in starts]
        self.stop_cells = [f"{e // 1000}.{e % 1000:03d}\t" for e in ends]
        self.dur_cells = [f"{d // 1000}.{d % 1000:03d}" for d in durs]
        self.wait_cells = [f"{w // 1000}.{w % 1000:03d}" for w in (t.wait for t in tasks)]
        # timeline ts (us since the job's time base) and dur (from integer ns): jobprof.plugin.clock
        base = ctx.axis.base_ns  # starts are epoch ns
        self.ts = [(s - base) / 1000 for s in starts]
        self.tdur = [d / 1000 for d in durs]
        self.streams = [t.stream for t in tasks]
        self.task_ids = [t.task_id for t in tasks]
        self.core_types = [t.core_type for t in tasks]
        names: dict[str, str] = {}
        self.names = [t.name for t in tasks]
        self.name_cells = [names.get(n) or names.setdefault(n, csv_cell(n)) for n in self.names]
        self.op_types = [t.op_type for t in tasks]
        types: dict[str, str] = {}
        self.op_type_cells = [types.get(n) or types.setdefault(n, csv_cell(n)) for n in self.op_types]
        # a compiled graph's tasks carry its Model ID (fusion_op), the others the iteration's
        model = ctx.iteration.model_id
        self.model_ids = [model if t.model_id is None else t.model_id for t in tasks]
        self.models = [str(m) for m in self.model_ids]  # CSV cells
        self.signatures = Signatures()
        self._fused: list[dict[str, str]] | None = None
        self._inputs: Any = None
        self._outputs: Any = None

    def _io(self) -> None:
        """Input and output cells of every task, through the signature cache."""
        n = len(self.tasks)
        inputs = ([NA] * n, [NA] * n, [NA] * n)
        outputs = ([NA] * n, [NA] * n, [NA] * n)
        lookup = self.signatures.lookup
        for j, t in enumerate(self.tasks):
            host = t.host
            if host is None or host.shapes is None:
                continue
            cells, out = lookup(t)
            inputs[0][j], inputs[1][j], inputs[2][j] = cells
            outputs[0][j], outputs[1][j], outputs[2][j] = out
        self._inputs, self._outputs = inputs, outputs

    @property
    def inputs(self) -> tuple[list[str], list[str], list[str]]:
        """(Input Shapes, Input Data Types, Input Formats) CSV cells per task; N/A when the
        operator's inputs were not recorded (task_trace l0) or a kernel has no operator."""
        if self._inputs is None:
            self._io()
        return self._inputs

    @property
    def outputs(self) -> tuple[list[str], list[str], list[str]]:
        """(Output Shapes, Output Data Types, Output Formats) CSV cells where the operator's
        semantics give the outputs (``Task.outputs``), else N/A."""
        if self._outputs is None:
            self._io()
        return self._outputs

    @property
    def fused_dicts(self) -> list[dict[str, str]]:
        """``{"Original Ops": "aten::add,aten::relu"}`` for a compiled graph's kernels, else
        empty: merged into a task event's args (one dict per graph, shared; built once)."""
        if self._fused is not None:
            return self._fused
        out: list[dict[str, str]] = []
        empty: dict[str, str] = {}
        made: dict[int, dict[str, str]] = {}
        for t in self.tasks:
            fused = t.fused
            if fused is None:
                out.append(empty)
                continue
            args = made.get(id(fused))
            if args is None:
                args = made[id(fused)] = {"Original Ops": ",".join(fused.original_ops)}
            out.append(args)
        self._fused = out
        return out

    @property
    def block_dims(self) -> list[str]:
        if not self.view.has_device:
            return [NA] * len(self.tasks)
        return [block_dim(t.extra) for t in self.tasks]


def table(ctx: ExportContext) -> TaskTable | None:
    """The iteration's task table (built once, shared by the writers), or None without
    operator records."""
    memo = ctx.memo
    if MEMO_KEY not in memo:
        view = opview.view(ctx)
        memo[MEMO_KEY] = TaskTable(ctx, view) if view is not None and view.tasks else None
    return memo[MEMO_KEY]
