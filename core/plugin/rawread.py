"""Reading a profile's raw data back: :func:`read_raw`, the one reader of the raw store's lines.

The raw store is the core's (``jobprof.files.rawstore`` writes it): one JSON line per finished
iteration, ``{"index": <iteration>, "streams": {"iteration": [...], "<stream>": [...]}}``,
appended to segments ``device_<id>/data/raw.<first iteration:09d>.jsonl``.  A ``PROF_``
directory may have been cut by a crash, edited by hand or written by someone else, so this
reader takes only lines and records of the shape jobprof writes and drops the rest: a last line
cut without its newline silently (that is what a crash leaves), anything else counted and named
once per segment to ``problem`` (a line that is not an iteration line, bad records inside a good
line, an iteration read twice).

A plugin's test reads its records with it::

    from jobprof.plugin import read_raw

    raw = dict(read_raw(device_dir))        # {iteration: {stream: [records]}}
    assert raw[1]["gc"] and raw[1]["iteration"][0]["start_ns"] > 0

The core's ``jobprof.files.rawstore.read`` is this reader with the core's file rules (it opens
through ``fsio``, decodes with orjson where it can, reports into the running command) and with
the ``ops`` stream resolved: operator records are kept in Kineto windows beside the segments,
and the line holds only references to them.  :func:`read_raw` leaves the ``ops`` stream out
(the core's operator capture, read in a writer with ``ctx.records("ops")`` or in a report with
``profile.records("ops")``).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import stat
from collections.abc import Callable, Container, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from jobprof.plugin.records import ITERATION_STREAM, OPS_STREAM, PROFILER_STREAM

__all__ = ["INT_MAX", "Digits", "Strings", "fields_problem", "kind", "line_problem", "read_lines", "read_raw",
           "segments"]

#: a segment's name: ``raw.<first iteration:09d>.jsonl``
SEGMENT_RE = re.compile(r"^raw\.(\d{9})\.jsonl$")
#: the largest integer jobprof writes (ns since boot, epoch ns, iteration numbers): int64
INT_MAX = (1 << 63) - 1

#: one iteration read back: ``(index, {stream: records})``
Line = tuple[int, dict[str, list[Any]]]
#: where read problems go: one line of text each (the file named, what is wrong, what was done)
ProblemSink = Callable[[str], None]
#: resolves a line's ``ops`` stream in place: ``(index, streams, segment, where, add_problem)``
OpsResolver = Callable[[int, dict[str, list[Any]], Path, str, Callable[[str, str], None]], None]


def segments(device_dir: Path) -> list[Path]:
    """A device's raw segments, in order (none when it has no ``data/`` folder)."""
    data = Path(device_dir) / "data"
    if not data.is_dir():
        return []
    # a FIFO or device named like a segment is listed too: the reader names it, once, when its
    # open (which never blocks) refuses it
    return sorted(p for p in data.iterdir() if SEGMENT_RE.match(p.name) and p.exists() and not p.is_dir())


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT_MAX


