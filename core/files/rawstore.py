"""Raw data: one JSON line per finished iteration, appended to ``device_<id>/data/`` segments.

Each line is ``{"index": <iteration>, "streams": {"iteration": [...], "<stream>": [...]}}``:
the core's own stream ``iteration`` holds the :class:`~jobprof.plugin.Iteration` record, each
plugin's records go under the streams it names.  Lines are appended with ``write()`` on an
``O_APPEND`` descriptor (the sink batches them, see ``jobprof.runtime.sink``): once the call returns,
those iterations survive any crash of the process, SIGKILL included.  That costs one small
syscall per batch instead of a file (open, write, rename) per stream and iteration, which is
what keeps the step tier cheap.  A line torn by a power loss or a full disk is skipped by
readers.  Segments ``raw.<first iteration:09d>.jsonl`` hold up to
``SEGMENT_ITERATIONS`` iterations, so storage ageing can delete whole, old segments.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Container, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import attrs

from jobprof.files import fsio, jsonread, kinetotrace
from jobprof.plugin import rawread
from jobprof.plugin.rawread import Digits, Strings, fields_problem, segments
from jobprof.plugin.rawread import kind as _kind
from jobprof.plugin.records import ITERATION_STREAM, OP_MEMORY_STREAM, OPS_STREAM, PROFILER_STREAM  # noqa: F401

# ITERATION_STREAM and PROFILER_STREAM are declared in jobprof.plugin.records ("core streams") and
# kept importable from here.  PROFILER_STREAM: jobprof's own work inside the iteration, in the
# job's time, ``[[start_ns, end_ns], ...]`` (hand-overs at iteration ends, what
# ``Session.record_own`` was told), each span in the raw line of the iteration it lies in; an
# empty list says 0, not N/A
SEGMENT_ITERATIONS = 100
SEGMENT_BYTES = 8 * 1024 * 1024


@attrs.frozen
class Written:
    """Where one iteration's line went (enough to read it back without a scan)."""

    segment: Path
    offset: int
    length: int
    new_segment: bool


