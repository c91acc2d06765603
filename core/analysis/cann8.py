"""The CANN 8 layout: ``PROF_*/mindstudio_profiler_output/<name>_<YYYYMMDDhhmmss>.csv|json``.

Newer msprof (CANN 8.0+) writes one file per summary / timeline name with every device and
iteration, instead of one per device and iteration (docs/msprof.md section 2), and modern readers
(msprof-analyze, MindStudio Insight) look there.  jobprof assembles that folder from the
per-iteration files ``jobprof export`` renders, so both layouts hold the same rows:

- CSV tables: one header, rows of every device and iteration sorted by device then start time
  (per device, file by file, through a small reorder buffer: iterations follow each other, so
  a device's rows never need more than about one iteration in memory);
- statistic tables (rows are aggregates, :data:`STATISTIC_TABLES`): re-aggregated per device
  over every iteration (Count and Total summed, Min / Max, Avg = Total / Count, Ratio over the
  device's total), not concatenated;
- tables over :data:`MAX_ROWS` rows are split into ``<name>_slice_<n>_<ts>.csv``;
- timelines: one ``<name>_<ts>.json`` per timeline name, streamed with merge's writer, the
  processes of each device on their own pids.

The folder is built next to the old one and swapped in, so a second export leaves no stale file.
"""

from __future__ import annotations

import csv
import datetime as dt
import heapq
import io
import itertools
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from jobprof.analysis.merge import Rewriter, TraceWriter, load_events, read_sources
from jobprof.files import csvsafe, fsio
from jobprof.files.profdir import device_dirs, device_id, iteration_files

FOLDER = "mindstudio_profiler_output"
#: msprof splits a table past this many rows (header excluded) into slices
MAX_ROWS = 1_000_000
#: tables whose rows are aggregates over an iteration, re-aggregated instead of concatenated
STATISTIC_TABLES = ("op_statistic", "communication_statistic")
#: the column a table's rows are sorted by within a device (the first one the header has)
START_COLUMNS = ("Task Start Time(us)", "task_start(us)", "Timestamp(us)", "Start_time(us)", "FP Start(us)")
#: what the assembled files are named: ``<name>_<ts>`` or ``<name>_slice_<n>_<ts>``
OUTPUT_RE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*?)(?:_slice_(?P<slice>\d+))?_(?P<ts>\d{14})\.(?:csv|json)$")
NA = "N/A"


@attrs.frozen
class Cann8Result:
    folder: Path
    stamp: str
    #: output file name -> data rows (CSV) or events (JSON)
    files: dict[str, int]
    problems: tuple[str, ...] = ()


def _per_name(prof: Path, folder: str) -> dict[str, dict[int, list[Path]]]:
    """``{name: {device: [paths in iteration order]}}`` of one folder kind of every device."""
    found: dict[str, dict[int, list[Path]]] = {}
    for device_dir in device_dirs(prof):
        device = device_id(device_dir)
        for file in iteration_files(device_dir, folder):
            found.setdefault(file.name, {}).setdefault(device, []).append(file.path)
    return {name: dict(sorted(devices.items())) for name, devices in sorted(found.items())}


def assemble(prof: Path, stamp: str | None = None,
             advance: Callable[[int], None] | None = None) -> Cann8Result:
    """Build ``prof/mindstudio_profiler_output`` from the per-iteration files; ``advance(n)``
    is called as input files are done (for a progress bar)."""
    stamp = stamp or dt.datetime.now().strftime("%Y%m%d%H%M%S")
    tables = _per_name(prof, "summary")
    timelines = _per_name(prof, "timeline")
    # a new folder of a name no one could plant (fsio), in a PROF_ folder that is no symlink
    stage = fsio.make_unique_dir(prof, f".{FOLDER}.", root=prof)
    files: dict[str, int] = {}
    problems: list[str] = []
    step = advance or (lambda _n: None)
    # every device's timelines onto one time axis: the earliest base (a job has one)
    bases = {s.device: s.time_base_ns for s in read_sources(prof)}
    out_base = min(bases.values(), default=0)
    try:
        for name, devices in tables.items():
            out = _Sliced(stage, name, stamp, prof)
            if name in STATISTIC_TABLES:
                _statistic(devices, out, problems, step)
            else:
                _concatenate(devices, out, problems, step,
                             fill=_OpStates if name in OP_STATE_TABLES else None)
            files.update(out.close())
        for name, devices in timelines.items():
            path = stage / f"{name}_{stamp}.json"
            ids = itertools.count(1)
            with TraceWriter(path, wrapped=False, root=prof) as writer:
                for group, (device, paths) in enumerate(devices.items()):
                    rewriter = Rewriter(group, ids, base_ns=bases.get(device, out_base), out_base_ns=out_base)
                    named: set[str] = set()
                    for p in paths:
                        writer.write(_first_metadata(rewriter.rewrite(load_events(p)), named))
                        step(1)
                writer.close()
            files[path.name] = writer.events
        _swap(stage, prof / FOLDER)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return Cann8Result(prof / FOLDER, stamp, files, tuple(problems))