def _show(value: Any) -> str:
    """A value in a problem message: JSON-ish, one line, short (never a Python repr)."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
             int: "an integer", float: "a number"}
    return names.get(type(value), type(value).__name__)


#: the core's iteration record (jobprof.plugin.Iteration.to_record): field -> (types, required)
_ITERATION_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "index": ((int,), True), "start_ns": ((int,), True), "end_ns": ((int,), True),
    "method": ((str,), True), "fp_start_ns": ((int, type(None)), False),
    "bp_end_ns": ((int, type(None)), False), "skipped": ((bool,), False), "model_id": ((int,), False)}


class Digits:
    """A field type: a non-negative int64, or its decimal digits as a string (start_info's form)."""


class Strings:
    """A field type: a list of strings."""


def _field_ok(value: Any, types: tuple[type, ...]) -> bool:
    if Digits in types and (_int(value) or (isinstance(value, str) and value.isascii() and value.isdigit()
                                            and len(value) <= 19 and int(value) <= INT_MAX)):
        return True
    if Strings in types and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return True
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and int in types:
        return _int(value)
    return isinstance(value, tuple(t for t in types if t not in (Digits, Strings)))


def _want(types: tuple[type, ...]) -> str:
    names = {Digits: "a non-negative integer (or its digits)", Strings: "a list of strings",
             int: "a non-negative integer", type(None): "null"}
    return " or ".join(names.get(t) or kind(t()) for t in types)


def fields_problem(record: Mapping[str, Any], fields: Mapping[str, tuple[tuple[type, ...], bool]],
                   what: str) -> str | None:
    """What is wrong with ``record`` against ``fields`` (name -> (allowed types, required)), or
    None; integers must be non-negative int64 values (what jobprof writes), never booleans."""
    for name, (types, required) in fields.items():
        if name not in record:
            if required:
                return f"{what} has no {name}"
            continue
        if not _field_ok(record[name], types):
            return f"{what} {name} is {_show(record[name])}, not {_want(types)}"
    return None


def line_problem(record: Any) -> tuple[Line | None, str | None]:
    """``((index, streams), None)`` for a good decoded line, ``((index, streams), note)`` when
    records were dropped from it, ``(None, problem)`` for a line that is not an iteration."""
    if not isinstance(record, dict):
        return None, f"{kind(record)}, not an object"
    if "index" not in record or "streams" not in record:
        return None, f"no {'index' if 'index' not in record else 'streams'}"
    index, streams = record["index"], record["streams"]
    if not _int(index):
        return None, f"index is {_show(index)}, not a non-negative integer"
    if not isinstance(streams, dict):
        return None, f"streams is {kind(streams)}, not an object"
    its = streams.get(ITERATION_STREAM)
    if not isinstance(its, list) or not its:
        return None, f"no {ITERATION_STREAM} record" if its is None else \
            f"streams.{ITERATION_STREAM} is {_show(its)}, not a list of one record"
    if not isinstance(its[0], dict):
        return None, f"{ITERATION_STREAM} record is {_show(its[0])}, not an object"
    wrong = fields_problem(its[0], _ITERATION_FIELDS, f"{ITERATION_STREAM} record")
    if wrong is None and its[0]["end_ns"] < its[0]["start_ns"]:
        wrong = f"{ITERATION_STREAM} record ends (end_ns) before it starts (start_ns)"
    if wrong:
        return None, wrong
    kept: dict[str, list[Any]] = {}
    dropped: list[str] = []
    for name, records in streams.items():
        good: list[Any]
        if not isinstance(records, list):
            dropped.append(f"stream {name!s:.40} is {kind(records)}, not a list")
            continue
        if name == PROFILER_STREAM:  # the core's own: [[start_ns, end_ns], ...]
            good = [r for r in records if isinstance(r, list) and len(r) == 2 and all(map(_int, r))
                    and r[0] <= r[1]]
        elif name == ITERATION_STREAM:
            good = records[:1]
        elif all(isinstance(r, (dict, list)) for r in records):  # a plugin's, the common case
            good = records
        else:  # a plugin's: objects (or lists, e.g. task_trace ops), its own fields
            good = [r for r in records if isinstance(r, (dict, list))]
        if len(good) != len(records):
            dropped.append(f"{len(records) - len(good)} bad record(s) of stream {name!s:.40}")
        kept[name] = good
    return (index, kept), "; ".join(dropped) or None


def decode(line: bytes, loads: Callable[[bytes], Any] = json.loads) -> Any:
    """One line decoded (ValueError for anything that is not JSON jobprof could have written)."""
    try:
        return loads(line)
    except RecursionError:  # nesting deeper than the parser's stack: not a line jobprof wrote
        raise ValueError("nested too deeply") from None


class FileProblems:
    """The problems of one file, reported as one message: how many, and the first few."""

    SHOWN = 3

    def __init__(self, path: Path, sink: ProblemSink | None) -> None:
        self.path, self.sink, self.count = path, sink, 0
        self.first: list[str] = []

    def add(self, where: str, text: str) -> None:
        self.count += 1
        if len(self.first) < self.SHOWN:
            self.first.append(f"{where}: {text}")

    def report(self, what: str) -> None:
        if self.count and self.sink is not None:
            more = f"; and {self.count - self.SHOWN} more" if self.count > self.SHOWN else ""
            self.sink(f"{self.path}: {self.count} {what} ({'; '.join(self.first)}{more})")


class Seen:
    """Iteration indices read so far, as sorted ``[first, last]`` runs: one run for the
    in-order lines jobprof writes, so memory does not grow with the run's length."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []

    def add(self, index: int) -> bool:
        """False if ``index`` was added before."""
        runs = self.runs
        if runs and runs[-1][1] + 1 == index:  # the usual case: the next one
            runs[-1][1] = index
            return True
        at = bisect.bisect_right(runs, index, key=lambda run: run[0]) - 1
        if at >= 0 and runs[at][0] <= index <= runs[at][1]:
            return False
        if at >= 0 and runs[at][1] + 1 == index:
            runs[at][1] = index
        else:
            at += 1
            runs.insert(at, [index, index])
        if at + 1 < len(runs) and runs[at][1] + 1 == runs[at + 1][0]:
            runs[at][1] = runs.pop(at + 1)[1]
        return True


def _open_regular(path: Path) -> IO[bytes]:
    """A segment opened to read, only if it is a regular file: opened without blocking and its
    type checked on the descriptor, so a FIFO named like a segment never blocks the reader."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(22, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_lines(device_dir: Path, *, problem: ProblemSink | None = None,
               open_segment: Callable[[Path], IO[bytes]] = _open_regular,
               loads: Callable[[bytes], Any] = json.loads, only: Container[int] | None = None,
               ops: OpsResolver | None = None) -> Iterator[Line]:
    """Every complete iteration of ``device_dir``, in order: ``(index, {stream: records})``;
    with ``only``, just the iterations it holds.  ``ops`` resolves a line's ``ops`` stream in
    place (None: the stream is left out).  Streams one segment at a time, so memory stays
    bounded by a segment; each segment's problems go to ``problem`` once."""
    seen = Seen()
    for segment in segments(device_dir):
        bad, trimmed, twice = FileProblems(segment, problem), FileProblems(segment, problem), \
            FileProblems(segment, problem)
        try:
            handle = open_segment(segment)  # closed by the with below; the open may fail alone
        except OSError as exc:
            if problem is not None:
                problem(f"{segment}: cannot read ({exc.strerror or exc}): its iterations are left out")
            continue
        with handle:
            for number, line in enumerate(handle, 1):
                try:
                    parsed, note = line_problem(decode(line, loads))
                except ValueError as exc:
                    if line.endswith(b"\n"):
                        bad.add(f"line {number}", f"not JSON ({str(exc)[:60]})")
                    continue
                if parsed is None:
                    bad.add(f"line {number}", note or "not an iteration line")
                    continue
                if not seen.add(parsed[0]):  # a copied line: counted once, the first kept
                    twice.add(f"line {number}", f"iteration {parsed[0]} again")
                    continue
                if only is not None and parsed[0] not in only:
                    continue
                if note:
                    trimmed.add(f"line {number}", note)
                if OPS_STREAM in parsed[1]:
                    if ops is None:
                        del parsed[1][OPS_STREAM]
                    else:
                        ops(parsed[0], parsed[1], segment, f"line {number}", trimmed.add)
                yield parsed
        bad.report("line(s) left out, not iteration lines")
        trimmed.report("line(s) with records left out")
        twice.report("line(s) left out, iterations already read (the first line of each is kept)")


def read_raw(device_dir: Path | str, problem: ProblemSink | None = None) -> Iterator[Line]:
    """Every complete iteration a device stored, in order: ``(index, {stream: records})``, the
    records exactly as the hooks returned them, JSON-decoded (the core's ``iteration`` stream:
    one :meth:`Iteration.to_record <jobprof.plugin.Iteration.to_record>` dict; the ``ops``
    stream is left out, see the module).  ``device_dir`` is a ``PROF_.../device_<id>`` folder;
    what is not an iteration line is left out, and named to ``problem`` (one line of text per
    segment) when given.  Use it in a plugin's tests: ``dict(read_raw(device))[1]["gc"]``."""
    return read_lines(Path(device_dir), problem=problem)
