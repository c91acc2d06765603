"""Declared records: the raw streams the core writes (``iteration``, ``profiler``, ``ops``) and
every stream read by more than its owner.

Shared streams: a raw stream read by more than its owner (another plugin, or the core) is
declared here, one frozen record class per record shape (:class:`CollectiveRecord` for
``hccl``, :class:`StepPointsRecord` for ``training_trace``, :class:`TxRecord` for ``msproftx``,
:class:`BatchRecord` / :class:`WorkerFetchRecord` for ``dp``, :class:`CompiledGraphRecord` /
:class:`FusedKernel` for ``fusion_op``), each with its ``STREAM``, a ``VERSION``, a tolerant
``from_raw`` (None for a record not shaped right: a raw store may hold anything) and a
``to_raw`` giving exactly the raw dict.  Its owner writes it (``to_raw``, or a hot-path literal
a test holds equal to ``to_raw``); every other reader reads it through the declaration
(:func:`records_of`, ``from_raw``, attribute access), never by raw key.  Bump ``VERSION`` when
the shape changes, and keep ``from_raw`` reading the older shapes.  A stream only its owner
reads keeps its record class in the plugin (``dp``'s loader records, ``fusion_op``'s compile
counters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, NamedTuple, Protocol, TypeGuard, TypeVar

import attrs

from jobprof.plugin.converters import str_tuple

__all__ = [
    "CONCRETE",
    "CORR",
    "DEVICE",
    "DEVICE_KINDS",
    "DTYPES",
    "DUR",
    "EXTRA",
    "FLOPS",
    "ITERATION_STREAM",
    "KIND",
    "LINK",
    "NAME",
    "OPS_STREAM",
    "OP_MEMORY_STREAM",
    "PROFILER_STREAM",
    "SHAPES",
    "START",
    "STRIDES",
    "TID",
    "BatchRecord",
    "CollectiveRecord",
    "CompiledGraphRecord",
    "FusedKernel",
    "MemoryEvent",
    "OpRecord",
    "SharedRecord",
    "StepPointsRecord",
    "TxRecord",
    "WorkerFetchRecord",
    "decoded",
    "records_of",
]

# -- core streams: the raw streams the core itself writes; no plugin may return them ------------
#: one record per iteration (``Iteration.to_record``), written by the session
ITERATION_STREAM = "iteration"
#: jobprof's own work inside the iteration, ``[[start_ns, end_ns], ...]``
PROFILER_STREAM = "profiler"
#: the operator capture's tasks (``jobprof.ops.opcapture``): one :class:`OpRecord` per event.  In
#: the job the stream holds references to the Kineto trace files the capture wrote
#: (``jobprof.files.kinetotrace``); readers get the records, resolved on reading.
OPS_STREAM = "ops"


class OpRecord(NamedTuple):
    """One event of the ``ops`` stream: an operator, a runtime call or a device task, read by
    its field names (``r.name``, ``r.dur``).  A tuple, so records read back from a window are
    shared by every reader of the iteration and none can change what the next one sees;
    :meth:`~typing.NamedTuple._replace` makes a changed copy.  Times are monotonic ns."""

    #: the operator's or kernel's name (``aten::mm``, ``cudaLaunchKernel``, a kernel's symbol)
    name: str
    start: int
    dur: int
    #: OS thread of a host event; CUDA stream of device work
    tid: int
    #: Kineto's activity type: ``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``kernel``, ...
    kind: str
    #: the GPU of device work, -1 on the host
    device: int = -1
    #: CUPTI's correlation id of a runtime call (its launch), of device work (its launch's), of a
    #: device range (``cuda_sync``: the synchronising call's), or 0
    corr: int = 0
    #: of device work: the correlation id of the launch that queued it, or 0
    link: int = 0
    #: with shapes (``task_trace`` l1 and up): the inputs' dims, C++ type names and strides
    shapes: list[Any] | None = None
    dtypes: list[Any] | None = None
    strides: list[Any] | None = None
    #: 0 in records read from Kineto's files (its estimate is not written there)
    flops: int = 0
    #: device work: the rest of Kineto's args (grid, block, bytes ...); a host operator recorded
    #: with shapes: {CONCRETE: Kineto's ``Concrete Inputs``, one string per argument}; or None
    extra: dict[str, Any] | None = None


#: the allocator events the operator capture recorded with ``task_memory`` on (Kineto's
#: ``[memory]`` events of the same windows): one :class:`MemoryEvent` each, derived from the
#: ``ops`` stream's windows on reading (never stored, never a plugin's)
OP_MEMORY_STREAM = "op_memory"


class MemoryEvent(NamedTuple):
    """One allocation or free of a PyTorch allocator, as Kineto recorded it (``[memory]``).

    ``total_allocated`` / ``total_reserved`` are the allocator's own counters just after the
    event.  On CUDA they are the caching allocator's (``torch.cuda.memory_allocated`` /
    ``memory_reserved``).  On CPU, torch counts only the blocks it saw allocated while memory
    profiling was on (a block allocated before the capture is not in it) and has no reserve:
    ``total_reserved`` is then -1 (N/A).  CPU shared memory (DataLoader workers' batches,
    ``share_memory_()``) is an allocator of its own, ``pool`` ``"shared"``: its reporter writes its
    total where the others write the reserve, here ``total_allocated``.  Times are monotonic ns."""

    ts: int
    #: > 0: an allocation of that many bytes; < 0: a free
    bytes: int
    addr: int
    total_allocated: int
    total_reserved: int
    #: c10's device type: 0 CPU, 1 CUDA (others as c10 numbers them)
    device_type: int
    #: the device index; -1 on the host
    device: int
    #: the OS thread that allocated or freed
    tid: int
    #: ``""``: the device's allocator; ``"shared"``: CPU shared memory
    pool: str = ""


#: the field positions of an ``ops`` record in its JSON array form (records stored inline, before
#: Kineto windows); readers use the names
NAME, START, DUR, TID, KIND, DEVICE, CORR, LINK, SHAPES, DTYPES, STRIDES, FLOPS, EXTRA = range(13)
assert OpRecord._fields[EXTRA] == "extra" and len(OpRecord._fields) == EXTRA + 1
CONCRETE = "Concrete Inputs"
#: Kineto activity types of work that ran on a device (CUDA kernels, copies, fills)
DEVICE_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


# -- Declared records of shared streams -------------------------------------------------------
# A stream read by more than its owner is declared here (see the module docstring): its owner
# writes it (``to_raw``), every other reader reads it through ``from_raw`` / :func:`records_of`.


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(value: Any) -> TypeGuard[int | None]:
    return value is None or _int(value)


def _opt_str(value: Any) -> TypeGuard[str | None]:
    return value is None or isinstance(value, str)


def _opt_bool(value: Any) -> TypeGuard[bool | None]:
    return value is None or isinstance(value, bool)


def _ints(value: Any, length: int | None = None) -> bool:
    return isinstance(value, list) and all(map(_int, value)) and (length is None or len(value) == length)


@attrs.frozen
class CollectiveRecord:
    """One torch.distributed operation of the ``hccl`` stream (written by the hccl plugin's
    capture at the hand-over, on the sink thread; read by kineto, task_trace, training_trace
    and ``jobprof diff``).

    Times are ``time.monotonic_ns()`` of the recording process.  ``count`` / ``bytes`` are the
    message S of the nccl-tests conventions (jobprof.plugins.hccl.collectives); ``peer`` is the
    other end as a group rank (root, destination or source), ``ranks`` the group's members as
    global ranks (None when torch would not say), ``seq`` the call's number in its group,
    ``end_from`` how the end was learnt (``completion``, ``wait``, ``observed``, ``backward end``,
    ``cuda events``), ``duration_unknown`` True when only an upper bound of the end is known.
    Raw keys are the attribute names, except ``is_async`` (raw ``async``); ``duration_unknown``
    is in the raw record only when True.  ``op``, ``start_ns`` and ``end_ns`` are required
    (``end_ns >= start_ns``); every other field may be absent in a raw record (None).
    """

    STREAM: ClassVar[str] = "hccl"
    VERSION: ClassVar[int] = 1

    op: str
    start_ns: int
    end_ns: int
    seq: int | None = None
    call_end_ns: int | None = None
    dtype: str | None = None
    peer: int | None = None
    is_async: bool | None = None
    in_backward: bool | None = None
    tid: int | None = None
    end_from: str | None = None
    state: str | None = None
    duration_unknown: bool = False
    group: str | None = None
    group_desc: str | None = None
    ranks: tuple[int, ...] | None = None
    rank_size: int | None = None
    rank: int | None = None
    backend: str | None = None
    count: int | None = None
    bytes: int | None = None

    @property
    def duration_ns(self) -> int | None:
        """The operation's duration, or None when only an upper bound of its end is known."""
        return None if self.duration_unknown else self.end_ns - self.start_ns

    @classmethod
    def from_raw(cls, raw: Any) -> CollectiveRecord | None:
        """The record of a raw ``hccl`` record, or None when it is not shaped as the hccl
        plugin writes it (never raises)."""
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        op, start, end = get("op"), get("start_ns"), get("end_ns")
        if not isinstance(op, str) or not _int(start) or not _int(end) or end < start:
            return None
        ranks = get("ranks")
        if not (ranks is None or _ints(ranks)):
            return None
        values = {name: get(name) for name in _COLLECTIVE_INTS + _COLLECTIVE_STRS}
        flags = get("async"), get("in_backward"), get("duration_unknown")
        if not (all(_opt_int(values[n]) for n in _COLLECTIVE_INTS)
                and all(_opt_str(values[n]) for n in _COLLECTIVE_STRS) and all(map(_opt_bool, flags))):
            return None
        return cls(op, start, end, is_async=flags[0], in_backward=flags[1],
                   duration_unknown=bool(flags[2]), ranks=None if ranks is None else tuple(ranks),
                   **values)

    def to_raw(self) -> dict[str, Any]:
        """The raw record, key for key as the hccl plugin has always written it."""
        raw: dict[str, Any] = {
            "op": self.op, "seq": self.seq, "start_ns": self.start_ns, "call_end_ns": self.call_end_ns,
            "end_ns": self.end_ns, "dtype": self.dtype, "peer": self.peer, "async": self.is_async,
            "in_backward": self.in_backward, "tid": self.tid, "end_from": self.end_from,
            "state": self.state}
        if self.duration_unknown:
            raw["duration_unknown"] = True
        raw.update({"group": self.group, "group_desc": self.group_desc,
                    "ranks": None if self.ranks is None else list(self.ranks), "rank_size": self.rank_size,
                    "rank": self.rank, "backend": self.backend, "count": self.count, "bytes": self.bytes})
        return raw


