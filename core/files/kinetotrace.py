"""The operator capture's windows as Kineto writes them, and their reading back as ``ops`` records.

Why: turning Kineto's events into records in the job costs an accessor call per field, about
10 us of Python per event, on the sink thread, where it competes with the training thread for
the GIL and the CPU (measured: small operators looked several times longer than torch.profiler
shows them).  Instead Kineto writes each finished window itself (``_ProfilerResult.save``: its
Chrome trace, in C++, ~3 us per event), on the training thread at the cut (the save holds the
GIL: on the sink thread it would stall the training thread at a random point), into a scratch
file (:func:`scratch_file`); the sink thread compresses it (zlib releases the GIL while it
works).  The records are built when an iteration is read -- by the exporter, ``jobprof
export``, ``jobprof summary`` -- from the file, with ``json`` in C.

On disk: ``data/kineto/window.<n>.json.gz``, one per window (the span between two cuts, about
one iteration); a window over 16 MB saved as the job ends is left as Kineto wrote it,
``window.<n>.json`` (compressing 440 MB of one 200k-operator iteration took 1.5 s of the
job's exit), and compressed by whoever renders it next (:func:`compress_plain`).  The
iteration's raw ``ops`` stream holds one reference per window it overlaps
(:func:`reference`); :func:`resolve` turns those into the records of the operators that started
inside the iteration (device work: launched inside it).  A profile
written before this change holds the records inline, and is read as it is.

Fields: the Chrome trace has everything the operator tier records, on CPU and CUDA (name,
start, duration, thread, activity type, input dims / types / strides / concrete values; CUDA
runtime calls with their correlation id; kernels, copies and fills with device, stream,
correlation, grid and block), in the same form on every torch from 2.9 on, whereas the
per-event accessors of ``_KinetoEvent`` differ between versions (``activity_type`` appeared in
2.13).  So this file is the only way operators are read: one path, tested on traces recorded
on real GPUs (``tests/data/``).  Kineto's own FLOP estimate is not in the file; jobprof
computes FLOPs from the recorded inputs (:mod:`jobprof.plugin.opmath`).
"""

from __future__ import annotations

import gzip
import os
import time
import zlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import attrgetter
from pathlib import Path
from typing import Any

from jobprof.files import fsio, jsonread
from jobprof.plugin.records import CONCRETE, DEVICE_KINDS, MemoryEvent, OpRecord

#: the folder of window files, inside a device's ``data/``
FOLDER = "kineto"
#: the key that tells a reference from an inline record (records are arrays)
KEY = "kineto"


#: compressed in pieces of this size, asking between them whether the job is ending
COMPRESS_CHUNK = 16 << 20
PLAIN = ".json"
GZIP = ".json.gz"


def window_name(number: int, compressed: bool = True) -> str:
    return f"window.{number:08d}{GZIP if compressed else PLAIN}"


def save_window(result: Any, number: int, device_dir: Path,
                hurry: Callable[[], bool] | None = None) -> tuple[str, int]:
    """Store one finished window compressed as ``data/kineto/window.<number>.json.gz``; returns
    (file name, bytes).  Sink thread.

    ``result`` is Kineto's ``_ProfilerResult`` (then Kineto writes it here) or the scratch file
    it already wrote at the cut (:func:`scratch_file`).  Kineto writes only into files jobprof
    created itself (``O_EXCL|O_NOFOLLOW``) inside its own folder, so never through a planted
    link; the compressed file is written atomically.  zlib releases the GIL while it works.
    Once ``hurry()`` is true (the job is ending) a window over :data:`COMPRESS_CHUNK` stays as
    Kineto wrote it, renamed ``window.<number>.json``: compressing it is left to whoever renders
    it.
    """
    folder = device_dir / "data" / FOLDER
    root = device_dir.parent
    scratch = result if isinstance(result, Path) else scratch_file(device_dir)
    try:
        if not isinstance(result, Path):
            result.save(str(scratch))
        data = _gzipped(fsio.read_bytes(scratch), hurry)
        if data is None:
            name = window_name(number, compressed=False)
            os.replace(scratch, folder / name)  # both ours, in our folder (no link followed)
            fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, fsio.FILE_MODE)  # as every file of ours (Kineto's save made its own)
                return name, os.fstat(fd).st_size
            finally:
                os.close(fd)
    finally:
        scratch.unlink(missing_ok=True)
    name = window_name(number)
    return name, fsio.atomic_write(folder / name, data, root=root)


