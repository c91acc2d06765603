"""The background exporter: renders what a finished job left unrendered, then its facts.

Started by the profiled job as it exits (option ``export`` "background", the default:
:mod:`jobprof.runtime.session`) with ``python -m jobprof.cli.exporter DEVICE_DIR``, detached
(a session of its own: the job's Ctrl-C or its process group's SIGTERM do not reach it, and
the job's stdout/stderr pipes are not held open) and at the lowest CPU priority, one per
device folder.  It renders the iterations its hand-over names (``data/exporter.json``,
:mod:`jobprof.files.handover`), within the device's storage budget, records what it did in
info.json (``background_export``; ``unrendered``: what is left) and then writes the facts file
(summary and report read no raw data), and removes the hand-over last.

Killed at any point, nothing is lost: the raw data stays, the summary names the iterations
not rendered, ``jobprof export`` renders them.  Its problems go to ``data/exporter.log``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from jobprof.analysis import facts
from jobprof.analysis.selection import ranges, runs
from jobprof.engine.manager import PluginManager
from jobprof.files import batchgc, export, fsio, handover, profdir, rawstore
from jobprof.plugin.reporter import Reporter

#: free disk the exporter never takes (as the job's storage budget: docs/storage.md)
RESERVE = 20 * 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m jobprof.cli.exporter DEVICE_DIR (started by a profiled job)", file=sys.stderr)
        return 2
    device_dir = Path(args[0])
    if not sys.stdin.isatty():
        sys.stdin.buffer.read()  # the job closes it once the hand-over is written
    try:  # the node's other work (the job's other ranks) comes first (the job set it too)
        os.nice(max(0, handover.nice_level() - os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass
    batchgc.tune()
    log = _Log(device_dir)
    try:
        return _export(device_dir, log)
    except Exception as exc:  # said where the user looks (the log, info.json), never a traceback
        log.write(f"stopped: internal error: {exc!r}; the raw data is kept: run `jobprof export "
                  f"{device_dir.parent}`")
        return 1
    finally:
        handover.done(device_dir)


def _export(device_dir: Path, log: _Log) -> int:
    started = time.monotonic()
    handed = handover.read(device_dir)
    if handed is None:
        log.write(f"no hand-over in {handover.path(device_dir)}: nothing to render")
        return 1
    only = {i for first, last in handed.iterations for i in range(first, last + 1)}
    manager = PluginManager(Reporter())
    manager.load_entry_points()
    kept = facts.PartsKept(manager)
    with rawstore.reporting(log.write):
        result = export.export_device(device_dir, manager, only=only, room=_room(device_dir, handed),
                                      on_streams=kept)
    for problem in result.problems:
        log.write(f"problem: {problem}")
    left = sorted(only - set(result.rendered))
    if result.no_room:
        log.write(f"iteration(s) {', '.join(ranges(result.no_room))} not rendered: the device's "
                  "storage budget (storage_limit, or a share of the free disk) is used up; their "
                  "raw data is kept")
    _record(device_dir, handed, result, left, time.monotonic() - started)
    device = profdir.device_id(device_dir)
    with rawstore.reporting(log.write):
        facts.write(device_dir.parent, manager, devices=[device], known={device: kept.parts})
    rest = f"; not rendered: {', '.join(ranges(left))}" if left else ""
    log.write(f"rendered {len(result.rendered)} of {handed.count} iteration(s) in "
              f"{time.monotonic() - started:.1f} s{rest}")
    return 0 if not result.problems else 1


def _room(device_dir: Path, handed: handover.Handover) -> int | None:
    """Bytes the rendered files may still take: what the job's storage budget left (it knows
    what it wrote), and never the disk's last :data:`RESERVE` (as the job's budget)."""
    try:
        stat = os.statvfs(device_dir)
    except OSError:
        return handed.room
    free = max(0, stat.f_bavail * stat.f_frsize - RESERVE)
    return free if handed.room is None else min(handed.room, free)


def _record(device_dir: Path, handed: handover.Handover, result: export.ExportResult, left: list[int],
            seconds: float) -> None:
    """info.json says what the exporter did (read back by summary's notes and `jobprof export`)."""
    device = profdir.device_id(device_dir)
    target = device_dir / f"info.json.{device}"
    info = rawstore.read_info(target)
    if info is None:
        return
    own = info.setdefault("jobprof", {})
    own["unrendered"] = [list(r) for r in runs(left)]
    own["background_export"] = {
        "pid": handed.pid, "iterations": handed.count, "rendered": len(result.rendered),
        "files": result.files, "seconds": round(seconds, 3), "problems": list(result.problems),
        "nice": os.getpriority(os.PRIO_PROCESS, 0)}
    fsio.write_with_done(target, json.dumps(info))


class _Log:
    """``data/exporter.log``: one line per message, opened for each (the exporter may be
    killed between any two)."""

    def __init__(self, device_dir: Path) -> None:
        self.path = device_dir / "data" / handover.LOG_NAME
        self.root = device_dir.parent

    def write(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} jobprof exporter (pid {os.getpid()}): {text}\n"
        try:
            fd = fsio.open_append(self.path, root=self.root)
            try:
                os.write(fd, line.encode("utf-8", "backslashreplace"))
            finally:
                os.close(fd)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
