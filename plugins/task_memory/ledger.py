"""One iteration's allocations: who made each (the operator), how long it lived, what was live at the peak.

Pure functions over the iteration's allocator events (:class:`~jobprof.plugin.MemoryEvent`, the
core stream ``op_memory``) and its operators (``ops``), shared by the writers and the facts.

Attribution: an allocation belongs to the top-level operator running on its thread when it
was made (``aten::linear``, not the ``aten::empty`` inside it; in backward, the operator the
autograd engine called), or, outside any operator, to the innermost ``record_function`` block
or Kineto range around it; else its Name is ``N/A`` (memory the program allocated outside the
operators Kineto records).

Pairing: by (device type, device, address).  msprof's rules for the ends the capture missed,
applied to the iteration (each file is one iteration): an allocation whose free came later has
an empty Duration and empty Release columns; a free whose allocation came before the iteration
is a row of its own with a negative Size, an empty Name and empty Allocation columns.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from jobprof.plugin import NA, MemoryEvent, OpView
from jobprof.plugins.task_memory.records import ModuleCall, module_calls

#: device types as c10 numbers them (``c10::DeviceType``)
DEVICE_TYPES = {
    0: "CPU",
    1: "cuda",
    2: "mkldnn",
    3: "opengl",
    4: "opencl",
    5: "ideep",
    6: "hip",
    7: "fpga",
    9: "xla",
    12: "meta",
    13: "hpu",
    14: "ve",
    15: "lazy",
    16: "ipu",
    17: "mtia",
    20: "privateuseone",
}


#: the Device column of CPU shared memory's events
SHARED = "CPU shared memory"


def device_label(event: MemoryEvent) -> str:
    """The Device column: ``CPU`` for the host allocator, ``CPU shared memory`` for shared
    memory (DataLoader batches), ``cuda:0`` for a device's."""
    if event.pool == "shared":
        return SHARED
    kind = DEVICE_TYPES.get(event.device_type, f"device_type_{event.device_type}")
    return kind if event.device < 0 or event.device_type == 0 else f"{kind}:{event.device}"


class Allocation(NamedTuple):
    """One row of operator_memory: an allocation and its free, either end possibly outside."""

    name: str  # the operator; "" for a free whose allocation the iteration did not see
    size: int  # bytes; negative for such a free
    alloc: MemoryEvent | None
    release: MemoryEvent | None
    device: str

    @property
    def time(self) -> int:
        """When the row happened: its allocation, else its free."""
        end = self.alloc or self.release
        assert end is not None  # a row has at least one end
        return end.ts


class Namer:
    """Which operator (or block) was running on a thread at a time, and in which module: the
    name an allocation made then gets, ``aten::linear (Net.encoder.0)``.

    ``modules``: the iteration's raw ``memory_modules`` stream (decoded as
    :class:`ModuleCall`: the core's recorder, :meth:`jobprof.plugin.PluginSession.module_calls`)."""

    def __init__(self, view: OpView | None, modules: Iterable[Any] = ()) -> None:
        self._by_tid: dict[int, tuple[list[int], list[int], list[str]]] = {}
        self._outer: dict[int, list[tuple[int, int, str]]] = {}
        self._modules: dict[int, tuple[list[int], list[ModuleCall]]] = {}
        calls_by_tid: dict[int, list[ModuleCall]] = {}
        for call in module_calls(modules):
            calls_by_tid.setdefault(call.tid, []).append(call)
        for tid, calls in calls_by_tid.items():
            calls.sort(key=lambda c: (c.start_ns, -c.end_ns))
            self._modules[tid] = ([c.start_ns for c in calls], calls)
        if view is None:
            return
        records = view.records
        tops = set(view.top)
        spans: dict[int, list[tuple[int, int, str]]] = {}
        for i in view.top:
            r = records[i]
            spans.setdefault(r.tid, []).append((r.start, r.start + r.dur, r.name))
        # blocks and ranges that hold no top-level operator at that moment name what lies
        # outside the operators (a record_function around Python work)
        outer: dict[int, list[tuple[int, int, str]]] = {}
        for i, r in enumerate(records):
            if i not in tops and r.device < 0 and r.kind in ("user_annotation", "python_function"):
                outer.setdefault(r.tid, []).append((r.start, r.start + r.dur, r.name))
        for tid, items in spans.items():
            items.sort()
            self._by_tid[tid] = ([s for s, _, _ in items], [e for _, e, _ in items], [n for _, _, n in items])
        self._outer = {tid: sorted(items, key=lambda s: (s[0], -s[1])) for tid, items in outer.items()}

    def name(self, tid: int, ts: int) -> str:
        op = self.operator(tid, ts)
        module = self.module(tid, ts)
        return f"{op} ({module})" if module else op

    def module(self, tid: int, ts: int) -> str:
        """The innermost module whose call on ``tid`` holds ``ts``, or ``""``."""
        found = self._modules.get(tid)
        if found is None:
            return ""
        starts, calls = found
        i = bisect_right(starts, ts) - 1
        while i >= 0:  # back over earlier siblings to the call that holds ts
            call = calls[i]
            if call.end_ns >= ts:
                return call.path
            i -= 1
        return ""

    def operator(self, tid: int, ts: int) -> str:
        found = self._by_tid.get(tid)
        if found is not None:
            starts, ends, names = found
            i = bisect_right(starts, ts) - 1
            if i >= 0 and ts <= ends[i]:
                return names[i]
        best = ""
        for start, end, name in self._outer.get(tid, ()):
            if start > ts:
                break
            if ts <= end:
                best = name  # sorted by start: the last one holding ts is the innermost
        return best or NA