def _first_metadata(events: list[dict[str, Any]], named: set[str]) -> list[dict[str, Any]]:
    """The events less the metadata (process / thread names, sort indices, labels) an earlier
    iteration's file already gave: each per-iteration file names its tracks, msprof's one
    file names each once."""
    out = []
    for event in events:
        if event.get("ph") == "M":
            key = json.dumps([event.get("pid"), event.get("tid"), event.get("name"), event.get("args")],
                             sort_keys=True, default=str)
            if key in named:
                continue
            named.add(key)
        out.append(event)
    return out


def input_files(prof: Path) -> int:
    """How many per-iteration files :func:`assemble` reads (the progress bar's total)."""
    return sum(len(paths) for kind in (_per_name(prof, "summary"),
                                       _per_name(prof, "timeline"))
               for devices in kind.values() for paths in devices.values())


def _swap(stage: Path, final: Path) -> None:
    """Put ``stage`` where ``final`` is; the old folder goes only after the new one is in place."""
    old = final.with_name(f".{final.name}.{os.getpid()}.old")
    if final.is_symlink() or final.exists():  # a link is moved aside itself, never followed
        os.replace(final, old)
    os.replace(stage, final)
    if old.is_symlink():
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)


class _Sliced:
    """A table written as ``<name>_<ts>.csv``, or ``<name>_slice_<n>_<ts>.csv`` files of at most
    :data:`MAX_ROWS` rows each, every one with the header."""

    def __init__(self, folder: Path, name: str, stamp: str, root: Path | None = None) -> None:
        self.folder, self.name, self.stamp, self.root = folder, name, stamp, root
        self.header: list[str] | None = None
        self._slices: list[tuple[Path, int]] = []
        self._handle: IO[str] | None = None
        self._rows = 0

    def start(self, header: list[str]) -> None:
        self.header = header

    def _open(self) -> IO[str]:
        if self._handle is not None:
            self._handle.close()
            self._slices[-1] = (self._slices[-1][0], self._rows)
        path = self.folder / f"{self.name}_slice_{len(self._slices)}_{self.stamp}.csv"
        handle = self._handle = fsio.create(path, self.root)  # closed in close
        assert self.header is not None  # start() comes first
        csv.writer(handle, lineterminator="\n").writerow(self.header)
        self._slices.append((path, 0))
        self._rows = 0
        return handle

    def write_line(self, line: str) -> None:
        """One data row, already CSV text ending in ``\\n``."""
        handle = self._handle
        if handle is None or self._rows >= MAX_ROWS:
            handle = self._open()
        handle.write(line)
        self._rows += 1

    def close(self) -> dict[str, int]:
        handle = self._handle
        if handle is None:
            if self.header is None:
                return {}
            handle = self._open()  # a table whose files hold a header only: keep it, empty
        handle.close()
        self._slices[-1] = (self._slices[-1][0], self._rows)
        if len(self._slices) == 1:
            path, rows = self._slices[0]
            whole = path.with_name(f"{self.name}_{self.stamp}.csv")
            os.replace(path, whole)
            return {whole.name: rows}
        return {path.name: rows for path, rows in self._slices}


def _lines(path: Path) -> tuple[list[str], list[tuple[list[str], str]]]:
    """A CSV file's header and its rows, each as (cells, the line's own text)."""
    text = fsio.read_text(path)
    lines = text.splitlines(keepends=True)
    rows = list(csv.reader(lines))
    if len(rows) != len(lines):  # a quoted cell spans lines: write the rows back from cells
        rows_text = []
        for cells in rows:
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerow(cells)
            rows_text.append(out.getvalue())
        lines = rows_text
    if not rows:
        return [], []
    kept = []
    for cells, line in zip(rows[1:], lines[1:], strict=True):
        safe = csvsafe.safe_row(cells)  # a profile written before cells were neutralised
        if safe is not None:
            cells, buffer = safe, io.StringIO()
            csv.writer(buffer, lineterminator="\n").writerow(safe)
            line = buffer.getvalue()
        kept.append((cells, line if line.endswith("\n") else line + "\n"))
    return rows[0], kept


