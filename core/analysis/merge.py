"""``jobprof merge``: every rank's master timelines on one time axis, in one Chrome-trace file.

Each device folder holds per-iteration timelines whose ``ts`` are µs since the job's time base
(``jobprof.plugin.clock``), converted with that process's own clock anchor (``start_info``: the wall
clock and the monotonic clock read at one instant).  Processes on one host read the same wall
clock, so their files already share an axis; ranks on different hosts are only as close as NTP
keeps their clocks, which ``--align collectives`` corrects from the collectives every rank took
part in.  Every shift is done in integer ns (a ``ts`` of a job-relative file is exact to the ns),
onto the earliest base of the merged ranks, so nesting survives the merge.

The output is written as a stream (one input file loaded, rewritten, dumped and freed at a time)
to a temporary file renamed into place at the end.  :class:`TraceWriter` and :class:`Rewriter`
are shared with the CANN 8 layout (``jobprof.analysis.cann8``), which stitches timelines the same way.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from jobprof.analysis.selection import ranges, window
from jobprof.files import fsio, jsonread, rawstore
from jobprof.files.fsio import STDOUT, StreamedFile, make_dirs
from jobprof.files.profdir import IterationFile, device_dirs, device_id, info_rank, iteration_files
from jobprof.plugin.clock import ClockAnchor, own_base, ts_ns
from jobprof.plugin.timeline import PID_BASE

#: the master timeline's writer name (``jobprof.plugin.timeline.NAME``)
MASTER = "msprof"
#: new pids are ``PID_BASE + group * PID_BLOCK + n``: a block of pids per rank (a file has at
#: most 100), above every tid (jobprof.plugin.timeline's track rule)
PID_BLOCK = 1000
#: a ``ts`` above this (µs, ~3 years) is epoch µs: a file rendered before the job's time base
#: existed (jobprof.plugin.clock), whose base is the epoch itself
EPOCH_TS = 1e14
#: point-to-point operations pair up differently on each side: not used to align clocks
_P2P = {"send", "recv", "isend", "irecv"}
ALIGNS = ("clock", "collectives")


def _file_base(ts: float | str, base_ns: int) -> int:
    """The time base of a file whose first ``ts`` is ``ts``: its source's, or the epoch for an
    epoch-µs file (see EPOCH_TS)."""
    return 0 if float(ts) > EPOCH_TS else base_ns


class MergeError(Exception):
    """Nothing to merge (no rank or iteration matches), or unreadable input: the message says which."""


@attrs.frozen
class RankSource:
    """One device folder of the profile: who it is, and its timeline files by iteration."""

    device: int
    rank: int
    #: where ``rank`` came from: ``rank_id`` of info.json, or the device id when it has none
    rank_from: str
    hostname: str
    path: Path
    finished: bool
    #: the time base (epoch ns) of the source's timeline files (jobprof.plugin.clock); 0 when unknown
    time_base_ns: int = 0
    #: why the time base is unknown ("" when known): its job-relative files cannot be placed
    base_unknown: str = ""

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank_from == "rank_id" else f"device {self.device}"


def labels(sources: list[RankSource]) -> str:
    """``rank 3``, ``ranks 0-7``, ``devices 2-9999`` or both kinds: many sources in one phrase."""
    if len(sources) == 1:
        return sources[0].label
    ranks = [s.rank for s in sources if s.rank_from == "rank_id"]
    devices = [s.device for s in sources if s.rank_from != "rank_id"]
    return "; ".join([*([f"ranks {', '.join(ranges(ranks))}"] if ranks else []),
                      *([f"devices {', '.join(ranges(devices))}"] if devices else [])])


def _time_base(path: Path, device: int, info: dict[str, Any]) -> tuple[int | None, str]:
    """The source's time base (epoch ns): info.json's, else its clock anchor's second (a profile
    written before the base was recorded); None and why when neither file gives one."""
    base = (info.get("jobprof") or {}).get("time_base_ns")
    if base is not None:
        return base, ""
    start_path = path / f"start_info.{device}"
    start = rawstore.read_start(start_path)
    if start is None:
        return None, f"{start_path} is missing or unusable and info.json has no time_base_ns"
    return own_base(ClockAnchor.from_info(start)), ""


def read_sources(prof: Path) -> list[RankSource]:
    """Every device folder of ``prof`` with its rank (info.json ``rank_id``, else the device id),
    ordered by rank then device; metadata read through :mod:`jobprof.files.rawstore`'s checks."""
    sources = []
    for path in device_dirs(prof):
        device = device_id(path)
        info = rawstore.read_info(path / f"info.json.{device}") or {}
        rank = info_rank(info)
        base, unknown = _time_base(path, device, info)
        sources.append(RankSource(device, device if rank is None else rank,
                                  "device id" if rank is None else "rank_id",
                                  str(info.get("hostname", "N/A")), path,
                                  rawstore.read_end(path / f"end_info.{device}") is not None,
                                  base or 0, unknown))
    return sorted(sources, key=lambda s: (s.rank, s.device))