def allocations(events: Iterable[MemoryEvent], namer: Namer) -> list[Allocation]:
    """The iteration's rows, in time order (msprof's rules for the ends outside, see above)."""
    open_: dict[tuple[int, int, str, int], tuple[str, MemoryEvent]] = {}
    rows: list[Allocation] = []
    for e in events:
        key = (e.device_type, e.device, e.pool, e.addr)
        if e.bytes > 0:
            if key in open_:  # freed where Kineto did not see it: the old block ends unknown
                name, old = open_.pop(key)
                rows.append(Allocation(name, old.bytes, old, None, device_label(old)))
            open_[key] = (namer.name(e.tid, e.ts), e)
        elif e.bytes < 0:
            found = open_.pop(key, None)
            if found is None:
                rows.append(Allocation("", e.bytes, None, e, device_label(e)))
            else:
                name, alloc = found
                rows.append(Allocation(name, alloc.bytes, alloc, e, device_label(alloc)))
    rows.extend(
        Allocation(name, alloc.bytes, alloc, None, device_label(alloc)) for name, alloc in open_.values()
    )
    rows.sort(key=lambda r: r.time)
    return rows


class Peak(NamedTuple):
    """An allocator's high point in one iteration and who held it."""

    device: str
    allocated: int  # bytes, the allocator's own count at its highest
    reserved: int  # bytes at the highest reserve; -1: N/A (the CPU allocator)
    ts: int  # when it was reached
    #: the bytes of allocations made in this iteration and live at the peak, by operator,
    #: largest first
    holders: list[tuple[str, int]]
    #: live at the peak, allocated before this iteration (the rest of ``allocated``)
    earlier: int
    #: the allocator's count after the iteration's last event
    end_allocated: int
    end_reserved: int


def names_of(events: Sequence[MemoryEvent], namer: Namer) -> list[str]:
    """The operator of each allocation (``""`` for frees), parallel to ``events``."""
    return [namer.name(e.tid, e.ts) if e.bytes > 0 else "" for e in events]


def peaks(events: Sequence[MemoryEvent], names: Sequence[str]) -> list[Peak]:
    """One :class:`Peak` per allocator (device) that has events in the iteration; ``names`` as
    :func:`names_of` gives them."""
    by_device: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        by_device.setdefault(device_label(e), []).append(i)
    out = []
    for device, indices in sorted(by_device.items()):
        top = max(indices, key=lambda i: events[i].total_allocated)
        live: dict[int, tuple[str, int]] = {}
        for i in indices:
            if i > top:
                break
            e = events[i]
            if e.bytes > 0:
                live[e.addr] = (names[i], e.bytes)
            else:
                live.pop(e.addr, None)
        held: dict[str, int] = {}
        for name, size in live.values():
            held[name] = held.get(name, 0) + size
        mine = sum(held.values())
        peak, last = events[top], events[indices[-1]]
        reserved = max(events[i].total_reserved for i in indices)
        out.append(
            Peak(
                device,
                peak.total_allocated,
                reserved,
                peak.ts,
                sorted(held.items(), key=lambda kv: -kv[1]),
                max(0, peak.total_allocated - mine),
                last.total_allocated,
                last.total_reserved,
            )
        )
    return out