class RawWriter:
    """Appends iteration lines; not thread-safe (one writer per process)."""

    def __init__(self, device_dir: Path) -> None:
        self.data = device_dir / "data"
        # orjson encodes a step-tier line ~10x faster than json.dumps (47 -> ~5 us a line on the
        # sink thread, whose Python holds the GIL the training thread needs); imported here, on
        # the training thread, never by the sink thread at exit (see jsonread.preload)
        fast = jsonread.fast()
        self._orjson = fast.dumps if fast is not None else None
        self._fd: int | None = None
        self.segment: Path | None = None
        self._count = 0
        self._size = 0
        self._fresh = False

    def append_many(self, batch: list[tuple[int, Mapping[str, list[Any]]]],
                    on_bad_stream: Callable[[str, Exception], None] | None = None) -> list[Written]:
        """Append several iterations; lines sharing a segment go out in one ``write()``."""
        out: list[Written] = []
        pending: list[tuple[int, bytes]] = []
        for index, streams in batch:
            if self._fd is None or self._count + len(pending) >= SEGMENT_ITERATIONS \
                    or self._size >= SEGMENT_BYTES:
                out.extend(self._write(pending))
                pending = []
                self._rotate(index)
                self._fresh = True
            pending.append((index, self._encode(index, streams, on_bad_stream)))
        out.extend(self._write(pending))
        return out

    def _write(self, lines: list[tuple[int, bytes]]) -> list[Written]:
        if not lines:
            return []
        # lines only after _rotate opened a segment
        assert self._fd is not None and self.segment is not None
        blob = b"".join(line for _, line in lines)
        written = os.write(self._fd, blob)
        if written != len(blob):  # a short write to a regular file means the disk is full
            raise OSError(28, f"short write ({written} of {len(blob)} bytes)")
        self._check_alive()
        out, offset = [], self._size
        for _, line in lines:
            out.append(Written(self.segment, offset, len(line), self._fresh))
            self._fresh = False
            offset += len(line)
        self._count += len(lines)
        self._size += written
        return out

    def _check_alive(self) -> None:
        assert self._fd is not None  # called by _write only
        if os.fstat(self._fd).st_nlink == 0:  # writes into a deleted file would vanish
            raise OSError(2, f"{self.segment} was deleted while the job ran")

    def _encode(self, index: int, streams: Mapping[str, list[Any]],
                on_bad_stream: Callable[[str, Exception], None] | None) -> bytes:
        fast = self._orjson
        if fast is not None:
            try:  # the common case; orjson refuses what json.dumps takes (a key not a str, an
                # int beyond 64 bits) with a TypeError: then json.dumps decides.  A NaN or an
                # infinity becomes null, which is what it says: no value
                return b'{"index":%d,"streams":%b}\n' % (index, fast(streams))
            except TypeError:
                pass
        try:  # one encode for the whole line
            body = json.dumps(streams, separators=(",", ":"))
        except (TypeError, ValueError):
            if on_bad_stream is None:
                raise
            body = "{" + ",".join(self._encodable(streams, on_bad_stream)) + "}"
        return f'{{"index":{index},"streams":{body}}}\n'.encode()

    def append(self, index: int, streams: Mapping[str, list[Any]],
               on_bad_stream: Callable[[str, Exception], None] | None = None) -> Written:
        """Write one iteration.  A stream that is not JSON-serialisable is left out and handed
        to ``on_bad_stream`` (its plugin's fault, not the other streams'); OSError propagates."""
        return self.append_many([(index, streams)], on_bad_stream)[0]

    @staticmethod
    def _encodable(streams: Mapping[str, list[Any]],
                   on_bad_stream: Callable[[str, Exception], None]) -> Iterator[str]:
        for stream, records in streams.items():
            try:
                yield f"{json.dumps(stream)}:{json.dumps(records, separators=(',', ':'))}"
            except (TypeError, ValueError) as exc:
                on_bad_stream(stream, exc)

    def _rotate(self, index: int) -> None:
        self.close()
        self.segment = self.data / f"raw.{index:09d}.jsonl"
        # through no symlinked PROF_/device/data folder, onto no planted link, FIFO or device
        self._fd = fsio.open_append(self.segment, root=self.data.parent.parent)
        self._count = 0
        self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --- reading: the one layer every command reads raw data and metadata through ----------------
# A PROF_ directory may have been cut by a crash, edited by hand or written by someone else:
# readers take only lines, records and metadata files of the shape jobprof writes, drop the rest
# and say so (one message per file, with a count and the first problem), and go on.

#: where read problems go while a command runs (see :func:`reporting`); nowhere otherwise
_PROBLEMS: ContextVar[Callable[[str], None] | None] = ContextVar("jobprof_read_problems", default=None)


@contextlib.contextmanager
def reporting(sink: Callable[[str], None]) -> Iterator[None]:
    """Send every problem the readers find while the block runs to ``sink`` (one line each)."""
    token = _PROBLEMS.set(sink)
    try:
        yield
    finally:
        _PROBLEMS.reset(token)


def problem(text: str) -> None:
    """Report one read problem (a file named, what is wrong with it and what was done)."""
    sink = _PROBLEMS.get()
    if sink is not None:
        sink(text)


def _load_line(line: bytes) -> Any:
    return rawread.decode(line, jsonread.loads)


def _parse(line: bytes) -> tuple[int, dict[str, list[Any]]] | None:
    """One line's ``(index, streams)``, or None when it is not a valid iteration line."""
    try:
        parsed, _ = rawread.line_problem(_load_line(line))
    except ValueError:
        return None  # a torn last line (power loss, full disk): that iteration is lost
    return parsed