def _keys(header: list[str]) -> list[tuple[str, int]]:
    """Columns as (name, how many of that name came before): step_trace repeats its
    ``Reduce Start(us), Reduce Duration(us)`` pair once per all-reduce of the iteration."""
    seen: dict[str, int] = {}
    out = []
    for name in header:
        out.append((name, seen.get(name, 0)))
        seen[name] = seen.get(name, 0) + 1
    return out


def _headers(devices: dict[int, list[Path]]) -> list[str]:
    """The union of the files' headers in order of first appearance (step_trace files have as
    many Reduce pairs as their iteration had all-reduces; devices may have other aic_metrics
    columns); read from each file's first line only."""
    union: dict[tuple[str, int], None] = {}
    for paths in devices.values():
        for path in paths:
            with fsio.open_read(path, "r", newline="", encoding="utf-8") as handle:
                union.update(dict.fromkeys(_keys(next(csv.reader(handle), []))))
    return [name for name, _ in union]


def _remap(cells: list[str], header: list[str], union: list[str]) -> str:
    """A row of a file with another header, laid out in the union's columns (N/A where the
    file has none: the contract's padding of missing Reduce pairs)."""
    values = dict(zip(_keys(header), cells, strict=False))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow([values.get(key, NA) for key in _keys(union)])
    return out.getvalue()


def _number(cell: str) -> float | None:
    """A cell's value, or None for N/A and other text."""
    try:
        return float(cell)
    except ValueError:
        return None


#: tables with an ``OP State`` column, filled by :class:`_OpStates` when assembled
OP_STATE_TABLES = ("op_summary",)
OP_STATE, OP_NAME, INPUT_SHAPES = "OP State", "Op Name", "Input Shapes"


class _OpStates:
    """``OP State`` of a device's operators from their shapes over every iteration.

    Ascend compiles an operator for static or dynamic shapes; eager PyTorch compiles nothing,
    but what the state tells a reader (does this operator meet new shapes from iteration to
    iteration?) is measurable.  A row is ``static`` when its operator ran with these input
    shapes in every iteration in which the operator ran at all; ``dynamic`` when some
    iteration ran the operator without these shapes (a batch or sequence length that varies,
    a shape seen in the warm-up only); ``N/A`` when the operator ran in one iteration only
    (nothing to compare) or its shapes were not recorded (``task_trace`` ``l0``).  By name and
    shapes, not by position, so a call that one iteration adds (the first one's set-up)
    shifts nothing.  Memory: two counters per distinct (name, shapes), hashed."""

    def __init__(self, paths: list[Path]) -> None:
        #: iterations in which an operator name / a (name, shapes) pair appears
        self._names: dict[str, int] = {}
        self._pairs: dict[int, int] = {}
        for path in paths:
            header, rows = _lines(path)
            if OP_NAME not in header or INPUT_SHAPES not in header:
                return
            name_at, shapes_at = header.index(OP_NAME), header.index(INPUT_SHAPES)
            names, pairs = set(), set()
            for cells, _ in rows:
                name, shapes = self._cells(cells, name_at, shapes_at)
                names.add(name)
                pairs.add(hash((name, shapes)))
            for name in names:
                self._names[name] = self._names.get(name, 0) + 1
            for pair in pairs:
                self._pairs[pair] = self._pairs.get(pair, 0) + 1

    @staticmethod
    def _cells(cells: list[str], name_at: int, shapes_at: int) -> tuple[str, str]:
        return (cells[name_at] if name_at < len(cells) else "",
                cells[shapes_at] if shapes_at < len(cells) else NA)

    def state(self, name: str, shapes: str) -> str:
        runs = self._names.get(name, 0)
        if runs < 2 or shapes in (NA, ""):
            return NA
        return "static" if self._pairs.get(hash((name, shapes)), 0) == runs else "dynamic"

    def fill(self, header: list[str], rows: list[tuple[list[str], str]]) -> list[tuple[list[str], str]]:
        """The rows of one iteration's file with their ``OP State`` set."""
        if OP_STATE not in header or OP_NAME not in header or INPUT_SHAPES not in header:
            return rows
        state_at = header.index(OP_STATE)
        name_at, shapes_at = header.index(OP_NAME), header.index(INPUT_SHAPES)
        out = []
        for cells, _ in rows:
            if state_at < len(cells):
                cells = [*cells[:state_at], self.state(*self._cells(cells, name_at, shapes_at)),
                         *cells[state_at + 1:]]
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="\n").writerow(cells)
            out.append((cells, buffer.getvalue()))
        return out