_COLLECTIVE_INTS = ("seq", "call_end_ns", "peer", "tid", "rank_size", "rank", "count", "bytes")
_COLLECTIVE_STRS = ("dtype", "end_from", "state", "group", "group_desc", "backend")


@attrs.frozen
class StepPointsRecord:
    """The one record per iteration of the ``training_trace`` stream: FP Start and BP End as
    the step trace uses them (written by the training_trace plugin at the hand-over; read by
    kineto).

    ``fp_start`` / ``bp_end`` are monotonic ns, or None; ``fp_source`` / ``bp_source`` say where
    each came from: ``fp_point`` / ``bp_point`` (the marked module), or ``auto`` (the core's
    detector, i.e. the iteration's own ``fp_start_ns`` / ``bp_end_ns``).  Both times are
    required keys (a raw record without them is not this record: readers then take the
    iteration's); the sources may be absent.
    """

    STREAM: ClassVar[str] = "training_trace"
    VERSION: ClassVar[int] = 1

    fp_start: int | None
    bp_end: int | None
    fp_source: str | None = None
    bp_source: str | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> StepPointsRecord | None:
        if not isinstance(raw, Mapping) or "fp_start" not in raw or "bp_end" not in raw:
            return None
        values = raw["fp_start"], raw["bp_end"], raw.get("fp_source"), raw.get("bp_source")
        if not (_opt_int(values[0]) and _opt_int(values[1]) and _opt_str(values[2]) and _opt_str(values[3])):
            return None
        return cls(*values)

    @classmethod
    def of(cls, records: Iterable[Any]) -> StepPointsRecord | None:
        """The iteration's record in a stream's records (the first), or None."""
        for raw in records:
            return cls.from_raw(raw)
        return None

    def to_raw(self) -> dict[str, Any]:
        return {"fp_start": self.fp_start, "bp_end": self.bp_end, "fp_source": self.fp_source,
                "bp_source": self.bp_source}


