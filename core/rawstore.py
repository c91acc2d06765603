"""Raw data: one JSON line per finished iteration, appended to ``device_<id>/data/`` segments.

Each line is ``{"index": <iteration>, "streams": {"iteration": [...], "<stream>": [...]}}``:
the core's own stream ``iteration`` holds the :class:`~jobprof.types.Iteration` record, each
plugin's records go under the streams it names.  Lines are appended with ``write()`` on an
``O_APPEND`` descriptor (the sink batches them, see ``jobprof.sink``): once the call returns,
those iterations survive any crash of the process, SIGKILL included.  That costs one small
syscall per batch instead of a file (open, write, rename) per stream and iteration, which is
what keeps the step tier cheap.  A line torn by a power loss or a full disk is skipped by
readers.  Segments ``raw.<first iteration:09d>.jsonl`` hold up to
``SEGMENT_ITERATIONS`` iterations, so storage ageing can delete whole, old segments.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from jobprof import fsio

ITERATION_STREAM = "iteration"
#: jobprof's own work inside the iteration, in the job's time: ``[[start_ns, end_ns], ...]``
#: (hand-overs at iteration ends, what ``Session.record_own`` was told), each span in the raw line
#: of the iteration it lies in; an empty list says 0, not N/A
PROFILER_STREAM = "profiler"
SEGMENT_ITERATIONS = 100
SEGMENT_BYTES = 8 * 1024 * 1024
_SEGMENT_RE = re.compile(r"^raw\.(\d{9})\.jsonl$")


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
        if os.fstat(self._fd).st_nlink == 0:  # writes into a deleted file would vanish
            raise OSError(2, f"{self.segment} was deleted while the job ran")

    def _encode(self, index: int, streams: Mapping[str, list[Any]],
                on_bad_stream: Callable[[str, Exception], None] | None) -> bytes:
        try:  # the common case: one encode for the whole line
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


def segments(device_dir: Path) -> list[Path]:
    data = device_dir / "data"
    if not data.is_dir():
        return []
    return sorted(p for p in data.iterdir() if _SEGMENT_RE.match(p.name))


def _parse(line: bytes) -> tuple[int, dict[str, list[Any]]] | None:
    try:
        record = json.loads(line)
        return int(record["index"]), record["streams"]
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line (power loss, full disk): that iteration is lost


def read(device_dir: Path) -> Iterator[tuple[int, dict[str, list[Any]]]]:
    """Every complete iteration on disk, in order: ``(index, {stream: records})``.

    Streams one segment at a time, so memory stays bounded by a segment.
    """
    for segment in segments(device_dir):
        with open(segment, "rb") as handle:
            for line in handle:
                parsed = _parse(line)
                if parsed is not None and ITERATION_STREAM in parsed[1]:
                    yield parsed


#: the start of every line :meth:`RawWriter._encode` writes
_INDEX_RE = re.compile(rb'^\{"index":(\d+),')


def indices(device_dir: Path) -> set[int]:
    """Iterations whose raw line is on disk, read from each line's prefix without decoding it;
    a torn line (no newline) is left out as :func:`read` does."""
    found = set()
    for segment in segments(device_dir):
        with open(segment, "rb") as handle:
            for line in handle:
                m = _INDEX_RE.match(line)
                if m and line.endswith(b"}\n"):
                    found.add(int(m.group(1)))
    return found


def read_at(where: Written) -> dict[str, list[Any]] | None:
    """One iteration's streams, from the position :meth:`RawWriter.append` returned."""
    with open(where.segment, "rb") as handle:
        handle.seek(where.offset)
        parsed = _parse(handle.read(where.length))
    return parsed[1] if parsed else None
