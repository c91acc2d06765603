"""One iteration's operators as a tree, and the tasks the operator-tier files list.

Built once per iteration from the ``ops`` stream (:mod:`jobprof.ops.opcapture`) and shared by
every writer of that iteration through ``ctx.memo`` (:func:`view`).

What a *task* (an ``op_summary`` row) is:

* On a CUDA job: every kernel, memcpy and memset that ran on the GPU.  Its operator is the
  innermost dispatcher operator around the CUDA runtime call that launched it (matched by
  Kineto's correlation id).  An operator call that launched several (cuBLAS: a GEMM, a
  split-K reduction, a memset) has its FLOPs and bytes on its longest task only
  (``Task.carries_work``).  Device work no operator launched has its kernel's own name as
  OP Type (:func:`kernel_type`).
* On a CPU-only job the CPU is the device: a task is a *top-level operator*, i.e. a
  dispatcher operator (``aten::``, ``c10d::``, custom ``ns::op``) with no dispatcher operator
  around it.  ``aten::linear`` called from Python is one task (its ``aten::addmm`` inside is
  part of it); in backward, each operator the autograd engine runs is one.  Tasks of one
  thread therefore never overlap, and their durations add up.

Times are monotonic ns, as in the raw records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from jobprof.plugin import opmath
from jobprof.plugin.records import (
    CONCRETE,
    DEVICE_KINDS,
    OPS_STREAM,
    CompiledGraphRecord,
    FusedKernel,
    OpRecord,
    records_of,
)
from jobprof.plugin.values import ExportContext

MEMO_KEY = "optree"
#: Core Type of a task, by what ran it
CPU, CUDA, MEMCPY, MEMSET, COMMUNICATION = "CPU", "CUDA", "MEMCPY", "MEMSET", "COMMUNICATION"
_DEVICE_CORE = {"kernel": CUDA, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
#: name prefixes of collective-communication work (torch.distributed ops, NCCL kernels)
COMM_PREFIXES = ("c10d::", "nccl")
#: Kineto activity types of the host calls that launch device work
_LAUNCH_KINDS = ("cuda_runtime", "cuda_driver")
#: Kineto's projections of ranges onto GPU streams: on the device, neither host calls nor tasks
DEVICE_RANGE_PREFIXES = ("gpu_", "cuda_profiler", "cuda_sync")


def is_dispatch_op(name: str, kind: str) -> bool:
    """A dispatcher operator (``aten::mm``, ``c10d::allreduce_``), not an autograd node, an
    engine frame or a ``record_function`` block."""
    return kind == "cpu_op" and "::" in name and not name.startswith(("autograd::", "torch::autograd::"))


def op_type(name: str) -> str:
    """``aten::addmm`` -> ``addmm``; a name without a namespace is its own type."""
    return name.rpartition("::")[2] or name


def kernel_type(name: str) -> str:
    """The OP Type of device work no operator launched: its function's own name, without
    return type, namespaces, template arguments or parameters (a demangled CUDA kernel name
    holds commas and ``::`` inside them): ``void at::native::vectorized_elementwise_kernel<4,
    at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, ...)`` ->
    ``vectorized_elementwise_kernel``; ``Memcpy DtoH (Device -> Pinned)`` -> ``Memcpy DtoH``."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip()
    if text.startswith("void "):
        text = text[5:]
    text = text.rpartition("::")[2].strip()
    return text or name


#: OP Type family of a kernel torch.compile generated: ``Fused(add+relu)``
FUSED = "Fused"
#: the profiler range Inductor's C++ kernels open with ``config.cpp.enable_kernel_profile``
_KERNEL_RANGE = re.compile(r"^graph_\d+_((?:cpp|triton)_\w+)$")


def _extern_op(name: str) -> str:
    """``extern_kernels.addmm`` -> ``addmm``; ``torch.ops.aten.convolution.default`` -> ``convolution``."""
    parts = name.split(".")
    return parts[3] if parts[:2] == ["torch", "ops"] and len(parts) > 3 else parts[-1]


def fused_type(kernel: FusedKernel) -> str:
    """OP Type of a generated kernel: its family and the operators it replaced."""
    ops = "+".join(op_type(op) for op in kernel.original_ops)
    return f"{FUSED}({ops})" if ops else FUSED


