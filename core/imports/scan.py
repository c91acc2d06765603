"""Pass 1 over a trace's events: what the routing pass needs to know before it starts.

Kept small (ids and spans, never the events): the ``ProfilerStep#N`` spans (the iterations), the
host time and thread of every launch by its correlation id (a kernel belongs to the iteration
that launched it, wherever the GPU ran it), the collectives' parameters (``record_param_comms``),
the blocks that bound FP Start (``enumerate(DataLoader)``, ``Optimizer.*``), and counts per
category for the note and the provenance.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from jobprof.imports import source
from jobprof.plugin.records import DEVICE_KINDS

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: host calls that launch device work (CUDA's and, in Kineto's ROCm build, HIP's)
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
#: Kineto's projections of host ranges onto a GPU stream, and CUPTI's ranges: not host events
DEVICE_RANGE_CATS = frozenset({"gpu_user_annotation", "cuda_profiler_range", "cuda_sync"})
#: the operator torch records around every collective with its parameters, and the other host
#: events around a collective's launch: its c10d operator and its ``nccl:<op>`` block (whose
#: inputs are the tensors: the size where record_param_comms does not say it)
COMMS_OP = "record_param_comms"
COMMS_PREFIXES = (COMMS_OP, "c10d::", "nccl:")
#: blocks whose operators are not the forward pass (FP Start is the first operator outside them)
NOT_FORWARD = ("enumerate(DataLoader)", "Optimizer.", "ProfilerStep#")


@attrs.define
class Scan:
    """What pass 1 learnt of one trace file."""

    header: source.Header
    #: ProfilerStep number -> [start, end) wall ns (the first span seen of each number)
    steps: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    #: steps named twice on the host: the later ones are left out
    repeated_steps: int = 0
    #: correlation id -> (start wall ns, thread) of the launching runtime / driver call
    launches: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    #: per thread, the host events around collectives (:data:`COMMS_PREFIXES`) as (start, end,
    #: name, args), in start order once sorted
    comms: dict[int, list[tuple[int, int, str, Mapping[str, Any]]]] = attrs.field(factory=dict)
    #: (start, end) of blocks that are not the forward pass (DataLoader, optimizer), sorted
    not_forward: list[tuple[int, int]] = attrs.field(factory=list)
    #: events per category (after renaming the 2021 ones)
    categories: Counter[str] = attrs.field(factory=Counter)
    #: events of categories the import does not know (kept as host events on the timeline)
    unknown: Counter[str] = attrs.field(factory=Counter)
    #: kernels per device index (the rank's GPU is the most common)
    devices: Counter[int] = attrs.field(factory=Counter)
    nccl_kernels: int = 0
    events: int = 0
    #: complete events (``X``) and allocator events, the ones imported
    timed: int = 0
    #: operators carry input shapes (``record_shapes``)
    shapes: bool = False
    #: the earliest start and latest end of any complete event (wall ns)
    first_ns: int | None = None
    last_ns: int | None = None
    #: the process id of the host events (the profiled process)
    host_pid: int | None = None

    def finish(self) -> None:
        for calls in self.comms.values():
            calls.sort(key=lambda c: (c[0], -c[1]))
        self.not_forward.sort()

    @property
    def device(self) -> int | None:
        return self.devices.most_common(1)[0][0] if self.devices else None

    def comms_at(self, tid: int, ns: int) -> dict[str, Mapping[str, Any]]:
        """The host events around time ``ns`` on ``tid`` that describe a collective, by kind
        (``record_param_comms``, ``c10d::``, ``nccl:``), each kind's innermost, with its name
        under ``"<kind> name"``."""
        calls = self.comms.get(tid)
        out: dict[str, Any] = {}
        if not calls:
            return out
        # the last few begun by then (a c10d op, its nccl: block, record_param_comms: 3 deep)
        i = bisect_right(calls, (ns, float("inf"))) - 1
        for start, end, name, args in reversed(calls[max(0, i - 5):i + 1]):
            if start <= ns < end:
                kind = next(p for p in COMMS_PREFIXES if name.startswith(p))
                if kind not in out:
                    out[kind] = args
                    out[kind + " name"] = name
        return out

    def in_not_forward(self, start: int, end: int) -> bool:
        i = bisect_right(self.not_forward, (start, float("inf"))) - 1
        return i >= 0 and self.not_forward[i][1] >= end


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def scan(header: source.Header, events: Iterable[Any], path: Path) -> Scan:
    """Pass 1 (every event checked by :func:`source.checked`)."""
    out = Scan(header)
    base = header.base_ns
    steps = out.steps
    launches = out.launches
    categories = out.categories
    first = last = None
    host_pids: Counter[int] = Counter()
    index = -1
    for index, raw in enumerate(events):
        e = source.checked(raw, index, path)
        if e is None:
            continue
        cat = e.get("cat") or ""
        categories[cat] += 1
        if cat and cat not in source.KNOWN_CATEGORIES:
            out.unknown[cat] += 1
        if e["ph"] != "X":
            if e.get("name") == "[memory]":
                out.timed += 1
            continue
        if cat == "Trace":
            continue
        out.timed += 1
        start = base + round(e["ts"] * 1000)
        end = start + round(e.get("dur", 0) * 1000)
        first = start if first is None or start < first else first
        last = end if last is None or end > last else last
        args = e.get("args") or {}
        if cat in DEVICE_KINDS:
            device = _int(args.get("device"))
            out.devices[device if device is not None else _int(e.get("pid")) or 0] += 1
            if cat == "kernel" and e.get("name", "").startswith("nccl"):
                out.nccl_kernels += 1
            continue
        if cat in DEVICE_RANGE_CATS:
            continue
        tid = _int(e.get("tid"))
        tid = tid if tid is not None else _int(args.get("tid")) or 0
        name = e.get("name", "")
        if cat in LAUNCH_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None:
                launches[corr] = (start, tid)
            continue
        pid = _int(e.get("pid"))
        if pid is not None:
            host_pids[pid] += 1
        match = STEP_RE.match(name)
        if match:
            number = int(match[1])
            if number in steps:
                out.repeated_steps += 1
            else:
                steps[number] = (start, end)
            continue
        if name.startswith(COMMS_PREFIXES):
            out.comms.setdefault(tid, []).append((start, end, name, args))
        elif name.startswith(NOT_FORWARD):
            out.not_forward.append((start, end))
        if not out.shapes and cat == "cpu_op" and args.get("Input Dims"):
            out.shapes = True
    out.events = index + 1
    out.first_ns, out.last_ns = first, last
    out.host_pid = host_pids.most_common(1)[0][0] if host_pids else None
    out.finish()
    return out