@attrs.frozen
class TxRecord:
    """One marker or range of the ``msproftx`` stream (written by the msproftx plugin; read by
    kineto).

    Raw keys (compact: the recorder builds one per marker on the user's thread): ``k`` kind
    (``m`` marker, ``r`` start/end range, ``p`` push/pop), ``m`` message, ``d`` domain, ``s`` /
    ``e`` start / end ns (equal for a marker), ``t`` the thread that started it, ``et`` the
    thread that ended it (only when not ``t``), ``si`` the iteration it started in (only when
    earlier than the one it is stored in).  ``m``, ``s``, ``e`` and ``t`` are required
    (``e >= s``).  The recorder keeps its dict literals on the hot path (an object per marker
    would cost the user's thread); tests assert they equal ``to_raw``.
    """

    STREAM: ClassVar[str] = "msproftx"
    VERSION: ClassVar[int] = 1

    message: str
    start_ns: int
    end_ns: int
    thread: int
    kind: str | None = None
    domain: str | None = None
    end_thread: int | None = None
    start_iteration: int | None = None

    @property
    def is_marker(self) -> bool:
        return self.kind == "m"

    @classmethod
    def from_raw(cls, raw: Any) -> TxRecord | None:
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        message, start, end, thread = get("m"), get("s"), get("e"), get("t")
        if not (isinstance(message, str) and _int(start) and _int(end) and _int(thread)) or end < start:
            return None
        kind, domain, et, si = get("k"), get("d"), get("et"), get("si")
        if not (_opt_str(kind) and _opt_str(domain) and _opt_int(et) and _opt_int(si)):
            return None
        return cls(message, start, end, thread, kind, domain, et, si)

    def to_raw(self) -> dict[str, Any]:
        raw = {"k": self.kind, "m": self.message, "d": self.domain, "s": self.start_ns, "e": self.end_ns,
               "t": self.thread}
        if self.end_thread is not None:
            raw["et"] = self.end_thread
        if self.start_iteration is not None:
            raw["si"] = self.start_iteration
        return raw