class Task:
    """One op_summary / task_time row.  FLOPs and bytes are computed on first use."""

    __slots__ = ("_io", "carries_work", "core_type", "dur", "fused", "host", "index", "model_id", "name",
                 "op_type", "record",
                 "start", "stream", "task_id", "wait")

    def __init__(self, index: int, record: OpRecord, host: OpRecord | None, core_type: str) -> None:
        self.index = index
        self.record = record
        self.host = host  # the operator record (the task itself on CPU); None if unmatched
        self.name: str = record.name
        self.op_type: str = op_type(host.name) if host is not None else \
            kernel_type(record.name) if record.kind in DEVICE_KINDS else op_type(record.name)
        self.core_type = core_type
        self.stream: int = record.tid
        self.start: int = record.start
        self.dur: int = record.dur
        self.task_id = 0
        self.wait = 0
        self._io: Any = None
        #: the operator's FLOPs and bytes are this task's: False for the other tasks of an operator
        #: call that launched several (cuBLAS: a GEMM, a split-K reduction, a memset), whose work
        #: lies on its longest task, so that a column's sum is the operators' sum
        self.carries_work = True
        #: a compiled graph's task: the graph's Model ID and the kernel it ran (else None)
        self.model_id: int | None = None
        self.fused: FusedKernel | None = None

    @property
    def end(self) -> int:
        return self.start + self.dur

    # input details come from the host operator (a kernel has none of its own)
    @property
    def shapes(self) -> list[Any] | None:
        return self.host.shapes if self.host is not None else None

    @property
    def dtypes(self) -> list[Any] | None:
        return self.host.dtypes if self.host is not None else None

    @property
    def strides(self) -> list[Any] | None:
        return self.host.strides if self.host is not None else None

    @property
    def concrete(self) -> list[Any] | None:
        """The scalar argument values Kineto recorded for the operator (a convolution's stride,
        padding ...), one string per argument; None when none were."""
        extra = self.host.extra if self.host is not None else None
        return extra.get(CONCRETE) if isinstance(extra, dict) else None

    @property
    def extra(self) -> Any:
        """Device work's data Kineto attached (kernel args: grid, block, CUPTI counters); None
        for a CPU task (an operator's ``extra`` holds its concrete inputs: :attr:`concrete`)."""
        return self.record.extra if self.record.kind in DEVICE_KINDS else None

    def _cost(self) -> Any:
        if self._io is None:
            host = self.host
            if host is None or host.shapes is None:
                self._io = (None, None, None)
            else:
                self._io = opmath.cost(host.name, host.shapes, host.dtypes, self.concrete)
        return self._io

    @property
    def flops(self) -> int | None:
        """Floating-point operations computed from input shapes (None: unknown for this op, or
        counted on another task of the same operator call, see ``carries_work``)."""
        return self._cost()[0] if self.carries_work else None

    @property
    def bytes_moved(self) -> tuple[int, int] | None:
        """(bytes read, bytes written) from shapes and dtypes (None: unknown, or counted on
        another task of the same operator call)."""
        return self._cost()[1] if self.carries_work else None

    @property
    def outputs(self) -> tuple[list[Any], list[str]] | None:
        """(output shapes, output dtypes) where the operator's semantics give them."""
        return self._cost()[2]