def _concatenate(devices: dict[int, list[Path]], out: _Sliced, problems: list[str],
                 step: Callable[[int], None],
                 fill: Callable[[list[Path]], _OpStates] | None = None) -> None:
    union = _headers(devices)
    out.start(union)
    column = next((c for c in START_COLUMNS if c in union), None)
    for device, paths in devices.items():
        heap: list[tuple[float, int, str]] = []
        order = itertools.count()
        last = float("-inf")
        late = 0
        states = fill(paths) if fill is not None else None
        for path in paths:
            header, rows = _lines(path)
            step(1)
            if states is not None:
                rows = states.fill(header, rows)
            same = header == union
            texts = [line if same else _remap(cells, header, union) for cells, line in rows]
            if column is None or column not in header:
                for text in texts:
                    out.write_line(text)
                continue
            index = header.index(column)
            keyed: list[tuple[float, int, str]] = []
            previous = last
            for (cells, _), text in zip(rows, texts, strict=True):
                start = _number(cells[index]) if index < len(cells) else None
                previous = start if start is not None else previous  # N/A stays where it is
                keyed.append((previous, next(order), text))
            keyed.sort()
            # rows earlier than this file's first start cannot come later: write them out
            while heap and keyed and heap[0][0] <= keyed[0][0]:
                last = _emit(out, heapq.heappop(heap), last)
            for item in keyed:
                if item[0] < last:
                    late += 1
                heapq.heappush(heap, item)
        while heap:
            last = _emit(out, heapq.heappop(heap), last)
        if late:
            problems.append(f"{out.name}: device {device}: {late} row(s) start before rows already written "
                            f"(iterations overlap): they are out of '{column}' order")


def _emit(out: _Sliced, item: tuple[float, int, str], last: float) -> float:
    out.write_line(item[2])
    return max(last, item[0])


#: statistic columns by role; every other column (but Device_id) names the group
_COUNT, _TOTAL, _MIN, _AVG, _MAX, _RATIO = ("Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)",
                                            "Max Time(us)", "Ratio(%)")
_AGGREGATES = {_COUNT, _TOTAL, _MIN, _AVG, _MAX, _RATIO}


def _statistic(devices: dict[int, list[Path]], out: _Sliced, problems: list[str],
               step: Callable[[int], None]) -> None:
    union = _headers(devices)
    out.start(union)
    missing = [c for c in (_COUNT, _TOTAL) if c not in union]
    if missing:
        problems.append(f"{out.name}: no {' / '.join(missing)} column: rows concatenated, not re-aggregated")
        _concatenate(devices, out, problems, lambda _n: None)
        step(sum(len(p) for p in devices.values()))
        return
    keys = [c for c in union if c not in _AGGREGATES and c != "Device_id"]
    for device, paths in devices.items():
        groups: dict[tuple[str, ...], list[Any]] = {}
        for path in paths:
            header, rows = _lines(path)
            step(1)
            for cells, _ in rows:
                row = dict(zip(header, cells, strict=False))
                count, total = _number(row.get(_COUNT, "")), _number(row.get(_TOTAL, ""))
                if count is None or total is None:
                    continue
                low, high = _number(row.get(_MIN, "")), _number(row.get(_MAX, ""))
                group = groups.setdefault(tuple(row.get(k, NA) for k in keys), [0, 0.0, None, None])
                group[0] += int(count)
                group[1] += total
                if low is not None:
                    group[2] = low if group[2] is None else min(group[2], low)
                if high is not None:
                    group[3] = high if group[3] is None else max(group[3], high)
        grand = sum(g[1] for g in groups.values())
        for key, (count, total, low, high) in sorted(groups.items(), key=lambda kv: (-kv[1][1], kv[0])):
            values = dict(zip(keys, key, strict=True))
            values.update({
                "Device_id": str(device), _COUNT: str(count), _TOTAL: f"{total:.3f}",
                _MIN: NA if low is None else f"{low:.3f}", _MAX: NA if high is None else f"{high:.3f}",
                _AVG: f"{total / count:.3f}" if count else NA,
                _RATIO: f"{100 * total / grand:.3f}" if grand else NA})
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerow([values.get(c, NA) for c in union])
            out.write_line(text.getvalue())


def output_files(folder: Path) -> Iterator[tuple[str, int | None, str, Path]]:
    """``(name, slice or None, stamp, path)`` of every file of an assembled folder."""
    for path in sorted(folder.iterdir()):
        m = OUTPUT_RE.match(path.name)
        if m:
            yield m["name"], int(m["slice"]) if m["slice"] is not None else None, m["ts"], path


def describe(result: Cann8Result) -> Sequence[str]:
    """Lines for the CLI: the folder, then each file with its rows / events."""
    return [f"{result.folder}: {len(result.files)} file(s), timestamp {result.stamp}",
            *(f"  {name}: {count} {'events' if name.endswith('.json') else 'rows'}"
              for name, count in sorted(result.files.items()))]