def _resolve_ops(streams: dict[str, list[Any]], windows: kinetotrace.Windows, where: str,
                 add: Callable[[str, str], None] | None) -> None:
    """Replace the ``ops`` stream's window references by the records they hold (in place); a
    window file that cannot be read loses that iteration's operators, named.  Records stored
    inline as arrays become :class:`~jobprof.plugin.OpRecord`\\ s too."""
    refs = streams.get(OPS_STREAM)
    if refs is None:
        return
    if not kinetotrace.is_reference(refs):
        records, bad = kinetotrace.from_arrays(refs)
        streams[OPS_STREAM] = records
        if bad:
            _ops_problem(f"{bad} ops record(s) not shaped as the operator capture writes them: left out",
                         windows, where, add)
        return
    iteration = streams[ITERATION_STREAM][0]
    try:
        streams[OPS_STREAM] = windows.resolve(refs, iteration["start_ns"], iteration["end_ns"])
        memory = windows.resolve_memory(refs, iteration["start_ns"], iteration["end_ns"])
        if memory:  # the allocator events of the same windows (task_memory): the core's stream
            streams[OP_MEMORY_STREAM] = memory
    except (OSError, ValueError, EOFError, KeyError, TypeError) as exc:  # gzip, json, a bad file
        del streams[OPS_STREAM]
        detail = f"{Path(exc.filename).name}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename \
            else str(exc)[:80]
        text = f"operator window unreadable ({type(exc).__name__}: {detail}): its operators are left out"
        _ops_problem(text, windows, where, add)


def _ops_problem(text: str, windows: kinetotrace.Windows, where: str,
                 add: Callable[[str, str], None] | None) -> None:
    """One ``ops`` problem: into the file's tally when reading a segment, else reported alone."""
    if add is not None:
        add(where, text)
    else:
        problem(f"{windows.data_dir}: {where}: {text}")


def read(device_dir: Path, skip_ops: Container[int] = (),
         only: Container[int] | None = None) -> Iterator[tuple[int, dict[str, list[Any]]]]:
    """Every complete iteration on disk, in order: ``(index, {stream: records})``; those in
    ``skip_ops`` without their ``ops`` stream (its operator windows are not read); with
    ``only``, just the iterations it holds (the others' operator windows are not read either).

    The contract's reader (:func:`jobprof.plugin.rawread.read_lines`, what plugins call as
    ``read_raw``) with the core's rules: segments opened through :func:`fsio.open_read`, lines
    decoded by :mod:`jsonread`, the ``ops`` stream's window references resolved.  Streams one
    segment at a time, so memory stays bounded by a segment.  A line that is not a valid
    iteration line is left out (a last line cut without its newline silently: that is what a
    crash leaves), and so are bad records inside a good line; each segment's problems are
    reported once (:func:`reporting`).
    """
    windows: kinetotrace.Windows | None = None

    def resolve(index: int, streams: dict[str, list[Any]], segment: Path, where: str,
                add: Callable[[str, str], None]) -> None:
        nonlocal windows
        if index in skip_ops:
            del streams[OPS_STREAM]
            return
        windows = windows or kinetotrace.Windows(segment.parent)
        _resolve_ops(streams, windows, where, add)

    return rawread.read_lines(device_dir, problem=problem, open_segment=fsio.open_read,
                              loads=jsonread.loads, only=only, ops=resolve)