class OpView:
    """The operators of one iteration: nesting per thread, top-level operators, tasks."""

    def __init__(self, records: list[OpRecord], graphs: Iterable[CompiledGraphRecord] = ()) -> None:
        self.records = records
        n = len(records)
        self.parent = [-1] * n
        # host calls only: not device work, nor the ranges Kineto projects onto GPU streams
        # (gpu_user_annotation, cuda_profiler_range), whose "thread" is a stream
        host = [i for i, r in enumerate(records) if r.kind not in DEVICE_KINDS
                and not r.kind.startswith(DEVICE_RANGE_PREFIXES)]
        self.has_device = any(r.kind in DEVICE_KINDS for r in records)
        by_thread: dict[int, list[int]] = {}
        for i in host:
            by_thread.setdefault(records[i].tid, []).append(i)
        parent = self.parent
        #: records on a second lane of their thread (they overlap a sibling without nesting,
        #: e.g. a block ended on another thread); a timeline draws them on their own track
        self.lane = [0] * n
        for indices in by_thread.values():
            indices.sort(key=lambda i: (records[i].start, -records[i].dur))
            stack: list[int] = []
            for i in indices:
                start, end = records[i].start, records[i].start + records[i].dur
                while stack and records[stack[-1]].start + records[stack[-1]].dur <= start:
                    stack.pop()
                if stack and records[stack[-1]].start + records[stack[-1]].dur < end:
                    self.lane[i] = 1  # partial overlap: not a child, not nestable here
                    continue
                if stack:
                    parent[i] = stack[-1]
                stack.append(i)
        self.threads = by_thread
        self._children: list[list[int]] | None = None
        # a compiled graph's call ranges (record -> graph), and the C++ kernels timed inside them
        self.graph_of: dict[int, CompiledGraphRecord] = {}
        by_range = {g.call_range: g for g in graphs if g.call_range is not None}
        kernels: list[int] = []
        if by_range:
            self.graph_of = {i: by_range[records[i].name] for i in host if records[i].name in by_range}
            if self.graph_of:
                kernels = [i for i in host if self.lane[i] == 0 and _KERNEL_RANGE.match(records[i].name)]
        self.top = [i for i in host if is_dispatch_op(records[i].name, records[i].kind)
                    and self.lane[i] == 0 and not self._has_dispatch_ancestor(i)] + kernels
        self.top.sort(key=lambda i: records[i].start)
        self.launches: dict[int, int] = {}
        self.tasks = self._device_tasks() if self.has_device else \
            [Task(i, records[i], records[i], _host_core(records[i].name)) for i in self.top]
        if self.graph_of:
            self._join_graphs()
        self._number_tasks()

    def graph_around(self, i: int) -> int:
        """The compiled graph call range at or above record ``i`` (-1: none)."""
        graph_of, parent = self.graph_of, self.parent
        while i >= 0 and i not in graph_of:
            i = parent[i]
        return i

    def _join_graphs(self) -> None:
        """Give every task run inside a compiled graph's call the graph's Model ID, and the
        kernel it ran: a timed C++ kernel or a device kernel by name, an extern call (and the
        device kernels it launched) by its place among the graph's extern calls, which Inductor
        makes in the wrapper's order."""
        records = self.records
        matched: dict[int, FusedKernel | None] = {}  # host operator -> its extern kernel
        extern_next: dict[int, int] = {}  # call range -> extern kernels matched so far
        for task in self.tasks:
            source = self.launch_of(task) if self.has_device else task.index
            around = self.graph_around(source) if source >= 0 else -1
            if around < 0:
                continue
            graph = self.graph_of[around]
            task.model_id = graph.model_id
            found = _KERNEL_RANGE.match(task.name)
            wanted = found.group(1) if found else task.name
            kernel = next((k for k in graph.kernels if k.kind != "extern" and k.name == wanted), None)
            if kernel is not None:
                task.fused, task.name, task.op_type = kernel, kernel.name, fused_type(kernel)
                continue
            host = self.innermost_dispatch(source)
            if host < 0:
                continue
            if host not in matched:
                externs = [k for k in graph.kernels if k.kind == "extern"]
                op, at = op_type(records[host].name), extern_next.get(around, 0)
                matched[host] = None
                for k in range(at, len(externs)):
                    if _extern_op(externs[k].name) == op:
                        matched[host], extern_next[around] = externs[k], k + 1
                        break
            task.fused = matched[host]

    def _has_dispatch_ancestor(self, i: int) -> bool:
        records, p = self.records, self.parent[i]
        while p >= 0:
            if is_dispatch_op(records[p].name, records[p].kind):
                return True
            p = self.parent[p]
        return False

    def innermost_dispatch(self, i: int) -> int:
        """The closest dispatcher operator at or above record ``i`` (-1: none)."""
        records = self.records
        while i >= 0 and not is_dispatch_op(records[i].name, records[i].kind):
            i = self.parent[i]
        return i

    def _device_tasks(self) -> list[Task]:
        records = self.records
        self.launches = launches = {r.corr: i for i, r in enumerate(records)
                                    if r.kind in _LAUNCH_KINDS and r.corr}
        tasks = []
        for i, r in enumerate(records):
            kind = r.kind
            if kind not in DEVICE_KINDS:
                continue
            launch = launches.get(r.link, -1)
            op = self.innermost_dispatch(launch) if launch >= 0 else -1
            core = COMMUNICATION if r.name.startswith(COMM_PREFIXES) else _DEVICE_CORE[kind]
            tasks.append(Task(i, r, records[op] if op >= 0 else None, core))
        tasks.sort(key=lambda t: t.start)
        by_op: dict[int, list[Task]] = {}
        for task in tasks:
            if task.host is not None:
                by_op.setdefault(id(task.host), []).append(task)
        for group in by_op.values():
            if len(group) > 1:
                longest = max(group, key=lambda t: t.dur)  # the first of equals
                for task in group:
                    task.carries_work = task is longest
        return tasks

    def _number_tasks(self) -> None:
        counters: dict[int, int] = {}
        previous_end: int | None = None
        for task in self.tasks:  # in start order
            counters[task.stream] = counters.get(task.stream, 0) + 1
            task.task_id = counters[task.stream]
            task.wait = 0 if previous_end is None else max(0, task.start - previous_end)
            previous_end = task.end

    def children(self, i: int) -> list[int]:
        if self._children is None:
            kids: list[list[int]] = [[] for _ in self.records]
            for j, p in enumerate(self.parent):
                if p >= 0:
                    kids[p].append(j)
            self._children = kids
        return self._children[i]

    def self_ns(self, i: int) -> int:
        """Time of record ``i`` not spent in its children."""
        return self.records[i].dur - sum(self.records[c].dur for c in self.children(i))

    def subtree(self, i: int) -> Iterable[int]:
        """Record ``i`` and every record nested in it (depth first)."""
        todo = [i]
        while todo:
            j = todo.pop()
            yield j
            todo.extend(self.children(j))

    def launch_of(self, task: Task) -> int:
        """The host record (CUDA runtime call) that launched a device task, or -1."""
        if task.record.kind not in DEVICE_KINDS:
            return -1
        return self.launches.get(task.record.link, -1)