def _gzipped(data: bytes, hurry: Callable[[], bool] | None) -> bytes | None:
    """``data`` in a gzip container (level 1, no time stamp), or None once ``hurry()`` after its
    first piece (a window of one piece, what most iterations make, is compressed: ~50 ms)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    view, parts = memoryview(data), []
    for at in range(0, len(data), COMPRESS_CHUNK):
        if at and hurry is not None and hurry():
            return None
        parts.append(packer.compress(view[at:at + COMPRESS_CHUNK]))
    parts.append(packer.flush())
    return b"".join(parts)


def compress_plain(device_dir: Path) -> int:
    """Compress the windows a job left as Kineto wrote them (``window.<n>.json``, saved as it
    ended) into ``window.<n>.json.gz``; returns how many.  Readers of the plain name find the
    compressed one (:meth:`Windows._load`): it exists before the plain one is removed."""
    folder = device_dir / "data" / FOLDER
    done = 0
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("window.") and n.endswith(PLAIN))
    except OSError:
        return 0
    for name in names:
        plain = folder / name
        try:
            data = _gzipped(fsio.read_bytes(plain), None)
            assert data is not None
            fsio.atomic_write(plain.with_name(name + ".gz"), data, root=device_dir.parent)
            plain.unlink()
            done += 1
        except OSError:
            continue  # left plain: still read as it is
    return done


def scratch_file(device_dir: Path) -> Path:
    """A new empty file in ``data/kineto/`` for Kineto to write one window into."""
    pid = os.getpid()
    folder = device_dir / "data" / FOLDER
    return fsio.new_empty_file(folder, lambda: f".scratch.{pid}.{time.monotonic_ns()}.json",
                               root=device_dir.parent)


def forget_window(name: str, device_dir: Path) -> None:
    """Delete a window file no iteration refers to (operators before the first iteration)."""
    (device_dir / "data" / FOLDER / name).unlink(missing_ok=True)


def reference(name: str, offset_ns: int, size: int, first: bool, shapes: bool,
              clip_ns: int | None = None) -> dict[str, Any]:
    """The ``ops`` record that points an iteration at a window file.

    ``offset_ns``: wall minus monotonic clock at the window's cut (Kineto stamps the wall
    clock); ``size``: the file's bytes; ``first``: this is the window's first reference (its
    bytes count toward the storage budget once); ``shapes``: the capture recorded input shapes
    (an operator without inputs then has empty lists, not None); ``clip_ns``: set on the very
    first iteration: operators that started after the capture began (``clip_ns``) but before
    the iteration, and run into it, are the iteration's from its start on.
    """
    ref = {KEY: name, "offset_ns": offset_ns, "bytes": size, "first": first, "shapes": shapes}
    if clip_ns is not None:
        ref["clip_ns"] = clip_ns
    return ref


def is_reference(records: Any) -> bool:
    return isinstance(records, list) and bool(records) and isinstance(records[0], dict) and KEY in records[0]


def from_arrays(arrays: Any) -> tuple[list[OpRecord], int]:
    """``ops`` records stored inline as JSON arrays, as records, and how many were not one (an
    array of another length, anything else)."""
    if not isinstance(arrays, list):
        return [], 1
    size = len(OpRecord._fields)
    records = [_new(OpRecord, a) for a in arrays if isinstance(a, list) and len(a) == size]
    return records, len(arrays) - len(records)


def new_files(data_dir: Path, records: Iterable[Any]) -> list[tuple[Path, int]]:
    """The window files an iteration's references bring first: (path, bytes)."""
    return [(data_dir / FOLDER / r[KEY], int(r.get("bytes", 0))) for r in records
            if isinstance(r, dict) and r.get("first")]