def group_of(pid: int) -> int:
    """The source group (rank order in the merge) a merged file's pid belongs to."""
    return (pid - PID_BASE) // PID_BLOCK


class Rewriter:
    """Rewrites the events of one source (a rank, or a device) into the merged file's space.

    Processes are matched by name across that source's files (each per-iteration file numbers
    them by first use, so one name may have different pids in two files) and get pids
    ``PID_BASE + group * PID_BLOCK + n`` (:func:`group_of` reads the group back); flow ids are
    renumbered from a counter shared by every source,
    since each file starts its own at 0; ``ts`` moves, in integer ns, from the source's time
    base (``base_ns``) to the output's (``out_base_ns``), plus the source's clock ``offset_ns``.
    """

    def __init__(self, group: int, flow_ids: Iterator[int], offset_ns: int = 0,
                 rename: Callable[[str], str] | None = None, base_ns: int = 0,
                 out_base_ns: int = 0) -> None:
        self.group = group
        self.offset_ns = offset_ns
        self.base_ns, self.out_base_ns = base_ns, out_base_ns
        self._rename = rename
        self._flow_ids = flow_ids
        self._pids: dict[str, int] = {}

    @property
    def pids(self) -> list[int]:
        return sorted(self._pids.values())

    def _new_pid(self, key: str) -> int:
        pid = self._pids.get(key)
        if pid is None:
            if len(self._pids) >= PID_BLOCK - 1:
                raise MergeError(f"more than {PID_BLOCK - 1} processes in group {self.group}")
            pid = self._pids[key] = PID_BASE + self.group * PID_BLOCK + len(self._pids) + 1
        return pid

    def rewrite(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``events`` (one file's) rewritten in place; returns the same list."""
        names = {e["pid"]: str(e.get("args", {}).get("name")) for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        pids = {old: self._new_pid(f"name:{name}") for old, name in names.items()}
        flows: dict[tuple[Any, Any], int] = {}
        first = next((e["ts"] for e in events if e.get("ph") != "M" and "ts" in e), 0)
        shift = _file_base(first, self.base_ns) - self.out_base_ns + self.offset_ns
        for e in events:
            old = e.get("pid")
            if old is not None:
                pid = pids.get(old)
                if pid is None:  # a process without a name: matched by its pid alone
                    pid = pids[old] = self._new_pid(f"pid:{old}")
                e["pid"] = pid
            if e.get("ph") == "M":
                self._metadata(e)
                continue
            if shift and "ts" in e:
                e["ts"] = (ts_ns(e["ts"]) + shift) / 1000
            if "id" in e and e.get("ph") in ("s", "t", "f"):
                key = (e.get("cat"), e["id"])
                new = flows.get(key)
                if new is None:
                    new = flows[key] = next(self._flow_ids)
                e["id"] = new
        return events

    def _metadata(self, e: dict[str, Any]) -> None:
        args = e.get("args")
        if not isinstance(args, dict):
            return
        if e["name"] == "process_name" and self._rename is not None:
            e["args"] = {**args, "name": self._rename(str(args.get("name")))}
        elif e["name"] == "process_sort_index" and isinstance(args.get("sort_index"), int):
            # rank 0's processes first, then rank 1's, each rank in its own order
            e["args"] = {**args, "sort_index": self.group * PID_BLOCK + args["sort_index"]}


class TraceWriter(StreamedFile):
    """A Chrome-trace file written as a stream, renamed into place by :meth:`close`.

    ``wrapped``: the JSON object form (``{"traceEvents": [...], "displayTimeUnit": "ms",
    "metadata": {...}}``) that viewers read with its metadata; else a bare JSON array, the form
    of msprof's own timeline files.  A ``.gz`` name is gzip-compressed (Perfetto and
    chrome://tracing open it as it is)."""

    def __init__(self, path: Path, wrapped: bool = True, root: Path | None = None,
                 output: bool = False) -> None:
        if str(path) != STDOUT and root is None:
            make_dirs(path.parent)
        super().__init__(path, root=root, output=output)  # output: a -o target (fsio.check_output)
        self.wrapped = wrapped
        self.events = 0
        self.handle.write('{"traceEvents":[\n' if wrapped else "[\n")

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        """Append events (one file's at a time: dumped as one string, then freed by the caller)."""
        if not events:
            return
        text = json.dumps(events, separators=(",", ":"), ensure_ascii=False)[1:-1]
        self.handle.write((",\n" if self.events else "") + text)
        self.events += len(events)

    def close(self, metadata: dict[str, Any] | None = None) -> Path:
        tail = "\n]"
        if self.wrapped:
            meta = json.dumps(metadata or {}, ensure_ascii=False)
            tail += ',"displayTimeUnit":"ms","metadata":' + meta + "}"
        self.handle.write(tail + "\n")
        return self.finish()


def _number(value: Any) -> bool:
    """A ``ts`` / ``dur`` as timelines hold it: a finite number, or msprof's decimal string."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _event_ok(e: Any) -> bool:
    return isinstance(e, dict) and all(_number(e[k]) for k in ("ts", "dur") if k in e) \
        and isinstance(e.get("args", {}), dict) and isinstance(e.get("ph", ""), str) \
        and isinstance(e.get("name", ""), str) \
        and isinstance(e.get("pid", 0), (int, str)) and not isinstance(e.get("pid"), bool) \
        and (e.get("ph") != "M" or ("pid" in e and "name" in e))


def load_events(path: Path) -> list[dict[str, Any]]:
    """One timeline file's events (a JSON array, or an object with ``traceEvents``); events not
    shaped as a Chrome-trace event (not an object, a ``ts`` that is not a number, ...) are left
    out and reported once for the file (jobprof.files.rawstore.problem).  MergeError: no events at all."""
    try:
        data = jsonread.loads(fsio.read_bytes(path))
    except (ValueError, RecursionError) as exc:
        raise MergeError(f"{path}: not valid JSON ({str(exc)[:80]}); re-render it with `jobprof export`") \
            from None
    if isinstance(data, dict):
        data = data.get("traceEvents")
    if not isinstance(data, list):
        raise MergeError(f"{path}: not a Chrome-trace event array")
    good = [e for e in data if _event_ok(e)]
    if len(good) != len(data):
        rawstore.problem(f"{path}: {len(data) - len(good)} of {len(data)} event(s) are not Chrome-trace "
                         "events (an object with numeric ts/dur, object args): left out")
    return good


# --- clock alignment -------------------------------------------------------------------------

@attrs.frozen
class Alignment:
    """Per-source offsets (integer ns, added to every ts) and how they were found."""

    clock: str
    offsets: dict[int, int]
    #: per device: collectives matched with the reference rank, and the spread of the estimate
    detail: dict[int, dict[str, Any]] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()


def collective_ends(device_dir: Path, base_ns: int = 0) -> dict[tuple[str, int, str], int]:
    """``{(group, seq, op): end, epoch ns}`` of every collective in a device's hccl timelines
    (``base_ns``: their time base)."""
    ends: dict[tuple[str, int, str], int] = {}
    for file in iteration_files(device_dir, "timeline", "hccl"):
        try:
            events = load_events(file.path)
        except MergeError:
            continue  # named when the file is merged
        for e in events:
            args = e.get("args") or {}
            if e.get("ph") != "X" or e.get("name") in _P2P or not isinstance(args.get("seq"), int) \
                    or "ts" not in e or "dur" not in e:
                continue
            end = ts_ns(e["ts"]) + ts_ns(e["dur"]) + _file_base(e["ts"], base_ns)
            ends[(str(args.get("group")), args["seq"], str(e["name"]))] = end
    return ends


def align(sources: Sequence[RankSource], how: str) -> Alignment:
    """Offsets per device: zero with ``clock``; with ``collectives``, minus the median of how much
    later each collective ends on that rank than on the lowest rank (a collective completes on
    every rank at nearly the same instant, whatever each host's clock says)."""
    zero = {s.device: 0 for s in sources}
    hosts = sorted({s.hostname for s in sources})
    if how == "clock":
        notes = () if len(hosts) <= 1 else (
            f"ranks ran on {len(hosts)} hosts ({', '.join(hosts)}): their clocks agree only as well as NTP "
            "keeps them; `--align collectives` estimates the offsets from the collectives",)
        return Alignment("clock", zero, {}, notes)
    if len(sources) < 2:
        return Alignment("clock", zero, {}, ("--align collectives needs two ranks or more: used the clock",))
    ref, *others = sources
    ref_ends = collective_ends(ref.path, ref.time_base_ns)
    if not ref_ends:
        return Alignment("clock", zero, {}, (
            f"--align collectives: {ref.label} has no hccl timeline (profile with \"hccl\": \"on\", then "
            "`jobprof export`): aligned by the clock instead",))
    offsets = {ref.device: 0}
    detail: dict[int, dict[str, Any]] = {ref.device: {"matched": len(ref_ends), "reference": True}}
    for source in others:
        ends = collective_ends(source.path, source.time_base_ns)
        diffs = [ends[k] - ref_ends[k] for k in ends.keys() & ref_ends.keys()]
        if not diffs:
            return Alignment("clock", zero, {}, (
                f"--align collectives: {source.label} shares no collective (group, seq) with {ref.label} "
                "(no hccl timeline, or different groups): aligned by the clock instead",))
        median = round(statistics.median(diffs))
        spread = statistics.median(abs(d - median) for d in diffs)
        offsets[source.device] = -median
        detail[source.device] = {"matched": len(diffs), "median_abs_deviation_us": round(spread / 1000, 3)}
    return Alignment("collectives", offsets, detail, ())


# --- merge -----------------------------------------------------------------------------------

#: output formats: Chrome-trace JSON, or a native Perfetto trace (jobprof.files.pftrace)
FORMATS = ("auto", "json", "perfetto")
#: ``auto`` writes JSON up to this many events: past it Perfetto's JSON importer (which holds the
#: whole document) and chrome://tracing slow down badly (bench/perfetto_formats.py)
JSON_EVENTS_MAX = 1_000_000
_PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace", ".pb", ".proto")


def default_name(fmt: str) -> str:
    return "merged.pftrace" if fmt == "perfetto" else "merged.json"


def named_format(out: Path | None) -> str | None:
    """The format an output name asks for (``x.json``, ``x.pftrace``, either ``.gz``), if any."""
    if out is None:
        return None
    suffixes = [x.lower() for x in out.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    if suffixes[-1:] == [".json"]:
        return "json"
    if suffixes and suffixes[-1] in _PERFETTO_SUFFIXES:
        return "perfetto"
    return None


def count_events(paths: Iterable[Path]) -> int:
    """Events in the input files, counted without parsing (one ``"ph"`` key per event)."""
    return sum(fsio.read_bytes(path).count(b'"ph"') for path in paths)


def choose_format(fmt: str, out: Path | None, paths: Sequence[Path]) -> tuple[str, str]:
    """(json or perfetto, why) for ``--format fmt`` and ``-o out``."""
    from jobprof.files import pftrace

    if fmt != "auto":
        return fmt, f"--format {fmt}"
    named = named_format(out)
    if named is not None:
        return named, f"the output name {out.name if out else ''} asks for it"
    events = count_events(paths)
    if events <= JSON_EVENTS_MAX:
        return "json", f"{events:,} events, at most the {JSON_EVENTS_MAX:,} a JSON trace opens well with"
    if not pftrace.available():
        return "json", (f"{events:,} events, past the {JSON_EVENTS_MAX:,} a JSON trace opens well with, but "
                        "the native Perfetto format needs pip install 'jobprof[perfetto]'")
    return "perfetto", (f"{events:,} events, past the {JSON_EVENTS_MAX:,} that Perfetto's JSON importer and "
                        "chrome://tracing handle well")


@attrs.frozen
class MergeResult:
    path: Path
    events: dict[int, int]
    files: int
    alignment: Alignment
    notes: tuple[str, ...]
    #: the metadata written per rank (device, host, offset, iterations, events, pids)
    ranks: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: json or perfetto, and why that one
    format: str = "json"
    format_reason: str = ""


def select(sources: Sequence[RankSource], ranks: Sequence[int] | None) -> list[RankSource]:
    if not ranks:
        return list(sources)
    chosen = [s for s in sources if s.rank in set(ranks)]
    if not chosen:
        have = ", ".join(f"{s.rank} ({s.path.name})" for s in sources) or "none"
        raise MergeError(f"no rank {', '.join(map(str, ranks))} in this profile (ranks: {have})")
    return chosen


def merge(prof: Path, out: Path | None, *, how: str = "clock", ranks: Sequence[int] | None = None,
          iterations: tuple[int, int] | None = None,
          progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
          fmt: str = "json", folder: Path | None = None) -> MergeResult:
    """Write every selected rank's master timelines of the selected iterations to ``out``
    (None: ``merged.json`` or ``merged.pftrace`` in ``folder``, by default ``prof``), as ``fmt``
    (:data:`FORMATS`)."""
    sources = select(read_sources(prof), ranks)
    if not sources:
        raise MergeError(f"{prof} has no device_<id> folders")
    notes: list[str] = []
    plan: list[tuple[RankSource, list[IterationFile]]] = []
    absent: list[RankSource] = []
    for source in sources:
        files = iteration_files(source.path, "timeline", MASTER)
        if iterations:
            files = [f for f in files if iterations[0] <= f.iteration <= iterations[1]]
        rendered = {f.iteration for f in files}
        stored = rawstore.indices(source.path)
        if iterations:
            stored = {i for i in stored if iterations[0] <= i <= iterations[1]}
        if missing := stored - rendered:
            notes.append(f"{source.label}: iterations {', '.join(ranges(missing))} have raw data but no "
                         f"timeline file: run `jobprof export {prof}`")
        if files and source.base_unknown:
            notes.append(f"{source.label}: {source.base_unknown}: its timelines cannot be placed on the "
                         "job's time axis: left out")
            files = []
        elif not files:
            absent.append(source)
        elif not source.finished:
            notes.append(f"{source.label}: no end_info (the process did not finish): merged iterations "
                         f"{', '.join(ranges(rendered))}")
        plan.append((source, files))
    if absent:  # one line, however many folders (10,000 empty ones: one line)
        where = f" in iterations {window(iterations)}" if iterations else ""
        notes.append(f"{labels(absent)}: no master timeline (msprof_*.json){where}: left out")
    if not any(files for _, files in plan):
        where = f" in iterations {window(iterations)}" if iterations else ""
        raise MergeError(f"nothing to merge in {prof}: no master timeline file{where} for "
                         f"{', '.join(s.label for s in sources)}")
    alignment = align([s for s, files in plan if files], how)
    notes.extend(alignment.notes)
    # one axis for all: the earliest base of the merged ranks (they share one in a job)
    out_base = min((s.time_base_ns for s, files in plan if files), default=0)
    flow_ids = iter(range(1, 1 << 62))
    counts: dict[int, int] = {}
    meta: dict[str, Any] = {}
    todo = [(g, source, f.path) for g, (source, files) in enumerate(plan) for f in files]
    fmt, why = choose_format(fmt, out, [path for _, _, path in todo])
    out = out or (folder or prof) / default_name(fmt)
    walk: Iterable[Any] = progress(todo, len(todo)) if progress else todo
    writer: TraceWriter | Any
    if fmt == "perfetto":
        from jobprof.files import pftrace

        try:
            writer = pftrace.PerfettoWriter(out, out_base)
        except pftrace.PerfettoUnavailable as exc:
            raise MergeError(str(exc)) from exc
    else:
        writer = TraceWriter(out, output=True)
    unreadable = 0
    with writer:
        rewriters: dict[int, Rewriter] = {}
        for group, source, path in walk:
            rewriter = rewriters.get(group)
            if rewriter is None:
                label = f"Rank {source.rank}" if source.rank_from == "rank_id" else f"Device {source.device}"

                def rename(name: str, label: str = label) -> str:
                    return f"{label} · {name}"

                rewriter = rewriters[group] = Rewriter(group, flow_ids,
                                                       alignment.offsets.get(source.device, 0),
                                                       rename, source.time_base_ns, out_base)
            try:
                events = rewriter.rewrite(load_events(path))
            except MergeError as exc:  # one unreadable file: the others still merge
                notes.append(f"{exc}: left out")
                unreadable += 1
                continue
            writer.write(events)
            counts[source.device] = counts.get(source.device, 0) + len(events)
            del events
        if unreadable == len(todo):  # the temporary file is removed: no empty trace left behind
            raise MergeError("nothing to merge: every timeline file is unreadable:\n  " + "\n  ".join(notes))
        for group, (source, files) in enumerate(plan):
            if not files:
                continue
            its = {f.iteration for f in files}
            meta[str(source.rank)] = {
                "device": source.device, "rank_from": source.rank_from, "hostname": source.hostname,
                "offset_us": alignment.offsets.get(source.device, 0) / 1000, "finished": source.finished,
                "time_base_ns": source.time_base_ns,
                "iterations": ", ".join(ranges(its)), "files": len(files),
                "events": counts.get(source.device, 0),
                "pids": rewriters[group].pids, **alignment.detail.get(source.device, {})}
        if fmt == "perfetto":
            assert isinstance(writer, pftrace.PerfettoWriter)  # made so above
            for phase, n in sorted(writer.unsupported.items()):
                notes.append(f"{n} event(s) of phase {phase!r} have no native Perfetto form: left out")
            if writer.unbound_flows:
                notes.append(f"{writer.unbound_flows} flow event(s) bind to no slice: left out")
        writer.close({"jobprof": {
            "prof_dir": str(prof), "timeline": MASTER, "clock": alignment.clock, "time_base_ns": out_base,
            "clock_note": CLOCK_NOTES[alignment.clock], "ranks": meta, "notes": notes}})
    return MergeResult(out, counts, len(todo), alignment, tuple(notes), meta, fmt, why)


CLOCK_NOTES = {
    "clock": "ts = us since time_base_ns (epoch ns), from each process's clock anchor (start_info: wall "
             "clock and monotonic clock read at one instant); processes on one host share the wall clock, "
             "so one axis; offset_us = 0",
    "collectives": "ts = us since time_base_ns (epoch ns), from each process's clock anchor plus offset_us: "
                   "minus the median, over the collectives (same group and seq) both ran, of how much "
                   "later the collective ended on that rank than on the lowest rank; args keep each rank's "
                   "own clock",
}
