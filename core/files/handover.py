"""The hand-over of rendering from a finished job to its background exporter.

A job that ends with iterations not yet rendered (option ``export`` "background", the
default) starts one detached, low-priority exporter process per device folder
(:mod:`jobprof.cli.exporter`) and leaves ``data/exporter.json`` (its pid, when it started,
which iterations it renders); the exporter removes the file when it is done.  So a reader
tells "still rendering" (the file, its process alive) from "the exporter died" (the file, no
such process: the raw data is there, ``jobprof export`` renders it) from "done" (no file).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import attrs

from jobprof.files import fsio

NAME = "exporter.json"
#: the exporter's CPU niceness (0-19; default 19, the lowest priority: the node's other work
#: comes first).  On a busy machine a nice-19 process gets almost no CPU, so whoever waits for
#: the files there (a test suite on saturated cores) may ask for less.
NICE_ENV = "JOBPROF_EXPORTER_NICE"
DEFAULT_NICE = 19
#: what the exporter's own messages (problems, its end) go to, beside the hand-over
LOG_NAME = "exporter.log"


@attrs.frozen
class Handover:
    pid: int
    #: wall-clock time (``time.time()``) the job started the exporter
    started: float
    #: the iterations handed over, as [first, last] runs
    iterations: tuple[tuple[int, int], ...]
    #: bytes the rendered files may still take (the job's storage budget, what it left)
    room: int | None = None

    @property
    def count(self) -> int:
        return sum(last - first + 1 for first, last in self.iterations)


def nice_level(environ: Any = None) -> int:
    """The niceness the exporter runs at (:data:`NICE_ENV`; a value that is not 0-19: the default)."""
    text = (os.environ if environ is None else environ).get(NICE_ENV, "")
    try:
        level = int(text)
    except ValueError:
        return DEFAULT_NICE
    return level if 0 <= level <= 19 else DEFAULT_NICE


def path(device_dir: Path) -> Path:
    return device_dir / "data" / NAME


def write(device_dir: Path, pid: int, iterations: list[list[int]], room: int | None) -> None:
    body = {"pid": pid, "started": time.time(), "iterations": [list(r) for r in iterations], "room": room}
    fsio.atomic_write(path(device_dir), json.dumps(body), root=device_dir.parent)


def read(device_dir: Path) -> Handover | None:
    """The hand-over left in ``device_dir`` (None: none, or not one jobprof wrote)."""
    try:
        body: Any = json.loads(fsio.read_text(path(device_dir)))
        runs = tuple((int(a), int(b)) for a, b in body["iterations"])
        room = body.get("room")
        return Handover(int(body["pid"]), float(body["started"]), runs,
                        room if isinstance(room, int) and not isinstance(room, bool) else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def alive(pid: int) -> bool:
    """A process ``pid`` exists and is an exporter (a reused pid runs something else)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: exists; its command line may not be readable
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except OSError:
        return True  # no /proc: trust the pid
    if not command:  # a zombie (exited, not yet reaped by its parent): done
        return False
    return b"jobprof.cli.exporter" in command


def running(device_dir: Path) -> Handover | None:
    """The hand-over of an exporter still at work in ``device_dir``, else None."""
    found = read(device_dir)
    return found if found is not None and alive(found.pid) else None


def wait(device_dir: Path, timeout: float | None = None, poll: float = 0.05) -> bool:
    """Wait until no exporter is at work in ``device_dir``; False if ``timeout`` passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while running(device_dir) is not None:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def done(device_dir: Path) -> None:
    path(device_dir).unlink(missing_ok=True)