#: Kineto's trace categories of work that ran on a device, and of the host calls that launch it
_DEVICE_CATS = frozenset(DEVICE_KINDS)
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
#: device-side ranges Kineto projects onto a stream (a ``record_function`` seen by the GPU, a
#: CUPTI range, a stream / event / context synchronisation the device waited in): on their
#: device and stream, never nested among host calls
_DEVICE_RANGES = frozenset({"gpu_user_annotation", "cuda_profiler_range", "cuda_sync"})
#: a device event's args that become record fields; the rest (grid, block, registers, bytes,
#: CUPTI metric values ...) is the record's ``extra``
_PLACED = frozenset({"External id", "correlation", "device", "stream", "Ev Idx"})
#: a record from its 13 values without NamedTuple's Python-level __new__ (a third of the cost)
_new = tuple.__new__


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def records_of(trace: Mapping[str, Any], offset_ns: int, shapes: bool,
               memory: list[MemoryEvent] | None = None) -> list[OpRecord]:
    """Kineto's Chrome trace of one window as ``ops`` records (monotonic ns), in start order.

    The order: by start, ties in Kineto's own event order (``Ev Idx``).
    Timestamps are the trace's microseconds with three decimals, so within 1 ns of Kineto's.

    Every torch from 2.9 on writes the same fields (the per-event accessors differ between
    versions, the file does not), so this is the one reader for CPU and CUDA alike:

    * host calls: name, start, duration, OS thread; with ``shapes`` the inputs' dims, types and
      strides, and the concrete values of scalar arguments (``Concrete Inputs``: a convolution's
      stride and padding) in ``extra`` where Kineto recorded any;
    * CUDA runtime / driver calls: ``correlation`` (CUPTI's id of the launch);
    * kernels, copies, fills: device, stream (the record's thread), the launch's correlation
      (``link``) and the rest of Kineto's args (grid, block, bytes ...) as ``extra``;
    * device ranges (``gpu_user_annotation``): device, stream, ``extra`` as Kineto wrote it.

    With ``memory`` (a list), the window's allocator events (``[memory]``, recorded when the
    capture profiles memory) are appended to it as :class:`MemoryEvent` s, in time order.
    """
    base = int(trace.get("baseTimeNanoseconds") or 0) - offset_ns
    out: list[tuple[int, int, OpRecord]] = []
    mem: list[tuple[int, int, MemoryEvent]] = []
    for e in trace.get("traceEvents") or ():
        if e.get("ph") != "X":
            if memory is not None and e.get("name") == "[memory]" and e.get("ph") == "i":
                event = _memory_event(e, base)
                if event is not None:
                    mem.append((event.ts, _int((e.get("args") or {}).get("Ev Idx"), 0), event))
            continue
        kind = e.get("cat")
        if kind == "Trace":  # the window's own span, not an event of the program
            continue
        args = e.get("args") or {}
        start = base + round(e["ts"] * 1000)
        tid = e.get("tid", 0)
        device, corr, link = -1, 0, 0
        input_shapes = dtypes = strides = extra = None
        if kind in _DEVICE_CATS or kind in _DEVICE_RANGES:
            tid = _int(args.get("stream"), _int(tid, 0))
            device = _int(args.get("device"), _int(e.get("pid"), 0))
            if kind in _DEVICE_CATS:
                corr = link = _int(args.get("correlation"), 0)
            else:  # a range's own call (cuda_sync: the synchronising runtime call), never a launch
                corr = _int(args.get("correlation"), 0)
            extra = {k: v for k, v in args.items() if k not in _PLACED} or None
        else:
            if kind in _LAUNCH_CATS:
                corr = _int(args.get("correlation"), 0)
            if not isinstance(tid, int):
                tid = _int(args.get("tid"), 0)
            if shapes:
                # a tensor list's dims and strides are nested in the file; Kineto's accessors (and
                # so every reader of these records) give an empty list for such an input
                dims = args.get("Input Dims", [])
                input_shapes = [d if not (d and isinstance(d[0], list)) else [] for d in dims]
                dtypes = args.get("Input type", [])
                strides = args.get("Input Strides", [])
                concrete = args.get("Concrete Inputs")
                if concrete and any(concrete):
                    extra = {CONCRETE: concrete}
        record = _new(OpRecord, (e.get("name", ""), start, round(e.get("dur", 0) * 1000), tid, kind, device,
                                 corr, link, input_shapes, dtypes, strides, 0, extra))
        out.append((start, args.get("Ev Idx", 0), record))
    out.sort(key=lambda item: (item[0], item[1]))
    if memory is not None and mem:
        mem.sort(key=lambda item: (item[0], item[1]))
        memory.extend(_pools(item[2] for item in mem))
    return [item[2] for item in out]


