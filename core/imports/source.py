"""One trace file, read as untrusted input: opened, decompressed, its events streamed and checked.

A trace is Kineto's Chrome-trace object as torch.profiler writes it (``export_chrome_trace``,
``tensorboard_trace_handler``, Lightning's and Hugging Face's profilers): ``traceEvents`` and
beside it ``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds`` ...  Plain,
gzip- or xz-compressed (told by the file's first bytes, not its name).

Why streamed (ijson's C parser, yajl): a trace of a long many-kernel job is GBs of JSON;
decoded whole it takes ~4x its size in Python objects.  Events are read one at a time, in
passes (:func:`events`), so memory holds what the import keeps (ids and spans), not the file.

Every problem is a :class:`TraceError` naming the file and, for an event, its index in
``traceEvents``; the import of that file stops before anything of it is written.
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import stat
import zlib
from collections.abc import Iterator, Mapping
from itertools import dropwhile
from pathlib import Path
from typing import IO, Any

import attrs

from jobprof.files import fsio

#: Kineto's 2021 categories (torch 1.8-1.10) -> today's; the rest of the pipeline reads today's
LEGACY_CATEGORIES = {"Operator": "cpu_op", "Kernel": "kernel", "Runtime": "cuda_runtime",
                     "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Driver": "cuda_driver",
                     "User annotation": "user_annotation", "Python function": "python_function"}
#: the categories Kineto writes today that the import knows what to do with; any other is kept
#: on the timeline as a host event and counted once (:class:`jobprof.imports.scan.Scan`)
KNOWN_CATEGORIES = frozenset({
    "cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset",
    "cuda_runtime", "cuda_driver", "cuda_sync", "cuda_profiler_range", "python_function",
    "Trace", "ac2g", "fwdbwd", "cpu_instant_event", "overhead"})
#: a timestamp beyond this (µs) is no time of a real trace (year ~2255): 1e300, overflow
MAX_US = 9e15
#: bytes read per call from the decompressor
CHUNK = 1 << 20

_GZIP, _XZ = b"\x1f\x8b", b"\xfd7zXZ\x00"


class TraceError(Exception):
    """A trace file that cannot be imported, and why (the file, the event index if any)."""

    def __init__(self, path: Path, text: str, event: int | None = None) -> None:
        super().__init__(text)
        self.path = path
        self.text = text
        self.event = event

    def __str__(self) -> str:
        if self.event is None:
            return f"{self.path}: {self.text}"
        return f"{self.path}: event {self.event} of traceEvents: {self.text}"


@attrs.frozen
class Header:
    """A trace's top-level keys other than ``traceEvents`` (what the import uses of them)."""

    path: Path
    #: the file's size on disk (compressed)
    size: int
    #: how it was stored: ``json``, ``gzip`` or ``xz``
    encoding: str
    #: the wall clock (epoch ns) Kineto's ``ts`` values count from; 0 when they are epoch µs
    base_ns: int
    device_properties: tuple[Mapping[str, Any], ...] = ()
    distributed: Mapping[str, Any] = attrs.field(factory=dict)
    schema_version: Any = None
    #: everything else at the top level that is small and JSON (trace name, CUDA versions ...)
    other: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def rank(self) -> int | None:
        rank = self.distributed.get("rank")
        return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def check_path(path: Path) -> os.stat_result:
    """The file's status, if it is a regular file named directly (not a link, FIFO, device,
    folder): the import reads only such files."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise TraceError(path, f"cannot read ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode):
        raise TraceError(path, "is a symbolic link: give the file it points to")
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(path, f"is {fsio.describe(st.st_mode)}, not a trace file")
    return st


def _open(path: Path) -> tuple[IO[bytes], str]:
    check_path(path)
    try:
        raw = fsio.open_read(path)
    except OSError as exc:
        raise TraceError(path, f"cannot read ({exc.strerror or exc})") from None
    magic = raw.read(6)
    raw.seek(0)
    if magic.startswith(_GZIP):
        return gzip.GzipFile(fileobj=raw, mode="rb"), "gzip"  # type: ignore[return-value]
    if magic.startswith(_XZ):
        return lzma.LZMAFile(raw, "rb"), "xz"
    return raw, "json"


class _Checked:
    """The decompressed stream, its decoding errors raised as :class:`TraceError`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle, self.encoding = _open(path)

    def read(self, size: int = -1) -> bytes:
        try:
            return self.handle.read(CHUNK if size < 0 else size)
        except EOFError:
            raise TraceError(self.path, f"{self.encoding} data cut short (a truncated file)") from None
        except (OSError, zlib.error, lzma.LZMAError) as exc:
            raise TraceError(self.path, f"corrupt {self.encoding} data ({exc})") from None

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> _Checked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ijson() -> Any:
    import ijson

    return ijson