@attrs.frozen
class BatchRecord:
    """One batch the loop took from a DataLoader: a ``k: "next"`` record of the ``dp`` stream
    (written by the dp plugin at the hand-over; read by kineto).

    Raw keys: ``l`` loader index (``loader0``, ...), ``b`` the batch's number in its iterator,
    ``t0`` / ``t1`` the loop's wait in ``next()`` (monotonic ns), ``q0`` / ``q1`` batches already
    buffered before / after (None: cannot tell), ``w`` the worker that produced it (-1: the main
    process), ``tid`` the loop's thread, ``f`` (only for a batch produced in the main process)
    ``[fetch start, collate start, end, samples]``.  ``t0`` and ``t1`` are required; a missing
    ``l`` is loader 0.
    """

    STREAM: ClassVar[str] = "dp"
    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "next"

    start_ns: int
    end_ns: int
    loader: int = 0
    number: int | None = None
    buffered_before: int | None = None
    buffered_after: int | None = None
    worker: int | None = None
    tid: int | None = None
    produced: tuple[int, int, int, int] | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> BatchRecord | None:
        if not isinstance(raw, Mapping) or raw.get("k") != cls.KIND:
            return None
        get = raw.get
        start, end, loader, produced = get("t0"), get("t1"), get("l", 0), get("f")
        rest = get("b"), get("q0"), get("q1"), get("w"), get("tid")
        if not (_int(start) and _int(end) and _int(loader) and all(map(_opt_int, rest))) or end < start:
            return None
        if produced is not None and not _ints(produced, 4):
            return None
        return cls(start, end, loader, *rest, produced=None if produced is None else tuple(produced))

    def to_raw(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"k": self.KIND, "l": self.loader, "b": self.number, "t0": self.start_ns,
                               "t1": self.end_ns, "q0": self.buffered_before, "q1": self.buffered_after,
                               "w": self.worker, "tid": self.tid}
        if self.produced is not None:
            raw["f"] = list(self.produced)
        return raw