def _pools(events: Iterable[MemoryEvent]) -> Iterator[MemoryEvent]:
    """CPU shared memory's events told from the CPU allocator's, in time order.  Its reporter
    (``MapAllocator``) writes Total Allocated 0 and its own total as Total Reserved, which the
    CPU allocator's never sets: an allocation so written is shared memory, and so is the free
    of its address; a free of an address the window did not see allocated, written with both
    totals 0, is taken as shared too (the CPU allocator's count is 0 only once it frees its last
    block)."""
    shared: set[int] = set()
    for e in events:
        if e.device_type != 0:
            yield e
            continue
        if e.bytes > 0:
            is_shared = e.total_allocated == 0 and e.total_reserved > 0
            (shared.add if is_shared else shared.discard)(e.addr)
        else:
            is_shared = e.addr in shared or e.total_allocated == 0
            shared.discard(e.addr)
        # the CPU allocator has no reserve (Kineto writes 0): N/A
        yield e._replace(total_allocated=max(e.total_reserved, 0), total_reserved=-1, pool="shared") \
            if is_shared else e._replace(total_reserved=-1)


def _memory_event(e: Mapping[str, Any], base: int) -> MemoryEvent | None:
    """One ``[memory]`` instant event as a record; None when it lacks its size or address (not
    one Kineto's memory profiling writes).  CPU events are told apart by :func:`_pools`."""
    args = e.get("args") or {}
    size, addr, ts = args.get("Bytes"), args.get("Addr"), e.get("ts")
    if not isinstance(size, int) or not isinstance(addr, int) or not isinstance(ts, (int, float)):
        return None
    kind = _int(args.get("Device Type"), 0)
    reserved = _int(args.get("Total Reserved"), -1)
    tid = e.get("tid", 0)
    return MemoryEvent(base + round(ts * 1000), size, addr, _int(args.get("Total Allocated"), -1), reserved,
                       kind, _int(args.get("Device Id"), -1), tid if isinstance(tid, int) else 0)


def owner_times(records: list[OpRecord]) -> list[int]:
    """Per record, the time that decides its iteration: its start, except for device work,
    which belongs to the iteration that launched it (a kernel queued by the optimizer step runs
    on the GPU after the host went on; cut by its own start it would land in the next iteration,
    away from the operator that launched it).  Device work whose launch is not in the window
    (launched before the capture, or by a thread Kineto did not see) keeps its start."""
    launched = {r.corr: r.start for r in records if r.kind in _LAUNCH_CATS and r.corr}
    if not launched:
        return [r.start for r in records]
    return [launched.get(r.link, r.start) if r.kind in _DEVICE_CATS else r.start for r in records]


