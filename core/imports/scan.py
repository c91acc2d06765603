"""Pass 1, the one parse of a trace's events: each event the import keeps is spooled as its JSON
line, and what routing it needs is kept beside it in compact arrays.

Kept small (ids, spans, 16 bytes an event, never the events): the ``ProfilerStep#N`` spans (the
iterations), the host time and thread of every launch by its correlation id (a kernel belongs to
the iteration that launched it, wherever the GPU ran it), per spooled event its start and the
correlation of device work, the collectives' host context (``record_param_comms``, ``c10d::``,
``nccl:``), the few events the derived records come from (NCCL kernels, ``record_function``
ranges, FP / BP candidates), the blocks that bound FP Start, and counts per category.
"""

from __future__ import annotations

import json
import re
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import attrs

from jobprof.imports import source
from jobprof.plugin.records import DEVICE_KINDS

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: host calls that launch device work (CUDA's and, in Kineto's ROCm build, HIP's)
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
#: Kineto's projections of host ranges onto a GPU stream, CUPTI's ranges, the device's sync
#: waits: on the device, not host events
DEVICE_RANGE_CATS = frozenset({"gpu_user_annotation", "cuda_profiler_range", "cuda_sync"})
#: the operator torch records around every collective with its parameters, and the other host
#: events around a collective's launch: its c10d operator and its ``nccl:<op>`` block (whose
#: inputs are the tensors: the size where record_param_comms does not say it)
COMMS_OP = "record_param_comms"
COMMS_PREFIXES = (COMMS_OP, "c10d::", "nccl:")
#: blocks whose operators are not the forward pass (FP Start is the first operator outside them)
NOT_FORWARD = ("enumerate(DataLoader)", "Optimizer.", "ProfilerStep#")
_BACKWARD = "autograd::engine::evaluate_function"
#: ``links`` of a spooled event that is not device work, and of device work without a correlation
HOST, UNLINKED = -1, -2


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
    #: per spooled line: its start (wall ns) and, for device work, its correlation (else HOST)
    starts: array = attrs.field(factory=lambda: array("q"))
    links: array = attrs.field(factory=lambda: array("q"))
    #: FP Start candidates (an aten:: operator's start and end), BP End candidates (the start and
    #: end of an evaluate_function), in trace order
    forward: array = attrs.field(factory=lambda: array("q"))
    backward: array = attrs.field(factory=lambda: array("q"))
    #: NCCL kernels: (start, end, event); record_function ranges: (start, end, name, thread)
    nccl: list[tuple[int, int, Mapping[str, Any]]] = attrs.field(factory=list)
    ranges: list[tuple[int, int, str, int]] = attrs.field(factory=list)
    #: events per category (after renaming the 2021 ones)
    categories: Counter[str] = attrs.field(factory=Counter)
    #: events of categories the import does not know (kept as host events on the timeline)
    unknown: Counter[str] = attrs.field(factory=Counter)
    #: kernels per device index (the rank's GPU is the most common)
    devices: Counter[int] = attrs.field(factory=Counter)
    events: int = 0
    #: operators carry input shapes (``record_shapes``)
    shapes: bool = False
    #: the earliest start and latest end of any complete event (wall ns)
    first_ns: int | None = None
    last_ns: int | None = None
    #: the process id of the host events (the profiled process)
    host_pid: int | None = None

    @property
    def timed(self) -> int:
        """Events spooled: complete events and allocator events, the ones imported."""
        return len(self.starts)

    @property
    def device(self) -> int | None:
        return self.devices.most_common(1)[0][0] if self.devices else None

    def finish(self) -> None:
        for calls in self.comms.values():
            calls.sort(key=lambda c: (c[0], -c[1]))
        self.not_forward.sort()

    def comms_at(self, tid: int, ns: int) -> dict[str, Any]:
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
    return value if type(value) is int else None


def scan(header: source.Header, events: Iterable[Any], path: Path, spool: IO[bytes],
         dumps: Callable[[Any], bytes]) -> Scan:
    """Pass 1: every event checked (:func:`source.checked`); those imported written to
    ``spool``, one JSON line each (``dumps``: orjson's, or json's), in trace order."""
    out = Scan(header)
    base = header.base_ns
    steps, launches, categories = out.steps, out.launches, out.categories
    starts, links, forward, backward = out.starts, out.links, out.forward, out.backward
    unknown, known = out.unknown, source.KNOWN_CATEGORIES
    write = spool.write
    first = last = None
    host_pids: Counter[int] = Counter()
    index = -1
    for index, raw in enumerate(events):
        e = source.checked(raw, index, path)
        if e is None:
            continue
        cat = e.get("cat") or ""
        categories[cat] += 1
        if cat and cat not in known:
            unknown[cat] += 1
        if e["ph"] != "X":
            if e.get("name") == "[memory]":
                _spool(write, dumps, e, path, index)
                starts.append(base + round(e["ts"] * 1000))
                links.append(HOST)
            continue
        if cat == "Trace":
            continue
        _spool(write, dumps, e, path, index)
        start = base + round(e["ts"] * 1000)
        end = start + round(e.get("dur", 0) * 1000)
        starts.append(start)
        first = start if first is None or start < first else first
        last = end if last is None or end > last else last
        args = e.get("args") or {}
        if cat in DEVICE_KINDS:
            corr = _int(args.get("correlation"))
            links.append(corr if corr is not None and corr >= 0 else UNLINKED)
            device = _int(args.get("device"))
            out.devices[device if device is not None else _int(e.get("pid")) or 0] += 1
            name = e.get("name", "")
            if cat == "kernel" and name.startswith("nccl"):
                out.nccl.append((start, end, e))
            continue
        links.append(HOST)
        if cat in DEVICE_RANGE_CATS:
            continue
        tid = _int(e.get("tid"))
        tid = tid if tid is not None else _int(args.get("tid")) or 0
        if cat in LAUNCH_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None:
                launches[corr] = (start, tid)
            continue
        name = e.get("name", "")
        pid = _int(e.get("pid"))
        if pid is not None:
            host_pids[pid] += 1
        if cat == "cpu_op":
            if name.startswith("aten::"):
                forward.append(start)
                forward.append(end)
                if not out.shapes and args.get("Input Dims"):
                    out.shapes = True
            elif name.startswith(_BACKWARD):
                backward.append(start)
                backward.append(end)
        match = STEP_RE.match(name)
        if match:
            number = int(match[1])
            if number in steps:
                out.repeated_steps += 1
            else:
                steps[number] = (start, end)
            continue
        if cat == "user_annotation":
            out.ranges.append((start, end, name, tid))
        if name.startswith(COMMS_PREFIXES):
            out.comms.setdefault(tid, []).append((start, end, name, args))
        elif name.startswith(NOT_FORWARD):
            out.not_forward.append((start, end))
    out.events = index + 1
    out.first_ns, out.last_ns = first, last
    out.host_pid = host_pids.most_common(1)[0][0] if host_pids else None
    out.finish()
    return out


def _spool(write: Callable[[bytes], Any], dumps: Callable[[Any], bytes], e: Any, path: Path,
           index: int) -> None:
    try:
        write(dumps(e) + b"\n")
    except TypeError:  # orjson refuses: an int beyond 64 bits, a lone surrogate, nesting past 254
        try:
            text = json.dumps(e)
        except RecursionError:
            raise source.TraceError(path, "args nested too deeply to be a trace's", index) from None
        write(text.encode() + b"\n")
