"""The master timeline ``msprof_<dev>_<model>_<iter>.json``: every plugin's tracks in one file.

msprof's master timeline shows every layer of an iteration (host calls, device tasks, step
trace, communication, markers).  No single plugin owns it: the core renders it per iteration
and each plugin adds its processes, threads and events through ``jobprof_timeline``.  The file
is written only when some plugin contributed an event.

Processes are merged by name, so two plugins that both add to ``Ascend Hardware`` (the step
trace thread and, later, device streams) share one pid, as in msprof's own files.  Labels follow
the contract: ``CPU`` for host-side processes, ``NPU <device id>`` for the device's (on a
CPU-only job the device is the host CPU that runs the operators).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

#: the writer name of the master timeline (``msprof_<dev>_<model>_<iter>.json``)
NAME = "msprof"
HOST_LABEL = "CPU"
#: msprof's device-side process; step trace threads live in it
DEVICE_PROCESS = "Ascend Hardware"
#: The track rule of every timeline file jobprof writes (per-iteration files, merge, the CANN 8
#: layout; the Kineto files follow Kineto's own), for readers that key threads by tid: Perfetto
#: reads pid and tid as uint32, puts a tid that equals the pid, and tid 0, on the process's own
#: main-thread track, and drops a tid above 2**32 - 1 onto it too.  So:
#:
#: * pids lie in ``[PID_BASE, 2**32)``: ``PID_BASE + os_pid * PID_SLOTS + n`` in a per-iteration
#:   file (unique per process of a job on a host), ``PID_BASE + group * PID_BLOCK + n`` in a merge;
#: * tids lie in ``[0, PID_BASE)``: OS thread ids (< 2**22) and their lanes (``+ k * 2**22``,
#:   ``jobprof.plugin.lanes``), stream, plane and group numbers, and jobprof's own tracks in a process
#:   that also holds OS-thread tracks from ``SYNTHETIC_TID`` up;
#:
#: so no tid equals a pid, a tid 0 is one track of its own, and every track Perfetto shows is
#: the (pid, tid) the file names.
PID_BASE = 1 << 31
#: per-iteration pids are ``PID_BASE + os_pid * PID_SLOTS + n`` (Linux pids are below 2**22)
PID_SLOTS = 100
#: tids of jobprof's own tracks beside OS-thread tracks (step trace beside the device streams)
SYNTHETIC_TID = 1 << 30
_OS_PIDS = 1 << 22


def dumps(value: Any) -> str:
    """JSON text for a timeline file: characters as UTF-8, not ``\\u`` escapes (Perfetto's JSON
    importer shows an escape literally)."""
    return json.dumps(value, ensure_ascii=False)


@functools.cache
def _orjson() -> Any:
    """orjson, or None where it is not installed (a declared dependency, but jobprof works
    without it); imported on the first render, never in a profiled job that renders nothing."""
    try:
        import orjson
    except ImportError:
        return None
    return orjson


def events_text(events: list[dict[str, Any]]) -> str:
    """The JSON texts of many events, comma-separated: one item for :meth:`Timeline.add_text`.

    orjson encodes a list of event dicts ~4x faster than formatting each event as text in
    Python (0.7 against 2-3.6 us per operator event, building the dicts included), which is
    most of the master timeline's cost.  Its output is compact and its floats are the shortest
    that read back exactly, as ``repr``'s; what it refuses (a lone surrogate in a name, an
    integer beyond 64 bits) is encoded by :func:`dumps`.
    """
    if not events:
        return ""
    fast = _orjson()
    if fast is not None:
        try:
            return str(fast.dumps(events)[1:-1], "utf-8")
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    return dumps(events)[1:-1]


def process_pid(os_pid: int, n: int = 0) -> int:
    """The file pid of the ``n``-th process of the OS process ``os_pid`` (the track rule above)."""
    return PID_BASE + (os_pid % _OS_PIDS) * PID_SLOTS + n


def device_label(device_id: int) -> str:
    return f"NPU {device_id}"


class Timeline:
    """Collects one iteration's master-timeline events from every plugin.

    Plugins call :meth:`process` to get the pid of a named process (created on first use, with
    its ``process_name`` / ``process_labels`` / ``process_sort_index`` metadata), :meth:`thread`
    to name a track, and :meth:`add` for their events (``pid`` set to a pid from
    :meth:`process`).  Events on one (pid, tid) track must nest: put overlapping work on
    separate tids.
    """

    def __init__(self, os_pid: int) -> None:
        self._base = process_pid(os_pid)
        self._processes: dict[str, int] = {}
        self._threads: set[tuple[int, int]] = set()
        self.metadata: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.texts: list[str] = []

    def process(self, name: str, label: str = HOST_LABEL, sort_index: int | None = None) -> int:
        """The pid of process ``name`` in this file (the same name always gives the same pid)."""
        pid = self._processes.get(name)
        if pid is None:
            if len(self._processes) >= PID_SLOTS:
                raise ValueError(f"more than {PID_SLOTS} processes in one timeline")
            pid = self._processes[name] = self._base + len(self._processes)
            index = len(self._processes) if sort_index is None else sort_index
            self.metadata += [
                {"name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}, "ph": "M"},
                {"name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}, "ph": "M"},
                {"name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": index},
                 "ph": "M"},
            ]
        return pid

    def thread(self, pid: int, tid: int, name: str, sort_index: int | None = None) -> None:
        """Name track (pid, tid); naming it again is a no-op."""
        if (pid, tid) in self._threads:
            return
        self._threads.add((pid, tid))
        self.metadata.append({"name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name},
                              "ph": "M"})
        self.metadata.append({"name": "thread_sort_index", "pid": pid, "tid": tid,
                              "args": {"sort_index": tid if sort_index is None else sort_index},
                              "ph": "M"})

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        self.events.extend(events)

    def add_text(self, events: Iterable[str]) -> None:
        """Add events already serialised, one JSON object text each.  For layers with many
        events (operators: ~9 per task): formatting an event directly costs a third of
        building its dict and ``json.dumps``-ing it.  The text must be valid JSON."""
        self.texts.extend(events)

    def render(self) -> str | None:
        """The file's text, or None when no plugin added an event."""
        if not self.events and not self.texts:
            return None
        parts = [dumps(self.metadata + self.events)[1:-1], *self.texts]
        return "[" + ", ".join(p for p in parts if p) + "]"