class _Window:
    """One window's records, in the order of the times that decide their iteration
    (:func:`owner_times`), and those times."""

    def __init__(self, records: list[OpRecord], memory: list[MemoryEvent] | None = None) -> None:
        owners = owner_times(records)
        order = sorted(range(len(records)), key=owners.__getitem__)  # stable: start order within
        self.records = [records[i] for i in order]
        self.starts = [owners[i] for i in order]
        #: the allocator events, in time order, and their times
        self.memory = memory or []
        self.memory_ts = [m.ts for m in self.memory]


def _read_window(path: Path) -> bytes:
    """A window file's JSON (a plain one may have been compressed since it was named)."""
    if path.name.endswith(GZIP):
        return gzip.decompress(fsio.read_bytes(path))
    try:
        return fsio.read_bytes(path)
    except FileNotFoundError:
        return gzip.decompress(fsio.read_bytes(path.with_name(path.name + ".gz")))


class Windows:
    """Reads window files, keeping the last few (consecutive iterations share windows)."""

    KEEP = 4

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._cache: dict[str, _Window] = {}

    def load(self, name: str, offset_ns: int, shapes: bool) -> list[OpRecord]:
        return self._load(name, offset_ns, shapes).records

    def _load(self, name: str, offset_ns: int, shapes: bool) -> _Window:
        window = self._cache.get(name)
        if window is None:
            if "/" in name or name.startswith(".") or not name.endswith((GZIP, PLAIN)):
                raise ValueError(f"window file name {name!r} is not one jobprof writes")
            trace = jsonread.loads(_read_window(self.data_dir / FOLDER / name))
            if not isinstance(trace, dict):
                raise ValueError(f"{name} is not a Chrome trace object")
            memory: list[MemoryEvent] = []
            window = _Window(records_of(trace, offset_ns, shapes, memory), memory)
            if len(self._cache) >= self.KEEP:
                self._cache.pop(next(iter(self._cache)))
            self._cache[name] = window
        return window

    def resolve(self, refs: list[Any], start_ns: int, end_ns: int) -> list[OpRecord]:
        """The records of the operators that started in ``[start_ns, end_ns)`` (device work:
        that was launched then), from the windows ``refs`` names, in start order (tuples: the
        window's own, shared).  A ``record_function`` block open across an iteration end was
        ended and reopened by the cut, so its pieces already lie in their iterations.
        """
        taken: list[OpRecord] = []
        for ref in refs:
            if not isinstance(ref, dict) or not isinstance(ref.get(KEY), str):
                continue
            window = self._load(ref[KEY], int(ref.get("offset_ns", 0)), bool(ref.get("shapes")))
            first, last = bisect_left(window.starts, start_ns), bisect_left(window.starts, end_ns)
            taken.extend(window.records[first:last])
            clip = ref.get("clip_ns")
            if clip is not None:
                # the first iteration: an operator or block begun after the capture started and
                # still running at the iteration's start (a loop-wide one continued at the start)
                # is the iteration's from its start on
                for r in window.records[bisect_left(window.starts, clip):first]:
                    if r.start + r.dur > start_ns and r.kind not in _DEVICE_CATS:
                        taken.append(r._replace(start=start_ns, dur=r.start + r.dur - start_ns))
        taken.sort(key=attrgetter("start"))
        return taken

    def resolve_memory(self, refs: list[Any], start_ns: int, end_ns: int) -> list[MemoryEvent]:
        """The allocator events in ``[start_ns, end_ns)`` of the windows ``refs`` names (after
        :meth:`resolve` of the same refs, whose windows are cached), in time order."""
        taken: list[MemoryEvent] = []
        for ref in refs:
            if not isinstance(ref, dict) or not isinstance(ref.get(KEY), str):
                continue
            window = self._load(ref[KEY], int(ref.get("offset_ns", 0)), bool(ref.get("shapes")))
            if window.memory:
                ts = window.memory_ts
                taken.extend(window.memory[bisect_left(ts, start_ns):bisect_left(ts, end_ns)])
        taken.sort(key=attrgetter("ts"))
        return taken