def _host_core(name: str) -> str:
    return COMMUNICATION if name.startswith(COMM_PREFIXES) else CPU


def view(ctx: ExportContext) -> OpView | None:
    """The iteration's operator view (built once per iteration, shared by the writers), or
    None when the iteration has no ``ops`` stream."""
    memo = ctx.memo
    if MEMO_KEY not in memo:
        records = ctx.records(OPS_STREAM)
        memo[MEMO_KEY] = OpView(records, records_of(ctx, CompiledGraphRecord)) if records else None
    return memo[MEMO_KEY]


# -- intervals (Overlap Analysis) ----------------------------------------------------------
def union(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge (start, end) spans into disjoint sorted spans."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def subtract(spans: list[tuple[int, int]], minus: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of disjoint sorted ``spans`` not covered by disjoint sorted ``minus``."""
    out: list[tuple[int, int]] = []
    j = 0
    for start, end in spans:
        cursor = start
        while j < len(minus) and minus[j][1] <= cursor:
            j += 1
        k = j
        while k < len(minus) and minus[k][0] < end:
            if minus[k][0] > cursor:
                out.append((cursor, minus[k][0]))
            cursor = max(cursor, minus[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    return [(max(a, start), min(b, end)) for a, b in spans if b > start and a < end]


def overlap(computing: Iterable[tuple[int, int]], communication: Iterable[tuple[int, int]],
            start: int, end: int) -> dict[str, list[tuple[int, int]]]:
    """msprof's Overlap Analysis of one iteration ``[start, end)``: ``Computing``,
    ``Communication``, ``Communication(Not Overlapped)`` (communication while nothing computes)
    and ``Free`` (neither)."""
    comp = clip(union(computing), start, end)
    comm = clip(union(communication), start, end)
    busy = union(comp + comm)
    return {
        "Computing": comp,
        "Communication": comm,
        "Communication(Not Overlapped)": subtract(comm, comp),
        "Free": subtract([(start, end)], busy) if end > start else [],
    }