@attrs.frozen
class WorkerFetchRecord:
    """One batch a DataLoader worker process fetched and collated: a ``k: "fetch"`` record of
    the ``dp`` stream (written by the dp plugin from what the worker sent; read by kineto).

    Raw keys: ``l`` loader index, ``w`` worker id, ``pid`` the worker's process id, ``n``
    samples, ``t0`` fetch start, ``t1`` collate start, ``t2`` end (monotonic ns, the same clock
    as the owner's).  ``t0 <= t1 <= t2`` are required; a missing ``l`` / ``w`` is 0.
    """

    STREAM: ClassVar[str] = "dp"
    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "fetch"

    fetch_start: int
    collate_start: int
    end: int
    loader: int = 0
    worker: int = 0
    pid: int | None = None
    samples: int | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> WorkerFetchRecord | None:
        if not isinstance(raw, Mapping) or raw.get("k") != cls.KIND:
            return None
        get = raw.get
        t0, t1, t2, loader, worker = get("t0"), get("t1"), get("t2"), get("l", 0), get("w", 0)
        pid, samples = get("pid"), get("n")
        if not (_int(t0) and _int(t1) and _int(t2) and _int(loader) and _int(worker) and _opt_int(pid)
                and _opt_int(samples)) or not t0 <= t1 <= t2:
            return None
        return cls(t0, t1, t2, loader, worker, pid, samples)

    def to_raw(self) -> dict[str, Any]:
        return {"k": self.KIND, "l": self.loader, "w": self.worker, "pid": self.pid, "n": self.samples,
                "t0": self.fetch_start, "t1": self.collate_start, "t2": self.end}

@attrs.frozen
class FusedKernel:
    """One kernel of a compiled graph (an item of :class:`CompiledGraphRecord`'s ``kernels``).

    ``kind`` is ``cpp`` / ``triton`` (generated by Inductor) or ``extern`` (a library call such
    as ``extern_kernels.mm``, one item per call site); ``original_ops`` the ATen operators it
    replaced (``aten::addmm``), in graph order when ``order`` is ``graph``, in its name's order
    (alphabetical) when ``name``; bytes are None where the wrapper does not give them
    (symbolic shapes, a library's own workspace); ``calls`` how often the graph calls it.
    """

    name: str
    kind: str
    original_ops: tuple[str, ...] = attrs.field(converter=str_tuple, factory=tuple)
    order: str = "graph"
    input_bytes: int | None = None
    output_bytes: int | None = None
    weight_bytes: int | None = None
    workspace_bytes: int | None = None
    calls: int = 1

    @classmethod
    def from_raw(cls, raw: Any) -> FusedKernel | None:
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        name, kind, ops, order, calls = get("name"), get("kind"), get("original_ops", []), \
            get("order", "graph"), get("calls", 1)
        inp, out, weight, work = (get(k) for k in ("input_bytes", "output_bytes", "weight_bytes",
                                                   "workspace_bytes"))
        if not (isinstance(name, str) and isinstance(kind, str) and isinstance(order, str) and _int(calls)
                and isinstance(ops, list) and all(isinstance(op, str) for op in ops)
                and _opt_int(inp) and _opt_int(out) and _opt_int(weight) and _opt_int(work)):
            return None
        return cls(name, kind, ops, order, inp, out, weight, work, calls)

    def to_raw(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "original_ops": list(self.original_ops),
                "order": self.order, "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
                "weight_bytes": self.weight_bytes, "workspace_bytes": self.workspace_bytes,
                "calls": self.calls}


def _kernels(values: Iterable[FusedKernel]) -> tuple[FusedKernel, ...]:
    return tuple(values)