def _json_error(path: Path, exc: Exception) -> TraceError:
    text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    return TraceError(path, f"not valid JSON ({text})")


#: how much of the decompressed head and tail :func:`read_header` reads before it falls back
#: to parsing the whole file
HEAD_BYTES = 4 << 20
#: epoch µs of 2001-09-09: a trace's ``ts`` below it counts from a base, not from the epoch
EPOCH_US_2001 = 1e15
TAIL_BYTES = 1 << 20


class _Ambiguous(Exception):
    """The head and tail do not tell the top-level keys for sure: parse the whole file."""


def read_header(path: Path) -> Header:
    """The trace's top-level keys.  Kineto writes them before ``traceEvents`` and a few after
    it (``baseTimeNanoseconds``, ``traceName``): they are read from the file's head (parsed up
    to the event array) and its tail (what follows the array), decompressing the middle
    without parsing it; where that does not settle them (any doubt: see :func:`_tail_keys`),
    the whole file is parsed, the events' tokens skipped in C.  A bad event is not found
    here: the passes over the events check each (:func:`checked`)."""
    size = check_path(path).st_size
    try:
        top, seen_events, encoding = _fast_keys(path)
    except _Ambiguous:
        top, seen_events, encoding = _all_keys(path)
    if not seen_events:
        raise TraceError(path, "has no traceEvents: not a torch.profiler trace")
    base = top.pop("baseTimeNanoseconds", 0)
    if not (isinstance(base, int) and not isinstance(base, bool) and 0 <= base < 2**62):
        raise TraceError(path, f"baseTimeNanoseconds is {_show(base)}, not a time in ns")
    props = top.pop("deviceProperties", [])
    if not isinstance(props, list) or not all(isinstance(p, dict) for p in props):
        raise TraceError(path, "deviceProperties is not a list of objects")
    dist = top.pop("distributedInfo", {})
    if not isinstance(dist, dict):
        raise TraceError(path, "distributedInfo is not an object")
    schema = top.pop("schemaVersion", None)
    other = {k: v for k, v in top.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return Header(path, size, encoding, base, tuple(props), dist, schema, other)


def _top_keys(path: Path, parser: Any, stop_at_events: bool) -> tuple[dict[str, Any], bool, Any]:
    """The top-level keys ``parser`` (ijson.parse) yields, built; whether ``traceEvents`` was
    seen; with ``stop_at_events``, the ``ts`` of the first event (None if not reached) and the
    parse stops there, else the event tokens are skipped in C."""
    ijson = _ijson()
    top: dict[str, Any] = {}
    end_of_events = ("traceEvents", "end_array", None)
    first = next(parser, None)
    if first is None:
        raise TraceError(path, "empty file")
    if first[1] != "start_map":
        shape = {"start_array": "a JSON array"}.get(first[1], f"a JSON {first[1]}")
        raise TraceError(path, f"is {shape}, not a trace object ({{\"traceEvents\": [...]}}, "
                               "as torch.profiler writes it)")
    builder, key, seen_events = None, None, False
    for prefix, event, value in parser:
        if key == "traceEvents" and prefix == "traceEvents" and event != "start_array":
            raise TraceError(path, "traceEvents is not an array of events")
        if prefix == "" and event == "map_key":
            key = value
            seen_events = seen_events or value == "traceEvents"
            builder = None if value == "traceEvents" else ijson.ObjectBuilder()
            continue
        if prefix == "traceEvents" and event == "start_array":
            if stop_at_events:
                ts = next((v for p, e, v in parser if p == "traceEvents.item.ts" or p == "traceEvents"), None)
                return top, True, ts
            # the events, token by token in C until their array closes
            next(dropwhile(end_of_events.__ne__, parser), None)
            key = None
            continue
        if builder is not None and key is not None:
            builder.event(event, value)
            if prefix == key and event not in ("start_map", "start_array", "map_key"):
                top[key] = builder.value
                builder = None
    return top, seen_events, None


def _all_keys(path: Path) -> tuple[dict[str, Any], bool, str]:
    """The top-level keys, whether ``traceEvents`` was there, and how the file is stored."""
    ijson = _ijson()
    with _Checked(path) as stream:
        try:
            top, seen, _ = _top_keys(path, ijson.parse(stream, use_float=True), False)
            return top, seen, stream.encoding
        except TraceError:
            raise
        except (ijson.JSONError, ijson.IncompleteJSONError, ValueError) as exc:
            raise _json_error(path, exc) from None
        except RecursionError:
            raise TraceError(path, "nested too deeply to be a trace") from None


def _fast_keys(path: Path) -> tuple[dict[str, Any], bool, str]:
    """The keys before the event array (from the head) and after it (from the tail), as
    :func:`_all_keys` returns them."""
    ijson = _ijson()
    with _Checked(path) as stream:
        head = stream.read(HEAD_BYTES)
        try:
            top, seen, first_ts = _top_keys(path, ijson.parse(io.BytesIO(head), use_float=True), True)
        except TraceError:
            raise
        except (ijson.IncompleteJSONError, ijson.JSONError, ValueError, RecursionError) as exc:
            if len(head) < HEAD_BYTES:  # the whole file was in the head: it is not JSON
                raise _json_error(path, exc) from None
            raise _Ambiguous from None
        if not seen:
            if len(head) < HEAD_BYTES:
                return top, False, stream.encoding
            raise _Ambiguous  # the keys before the events are longer than the head
        tail = head
        while block := stream.read(CHUNK):
            tail = (tail + block)[-TAIL_BYTES:]
        encoding = stream.encoding
    after = _tail_keys(tail)
    if after is None:
        raise _Ambiguous
    top.update(after)
    # times that count from a base (not epoch µs: those exceed 1e15 since 2001) with no base
    # found: a key may have been missed, be exact
    if "baseTimeNanoseconds" not in top and _number(first_ts) and first_ts < EPOCH_US_2001:
        raise _Ambiguous
    return top, True, encoding


def _tail_keys(tail: bytes) -> dict[str, Any] | None:
    """The top-level keys after the event array, from the file's last bytes: the text after
    the array's ``]`` is ``, "key": value ... }``.  Candidates are tried from the last ``]``
    back; one is taken only where the text before it ends an event (``}``) or an empty array
    (``[``) and what follows parses as the rest of an object.  None: no candidate settles it
    (the caller parses the whole file)."""
    import json

    text = tail.rstrip()
    if not text.endswith(b"}"):
        return None
    at = len(text)
    for _ in range(64):
        at = text.rfind(b"]", 0, at)
        if at < 0:
            return None
        before = text[:at].rstrip()[-1:]
        rest = text[at + 1:].strip()
        if before not in (b"}", b"["):
            continue
        if rest == b"}":
            return {}
        if not rest.startswith(b","):
            continue
        try:
            found = json.loads(b"{" + rest[1:])
        except ValueError:
            continue
        # a later list of objects (not Kineto's) could end like the array: keys before it would
        # be missed; the one that matters, the base, is checked for by the caller
        return found if isinstance(found, dict) else None
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def events(path: Path) -> Iterator[Mapping[str, Any]]:
    """The trace's events, one at a time, as ijson builds them (floats for non-integers)."""
    ijson = _ijson()
    with _Checked(path) as stream:
        count = 0
        try:
            for event in ijson.items(stream, "traceEvents.item", use_float=True):
                yield event
                count += 1
        except TraceError:
            raise
        except (ijson.JSONError, ijson.IncompleteJSONError, ValueError) as exc:
            where = f"after event {count - 1}" if count else "in or before the first event"
            raise TraceError(path, f"not valid JSON {where} ({_json_error(path, exc).text})") from None
        except RecursionError:
            raise TraceError(path, "nested too deeply to be a trace", count) from None


def checked(event: Any, index: int, path: Path) -> dict[str, Any] | None:
    """One event as the import uses it (pass 1: every check), or None for one it does not use
    (metadata, flows, counters: ``ph`` other than ``X`` and ``i``).  Categories of 2021 are
    renamed to today's.  An event without a usable name, time or duration raises
    :class:`TraceError`.  (Written for speed: it runs for every event of a GB-sized trace;
    ``type(x) is`` keeps bools out, a chained comparison keeps NaN and infinities out.)"""
    if type(event) is not dict:
        raise TraceError(path, f"is {type(event).__name__}, not an event object", index)
    ph = event.get("ph")
    if ph != "X" and ph != "i" and ph != "I":
        return None
    ts = event.get("ts")
    if not ((type(ts) is float or type(ts) is int) and -MAX_US <= ts <= MAX_US):
        raise TraceError(path, f"ts is {_show(ts)}, not a time in µs", index)
    name = event.get("name", "")
    if type(name) is not str:
        raise TraceError(path, f"name is {type(name).__name__}, not text", index)
    cat = event.get("cat")
    if cat is not None:
        if type(cat) is not str:
            raise TraceError(path, f"cat is {type(cat).__name__}, not text", index)
        if cat in LEGACY_CATEGORIES:
            event["cat"] = LEGACY_CATEGORIES[cat]
    args = event.get("args")
    if args is not None and type(args) is not dict:
        raise TraceError(path, "args is not an object", index)
    if ph == "X":
        dur = event.get("dur", 0)
        if not ((type(dur) is float or type(dur) is int) and 0 <= dur <= MAX_US):
            raise TraceError(path, f"dur is {_show(dur)}, not a duration in µs", index)
    return event


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

