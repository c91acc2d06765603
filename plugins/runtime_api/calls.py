"""The runtime API calls of one iteration, taken from the operator capture's ``ops`` stream.

Kineto records every CUDA runtime call (activity type ``cuda_runtime``: ``cudaLaunchKernel``,
``cudaMemcpyAsync``, ``cudaStreamSynchronize`` ...) and the driver calls CUPTI traces
(``cuda_driver``: ``cuLaunchKernel`` from Triton's launcher ...) on the host thread that made
them; a ROCm trace's HIP calls are imported as the same two categories
(:mod:`jobprof.imports.source`).  Each is one :class:`ApiCall`, with:

* its **level**: ``runtime`` (``cuda_runtime``) or ``driver`` (``cuda_driver``), msprof's
  ``Level`` column;
* the **operator** that made it: the innermost dispatcher operator around it on its own thread
  (:meth:`jobprof.plugin.OpView.innermost_dispatch`), None outside every operator;
* the **Python frame** around it: the innermost ``python_function`` record around it on its
  thread, where the trace has them (torch.profiler's ``with_stack``); None otherwise;
* Kineto's **correlation id** (CUPTI's), which links a launch to its kernel and a
  synchronisation to the ``cuda_sync`` range the device shows for it;
* why it **synchronises** the host with the device, when it does (:func:`sync_reason`).

Times are monotonic ns, as in the raw records.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from jobprof.plugin import OpRecord, OpView

#: Kineto activity types of API calls -> msprof's ``Level`` value
LEVELS = {"cuda_runtime": "runtime", "cuda_driver": "driver"}
#: the device-side range Kineto draws for a synchronisation (its ``correlation`` is the call's)
SYNC_KIND = "cuda_sync"
#: a ``cuda_sync`` range that is the device waiting, not the host: ``cudaStreamWaitEvent``
#: makes a stream wait for an event and returns at once
DEVICE_SIDE_WAITS = frozenset({"Stream Wait Event"})
#: calls that block the calling host thread until the device (a stream, an event, every
#: stream) has finished: CUDA runtime, CUDA driver, HIP
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
})
#: copy calls; those without ``Async`` in their name are synchronous (``cudaMemcpy``,
#: ``cuMemcpyDtoH_v2``, ``hipMemcpyWithStream``): the host waits until the copy is done
COPY_PREFIXES = ("cudaMemcpy", "cuMemcpy", "hipMemcpy")
#: why a call synchronises (:func:`sync_reason`)
SYNC_API, SYNC_COPY = "synchronisation API", "synchronous copy"
#: the Python frame records of a trace recorded with stacks
PYTHON_KIND = "python_function"


@attrs.frozen
class ApiCall:
    """One runtime or driver API call of the iteration."""

    name: str
    #: ``runtime`` or ``driver`` (:data:`LEVELS`)
    level: str
    start: int
    dur: int
    #: the OS thread that made it
    tid: int
    #: Kineto's (CUPTI's) correlation id, 0 when the trace has none
    corr: int
    #: the innermost dispatcher operator around it on its thread, None outside every operator
    operator: str | None
    #: the innermost Python frame around it (``python_function``), None when the trace has none
    frame: str | None
    #: why it blocked the host until the device finished (None: it did not)
    sync: str | None
    #: the ``cuda_sync`` range the device shows for it (``Stream Sync``, ``Context Sync`` ...)
    sync_kind: str | None

    @property
    def end(self) -> int:
        return self.start + self.dur


def sync_reason(name: str, sync_kind: str | None) -> str | None:
    """Why a call blocks the host until the device is done, every reason that holds joined by
    ``"; "``: a synchronisation API (:data:`SYNC_CALLS`), a synchronous copy (a copy call
    without ``Async``), Kineto's ``cuda_sync`` range showing it wait for the device
    (``cuda_sync: Stream Sync``; not :data:`DEVICE_SIDE_WAITS`); None when none does."""
    reasons = []
    if name in SYNC_CALLS:
        reasons.append(SYNC_API)
    elif name.startswith(COPY_PREFIXES) and "Async" not in name:
        reasons.append(SYNC_COPY)
    if sync_kind is not None and sync_kind not in DEVICE_SIDE_WAITS:
        reasons.append(f"{SYNC_KIND}: {sync_kind}")
    return "; ".join(reasons) or None


def _sync_kinds(records: Iterable[OpRecord]) -> dict[int, str]:
    """The ``cuda_sync`` range of each correlation id (its ``cuda_sync_kind``, else its name)."""
    out: dict[int, str] = {}
    for r in records:
        if r.kind == SYNC_KIND and r.corr:
            kind = r.extra.get("cuda_sync_kind") if isinstance(r.extra, dict) else None
            out[r.corr] = kind if isinstance(kind, str) and kind else r.name
    return out


def _frame(view: OpView, i: int) -> str | None:
    records, parent = view.records, view.parent
    j = parent[i]
    while j >= 0 and records[j].kind != PYTHON_KIND:
        j = parent[j]
    return records[j].name if j >= 0 else None


def calls(view: OpView) -> list[ApiCall]:
    """Every runtime and driver API call of the iteration, in start order (ties: capture order)."""
    records = view.records
    syncs = _sync_kinds(records)
    out = []
    for i, r in enumerate(records):
        level = LEVELS.get(r.kind)
        if level is None:
            continue
        op = view.innermost_dispatch(view.parent[i])
        kind = syncs.get(r.corr) if r.corr else None
        operator = records[op].name if op >= 0 else None
        out.append(ApiCall(r.name, level, r.start, r.dur, r.tid, r.corr, operator, _frame(view, i),
                           sync_reason(r.name, kind), kind))
    out.sort(key=lambda c: c.start)
    return out


def has_calls(records: Iterable[OpRecord]) -> bool:
    """Whether the iteration's operator records hold any API call (cheaper than a view)."""
    return any(r.kind in LEVELS for r in records)