@attrs.frozen
class CompiledGraphRecord:
    """One graph torch.compile (Inductor) produced: a record of the ``compiled_graphs`` stream
    (written by the fusion_op plugin, every known graph in every iteration; read by the
    operator tier, which gives a compiled graph's tasks its Model ID, and by the summary).

    ``model_name`` is ``<frame qualname>#<fwd|bwd|inf><compile id>`` (``MLP.forward#fwd0/0``),
    ``model_id`` a stable number from it (the same on every rank and iteration), ``cache_key``
    Inductor's FX graph cache key, the one its ``## Call CompiledFxGraph <key> ##`` profiler
    range names at run time, ``first_iteration`` the iteration the graph was compiled (or
    loaded from Inductor's cache) in.
    """

    STREAM: ClassVar[str] = "compiled_graphs"
    VERSION: ClassVar[int] = 1

    model_id: int
    model_name: str
    compile_id: str
    phase: str
    first_iteration: int
    cache_key: str | None = None
    kernels: tuple[FusedKernel, ...] = attrs.field(converter=_kernels, factory=tuple)

    @property
    def call_range(self) -> str | None:
        """The name of the profiler range Inductor opens around every call of the graph."""
        return None if self.cache_key is None else f"## Call CompiledFxGraph {self.cache_key} ##"

    @classmethod
    def from_raw(cls, raw: Any) -> CompiledGraphRecord | None:
        if not isinstance(raw, Mapping):
            return None
        get = raw.get
        model_id, name, compile_id, phase, first, key, kernels = (
            get("model_id"), get("model_name"), get("compile_id"), get("phase"), get("first_iteration"),
            get("cache_key"), get("kernels", []))
        if not (_int(model_id) and isinstance(name, str) and isinstance(compile_id, str)
                and isinstance(phase, str) and _int(first) and _opt_str(key) and isinstance(kernels, list)):
            return None
        typed = [FusedKernel.from_raw(k) for k in kernels]
        if any(k is None for k in typed):
            return None
        return cls(model_id, name, compile_id, phase, first, key, [k for k in typed if k is not None])

    def to_raw(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "model_name": self.model_name, "compile_id": self.compile_id,
                "phase": self.phase, "first_iteration": self.first_iteration, "cache_key": self.cache_key,
                "kernels": [k.to_raw() for k in self.kernels]}


class SharedRecord(Protocol):
    """What a declared record type has (the classes above)."""

    STREAM: ClassVar[str]
    VERSION: ClassVar[int]

    @classmethod
    def from_raw(cls, raw: Any) -> Any: ...

    def to_raw(self) -> dict[str, Any]: ...


_R = TypeVar("_R", bound=SharedRecord)


class Decodable(Protocol):
    """A record type that reads its raw form: ``from_raw`` gives the record, or None for a raw
    record not shaped as it declares (a declared record, or a plugin's own NamedTuple)."""

    @classmethod
    def from_raw(cls, raw: Any) -> Any: ...


_D = TypeVar("_D", bound=Decodable)


def decoded(items: Iterable[Any], kind: type[_D]) -> list[_D]:
    """``items`` as ``kind`` records: one already of ``kind`` passes as it is (a stream read once
    and handed on), any other through ``kind.from_raw``; what that refuses is left out."""
    out = []
    for item in items:
        record = item if isinstance(item, kind) else kind.from_raw(item)
        if record is not None:
            out.append(record)
    return out


def records_of(source: Any, kind: type[_R], device: int | None = None) -> list[_R]:
    """The records of ``kind``'s stream that are shaped as ``kind`` declares, as ``kind``.

    ``source`` is an :class:`ExportContext` (``records_of(ctx, CollectiveRecord)``), a streams
    mapping (``jobprof_iteration_spans``' ``streams``), or a ``Profile`` (then ``device``
    narrows it; ``Profile.typed`` also gives each record's device and iteration).  A raw record
    ``from_raw`` refuses (an old or damaged profile) is left out; for a stream holding several
    kinds (``dp``) only those of ``kind`` come back.
    """
    if isinstance(source, Mapping):
        raw: Iterable[Any] = source.get(kind.STREAM, ())
    elif device is not None:
        raw = source.records(kind.STREAM, device)
    else:
        raw = source.records(kind.STREAM)
    return decoded(raw, kind)


# -- jobprof diff: the tables plugins contribute (jobprof_diff_tables) -------------------------