def read_object(path: Path, fields: Mapping[str, tuple[tuple[type, ...], bool]] | None = None,
                what: str = "") -> dict[str, Any] | None:
    """A metadata file (info.json, start_info, end_info) that must be one JSON object: the
    object, with fields of the wrong type (``fields``: name -> (types, required)) reported and
    left out; None, reported, when the file is unreadable, not JSON, not an object or lacks a
    required field; None, silently, when it does not exist (the caller decides what that means)."""
    try:
        data = _load_line(fsio.read_bytes(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        problem(f"{path}: cannot read ({exc.strerror or exc}){what}")
        return None
    except ValueError as exc:
        problem(f"{path}: not valid JSON ({str(exc)[:60]}){what}")
        return None
    if not isinstance(data, dict):
        problem(f"{path}: holds {_kind(data)}, not a JSON object{what}")
        return None
    for name, (types, required) in (fields or {}).items():
        wrong = fields_problem(data, {name: (types, required)}, "field")
        if wrong is None:
            continue
        if required:
            problem(f"{path}: {wrong}{what}")
            return None
        problem(f"{path}: {wrong}: ignored")
        del data[name]
    return data


#: start_info.<dev> / end_info.<dev> (jobprof.plugin.clock.ClockAnchor.info): the clock pair, as strings
START_FIELDS = {"collectionTimeBegin": ((Digits,), True), "clockMonotonic": ((Digits,), True),
                "clockMonotonicRaw": ((Digits,), False)}
END_FIELDS = {"collectionTimeEnd": ((Digits,), False), "clockMonotonic": ((Digits,), False),
              "clockMonotonicRaw": ((Digits,), False)}
#: info.json.<dev> (jobprof.files.profdir.host_info and the session's ``jobprof`` section): the fields
#: readers use; rank_id is an integer or "N/A"
INFO_FIELDS = {"hostname": ((str,), False), "pid": ((Digits,), False), "pid_name": ((str,), False),
               "rank_id": ((int, str), False), "jobprof": ((dict,), False)}
INFO_JOBPROF_FIELDS = {"options": ((dict,), False), "explicit": ((Strings,), False),
                       "time_base_ns": ((int,), False), "calibration": ((dict,), False),
                       "iteration_method": ((str,), False), "plugins": ((Strings,), False),
                       "world_size": ((int, str), False), "backend": ((str,), False)}


def escaped(text: str) -> str:
    """``text`` with control characters as ``\\xNN`` / ``\\uNNNN`` escapes."""
    if text.isprintable():  # the common case, in C: a summary's lines, most names
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   for c in text)


def read_info(path: Path) -> dict[str, Any] | None:
    """A device's info.json (see :func:`read_object`), its ``jobprof`` section checked too;
    the names commands print (hostname, pid_name) never carry a control character to a terminal."""
    info = read_object(path, INFO_FIELDS)
    for name in ("hostname", "pid_name"):
        if info is not None and isinstance(info.get(name), str) and not info[name].isprintable():
            info[name] = escaped(info[name])
            problem(f"{path}: field {name} holds control characters: shown escaped ({info[name][:60]})")
    if info is not None and "jobprof" in info:
        own = dict(info["jobprof"])
        for name, spec in INFO_JOBPROF_FIELDS.items():
            wrong = fields_problem(own, {name: spec}, "field jobprof.")
            if wrong:
                problem(f"{path}: {wrong.replace('jobprof. ', 'jobprof.')}: ignored")
                del own[name]
        info["jobprof"] = own
    return info


def read_start(path: Path) -> dict[str, Any] | None:
    """A device's start_info (its clock anchor), or None, reported, when unusable."""
    return read_object(path, START_FIELDS, ": the device's clock anchor is unknown")


def read_end(path: Path) -> dict[str, Any] | None:
    """A device's end_info, or None (absent: the job did not finish; unusable: reported)."""
    return read_object(path, END_FIELDS, ": read as if the process did not finish")

#: the start of every line :meth:`RawWriter._encode` writes
_INDEX_RE = re.compile(rb'^\{"index":(\d+),')


def indices(device_dir: Path) -> set[int]:
    """Iterations whose raw line is on disk, read from each line's prefix without decoding it;
    a torn line (no newline) is left out as :func:`read` does."""
    found = set()
    for segment in segments(device_dir):
        try:
            with fsio.open_read(segment) as handle:
                for line in handle:
                    m = _INDEX_RE.match(line)
                    if m and line.endswith(b"}\n"):
                        found.add(int(m.group(1)))
        except OSError:
            continue  # read() names the unreadable segment
    return found


def read_at(where: Written, windows: kinetotrace.Windows | None = None) -> dict[str, list[Any]] | None:
    """One iteration's streams, from the position :meth:`RawWriter.append` returned;
    ``windows``: the caller's reader of operator windows (kept across calls: consecutive
    iterations share windows)."""
    with fsio.open_read(where.segment) as handle:
        handle.seek(where.offset)
        parsed = _parse(handle.read(where.length))
    if parsed is None:
        return None
    if OPS_STREAM in parsed[1]:
        if windows is None or windows.data_dir != where.segment.parent:
            windows = kinetotrace.Windows(where.segment.parent)
        _resolve_ops(parsed[1], windows, f"iteration {parsed[0]}", None)
    return parsed[1]
