"""A native Perfetto trace (protobuf ``TrackEvent`` packets) from Chrome-trace events, as a stream.

``jobprof merge --format perfetto`` writes this instead of JSON for big merges: Perfetto's JSON
importer holds the whole document in memory and is slow past about a million events, while a
protobuf trace is parsed packet by packet (bench/perfetto_formats.py measures both).

The events are the merge's own (already rewritten: one time axis, the track rule of
``jobprof.plugin.timeline``, flow ids unique in the file), one input file at a time:

* every process (``process_name``) is a process track, every (pid, tid) a thread track under
  it, with the JSON's names; the descriptors' pid and tid are int32, so they are renumbered
  (threads 1, 2, ... in order of first use, processes from ``PROTO_PID_BASE`` up: the
  track rule of ``jobprof.plugin.timeline``, no tid equal to a pid, in int32);
* an ``X`` event is a ``SLICE_BEGIN`` / ``SLICE_END`` pair in integer ns (``ts`` is exact to the
  ns on the job-relative axis), emitted per track in nesting order (ends before begins at the
  same instant, outer begins first), so the reader's slice stacks come out as the JSON's;
* ``i``/``I`` are instants, ``C`` counters (one counter track per process, name and series);
* a flow's ``s`` / ``t`` / ``f`` event becomes a flow id on the slice it binds to (the deepest
  slice enclosing its ``ts`` on its track, the rule of ``bp: "e"``): ``flow_ids`` where it
  starts or continues, ``terminating_flow_ids`` where it ends;
* args become debug annotations (numbers, strings, booleans; anything else as JSON text);
* the time base goes into a clock snapshot (``BOOTTIME`` 0 = ``REALTIME`` base), so the viewer
  knows the wall clock of ``ts`` 0.

Written with the ``perfetto`` package's ``StreamingTraceProtoBuilder`` (Google's own protobuf
classes for the trace format; the optional extra ``jobprof[perfetto]``), to a temporary file
renamed into place by :meth:`PerfettoWriter.close`.  A ``.gz`` name is gzip-compressed.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobprof.files.fsio import STDOUT, StreamedFile, make_dirs
from jobprof.plugin.clock import ts_ns

#: the one packet sequence of the file (no interning: each packet is self-contained)
SEQUENCE = 1
#: descriptor pids are PROTO_PID_BASE + n, tids 1 ... below it
PROTO_PID_BASE = 1 << 24
_BOOTTIME, _REALTIME = 6, 1
#: an X event on its track: (start ns, end ns, index in the file's events)
_Span = tuple[int, int, int]


class PerfettoUnavailable(RuntimeError):
    """The ``perfetto`` package is not installed."""


def _protos() -> Any:
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
    except ImportError as exc:
        raise PerfettoUnavailable(
            "the native Perfetto format needs the perfetto package: pip install 'jobprof[perfetto]'") from exc
    return perfetto_trace_pb2, StreamingTraceProtoBuilder


def available() -> bool:
    try:
        _protos()
    except PerfettoUnavailable:
        return False
    return True


class PerfettoWriter:
    """The interface of ``merge.TraceWriter`` (write per input file, close, abort), in protobuf."""

    def __init__(self, path: Path, base_ns: int = 0) -> None:
        self._pb, builder = _protos()
        self.path = path
        self.events = 0
        #: events of a phase this writer cannot express (counted, named in the merge's notes)
        self.unsupported: dict[str, int] = {}
        #: flow events with no slice to bind to at their ts on their track
        self.unbound_flows = 0
        if str(path) != STDOUT:
            make_dirs(path.parent)
        self._file = StreamedFile(path, binary=True, output=True)  # merge's -o (fsio.check_output)
        self._out = builder(self._file.handle)
        self._processes: dict[int, tuple[int, int]] = {}  # pid -> (track uuid, descriptor pid)
        self._threads: dict[tuple[int, int], int] = {}  # (pid, tid) -> track uuid
        self._counters: dict[tuple[int, str], int] = {}
        self._names: dict[int, str] = {}
        self._thread_names: dict[tuple[int, int], str] = {}
        self._uuids = iter(range(1, 1 << 62))
        first = self._out.create_packet()
        first.trusted_packet_sequence_id = SEQUENCE
        first.sequence_flags = self._pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        first.first_packet_on_sequence = True
        snap = first.clock_snapshot
        for clock, value in ((_BOOTTIME, 0), (_REALTIME, base_ns)):
            c = snap.clocks.add()
            c.clock_id, c.timestamp = clock, value
        first.timestamp = 0
        self._out.write_packet(first)

    # -- tracks -------------------------------------------------------------------------------
    def _packet(self) -> Any:
        packet = self._out.create_packet()
        packet.trusted_packet_sequence_id = SEQUENCE
        return packet

    def _track(self, parent: int | None = None) -> tuple[int, Any, Any]:
        """A new track's (uuid, packet, descriptor), the descriptor filled by the caller."""
        uuid = next(self._uuids)
        packet = self._packet()
        desc = packet.track_descriptor
        desc.uuid = uuid
        if parent is not None:
            desc.parent_uuid = parent
        return uuid, packet, desc

    def _process(self, pid: int) -> tuple[int, int]:
        """(track uuid, descriptor pid) of the file's process ``pid``."""
        known = self._processes.get(pid)
        if known is None:
            uuid, packet, desc = self._track()
            known = self._processes[pid] = (uuid, PROTO_PID_BASE + len(self._processes) + 1)
            desc.process.pid = known[1]
            if pid in self._names:
                desc.process.process_name = self._names[pid]
            self._out.write_packet(packet)
        return known

    def _thread(self, pid: int, tid: int) -> int:
        key = (pid, tid)
        uuid = self._threads.get(key)
        if uuid is None:
            parent, proto_pid = self._process(pid)
            uuid, packet, desc = self._track(parent)
            self._threads[key] = uuid
            desc.thread.pid, desc.thread.tid = proto_pid, len(self._threads)
            if key in self._thread_names:
                desc.thread.thread_name = self._thread_names[key]
            self._out.write_packet(packet)
        return uuid

    def _counter(self, pid: int, name: str) -> int:
        key = (pid, name)
        uuid = self._counters.get(key)
        if uuid is None:
            uuid, packet, desc = self._track(self._process(pid)[0])
            self._counters[key] = uuid
            desc.name = name
            desc.counter.SetInParent()
            self._out.write_packet(packet)
        return uuid

    def _metadata(self, e: dict[str, Any]) -> None:
        args = e.get("args") or {}
        pid, tid = e.get("pid"), e.get("tid")
        if e.get("name") == "process_name" and isinstance(pid, int):
            self._names[pid] = str(args.get("name"))
        elif e.get("name") == "thread_name" and isinstance(pid, int) and isinstance(tid, int):
            self._thread_names[(pid, tid)] = str(args.get("name"))

    # -- events -------------------------------------------------------------------------------
    def _annotate(self, event: Any, args: Any) -> None:
        if not isinstance(args, dict):
            return
        for key, value in args.items():
            a = event.debug_annotations.add()
            a.name = str(key)
            if isinstance(value, bool):
                a.bool_value = value
            elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
                a.int_value = value
            elif isinstance(value, float):
                a.double_value = value
            elif isinstance(value, str):
                a.string_value = value
            else:
                a.string_value = json.dumps(value, ensure_ascii=False)

    def write(self, events: Sequence[dict[str, Any]]) -> None:
        """Append one input file's events (metadata first: names belong to the descriptors)."""
        for e in events:
            if e.get("ph") == "M":
                self._metadata(e)
        # per track: X spans (start, end, index), sorted; flows bound to them by index
        spans: dict[tuple[int, int], list[_Span]] = {}
        flows_out: dict[int, list[int]] = {}
        flows_end: dict[int, list[int]] = {}
        others: list[dict[str, Any]] = []
        for index, e in enumerate(events):
            ph = e.get("ph")
            if ph == "X":
                start = ts_ns(e["ts"])
                end = start + ts_ns(e.get("dur", 0))
                spans.setdefault((e["pid"], e["tid"]), []).append((start, end, index))
            elif ph != "M":
                others.append(e)
        starts: dict[tuple[int, int], list[int]] = {}
        for key, track in spans.items():
            track.sort(key=lambda s: (s[0], -s[1], s[2]))
            starts[key] = [s[0] for s in track]
        for e in others:
            ph = e.get("ph")
            if ph in ("s", "t", "f"):
                target = self._enclosing(spans, starts, (e.get("pid"), e.get("tid")), ts_ns(e["ts"]))
                if target is None or not isinstance(e.get("id"), int):
                    self.unbound_flows += 1
                    continue
                (flows_end if ph == "f" else flows_out).setdefault(target, []).append(e["id"])
        for key, track in spans.items():
            self._emit_track(key, track, events, flows_out, flows_end)
        for e in others:
            ph = e.get("ph")
            if ph in ("s", "t", "f"):
                continue
            if ph in ("i", "I"):
                self._instant(e)
            elif ph == "C":
                self._counter_values(e)
            else:
                self.unsupported[str(ph)] = self.unsupported.get(str(ph), 0) + 1
        self.events += len(events)

    @staticmethod
    def _enclosing(spans: dict[tuple[int, int], list[_Span]], starts: dict[tuple[int, int], list[int]],
                   key: tuple[Any, Any], ts: int) -> int | None:
        """The index of the deepest X event of track ``key`` with start <= ts <= end."""
        track = spans.get(key)
        if not track:
            return None
        i = bisect.bisect_right(starts[key], ts)
        best = None
        # the latest-starting span that still covers ts is the deepest (spans nest on a track)
        for _start, end, index in reversed(track[:i]):
            if end >= ts:
                best = index
                break
        return best

    def _emit_track(self, key: tuple[int, int], track: list[_Span], events: Sequence[dict[str, Any]],
                    flows_out: dict[int, list[int]], flows_end: dict[int, list[int]]) -> None:
        uuid = self._thread(*key)
        te = self._pb.TrackEvent
        # nesting order: at one instant, ends (inner first) before begins (outer first); a
        # zero-length slice ends right after it begins
        marks: list[tuple[Any, ...]] = []
        for n, (start, end, index) in enumerate(track):
            marks.append((start, 1, -end, n, 0, index))
            if end == start:
                marks.append((start, 1, -end, n, 1, index))
            else:
                marks.append((end, 0, -start, -n, 1, index))
        marks.sort()
        for ts, _, _, _, is_end, index in marks:
            packet = self._packet()
            packet.timestamp = ts
            event = packet.track_event
            event.track_uuid = uuid
            if is_end:
                event.type = te.TYPE_SLICE_END
            else:
                e = events[index]
                event.type = te.TYPE_SLICE_BEGIN
                event.name = str(e.get("name", ""))
                if e.get("cat"):
                    event.categories.append(str(e["cat"]))
                self._annotate(event, e.get("args"))
                if index in flows_out:
                    event.flow_ids.extend(flows_out[index])
                if index in flows_end:
                    event.terminating_flow_ids.extend(flows_end[index])
            self._out.write_packet(packet)

    def _instant(self, e: dict[str, Any]) -> None:
        packet = self._packet()
        packet.timestamp = ts_ns(e["ts"])
        event = packet.track_event
        event.track_uuid = self._thread(e["pid"], e["tid"])
        event.type = self._pb.TrackEvent.TYPE_INSTANT
        event.name = str(e.get("name", ""))
        if e.get("cat"):
            event.categories.append(str(e["cat"]))
        self._annotate(event, e.get("args"))
        self._out.write_packet(packet)

    def _counter_values(self, e: dict[str, Any]) -> None:
        for series, value in (e.get("args") or {}).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            name = str(e.get("name", "")) if series in ("value", "") else f"{e.get('name', '')} {series}"
            packet = self._packet()
            packet.timestamp = ts_ns(e["ts"])
            event = packet.track_event
            event.track_uuid = self._counter(e["pid"], name)
            event.type = self._pb.TrackEvent.TYPE_COUNTER
            event.double_counter_value = float(value)
            self._out.write_packet(packet)

    # -- the file -----------------------------------------------------------------------------
    def close(self, metadata: dict[str, Any] | None = None) -> Path:
        """Finish the file (``metadata`` has no place in a protobuf trace: merge prints it and
        the JSON format keeps it)."""
        return self._file.finish()

    def abort(self) -> None:
        self._file.abort()

    def __enter__(self) -> PerfettoWriter:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is not None:
            self.abort()
