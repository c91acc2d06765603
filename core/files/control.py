"""The control folder of a job in dynamic mode (``PROFILING_MODE=dynamic``): how ``jobprof
start`` / ``stop`` / ``status`` and the job's ranks talk, through files only (no daemon).

``<output>/PROF_<job>/control/`` (mode 0700, made by the job) holds:

- ``rank_<key>.json``: each process's status, rewritten about once a second at an iteration
  end and at every change (iteration, iteration rate, capture state), and its answer to each
  start request by the request's number: ``seen`` (the highest number it has read),
  ``pending`` / ``capture`` / ``captures`` (accepted), ``refusals`` (``{id, state, why,
  running}``: refused or cancelled); ``jobprof start`` reads its own request's answer there;
- ``start_<N>.json``: capture request ``N`` (1, 2, ...): the **agreed** first iteration
  ``at``, how many iterations, the options, the capture's own ``PROF_`` folder name, and why;
  created once with ``link()`` (exclusive and complete at once), so the first of two writers
  (two ranks whose trigger fired together) wins and the other sees it;
- ``stop_<N>.json``: end capture ``N`` at the agreed iteration ``at``.

Agreement is by iteration number, never by clocks: the writer of a request reads every rank's
status, projects each rank's iteration to now from its rate, and chooses a first iteration
that every rank reaches after it has polled the folder (:func:`agreed_iteration`).  Every rank
reads the same number from the same file.

Trust (as strict as the dp channel, for files): the folder must belong to the job's uid and
be closed to others; a request is read only from a regular file (no link followed) owned by
the job's uid, not writable by group or others, at most :data:`MAX_BYTES`; anything else is
refused, named once, and never acted on.  The commands work from any process of that uid that
sees the folder (another container sharing the volume included).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from jobprof.files import fsio

_T = TypeVar("_T")
FOLDER = "control"
#: how often a rank looks for requests (seconds, at an iteration end)
POLL_S = 0.1
#: how often a rank rewrites its status file (also at every change of capture state)
STATUS_S = 1.0
#: a status older than this (and older than a few of its iterations) is a rank that is gone
STALE_S = 15.0
#: lead time of an agreed iteration: every rank must poll (POLL_S), read and prepare the
#: capture's plugins (tens of ms) before the iteration before it ends
LEAD_S = 0.4
#: iterations added to the lead in any case (ranks of a synchronous job differ by one)
LEAD_ITERATIONS = 3
MAX_BYTES = 64 * 1024
FOLDER_MODE = 0o700
_NAME_RE = re.compile(r"^(start|stop)_(\d{1,9})\.json$")
_RANK_RE = re.compile(r"^rank_([0-9A-Za-z_.-]{1,80})\.json$")


class Untrusted(Exception):
    """A control file or folder that is not the job's own (message: what is wrong)."""


@attrs.frozen
class Request:
    """``start_<id>.json``: capture iterations ``at`` .. ``at + iterations - 1`` into ``prof_dir``."""

    id: int
    at: int
    iterations: int
    #: PROFILING_OPTIONS keys laid over the job's own for this capture
    options: Mapping[str, Any]
    #: the capture's PROF_ folder, a sibling of the job's
    prof_dir: str
    #: ``manual`` (jobprof start) or the trigger that fired: slow_iteration, rank_outlier, memory_growth
    trigger: str
    reason: str
    by: str
    created: float

    @classmethod
    def from_json(cls, data: Any) -> Request:
        request = _built(data, lambda d: cls(
            id=_int(d["id"]), at=_int(d["at"]), iterations=_int(d["iterations"]),
            options=_object(d.get("options") or {}), prof_dir=str(d["prof_dir"]),
            trigger=str(d.get("trigger", "manual")), reason=str(d.get("reason", ""))[:500],
            by=str(d.get("by", ""))[:200], created=float(d.get("created", 0))))
        if request.at < 1 or request.iterations < 1 or request.id < 1:
            raise ValueError("id, at and iterations must be positive")
        return request

    @property
    def last(self) -> int:
        return self.at + self.iterations - 1


@attrs.frozen
class Stop:
    """``stop_<id>.json``: end capture ``id`` after iteration ``at - 1`` (its last is ``at - 1``)."""

    id: int
    at: int
    by: str
    created: float

    @classmethod
    def from_json(cls, data: Any) -> Stop:
        return _built(data, lambda d: cls(id=_int(d["id"]), at=_int(d["at"]), by=str(d.get("by", ""))[:200],
                                          created=float(d.get("created", 0))))


def _built(data: Any, build: Callable[[dict[str, Any]], _T]) -> _T:
    """``build(data)`` for a JSON object; ValueError naming what is missing or malformed."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    try:
        return build(data)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"missing or malformed key {exc}") from None


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"options {value!r}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(repr(value))
    return value


def folder_of(prof_dir: Path) -> Path:
    return prof_dir / FOLDER


def make(prof_dir: Path) -> Path:
    """Create the job's control folder (0700, through no link below the output folder)."""
    folder = folder_of(prof_dir)
    fd = fsio.open_dir(folder, root=prof_dir.parent, create=True)
    try:
        os.fchmod(fd, FOLDER_MODE)  # made 0750 like every folder of ours: closed before use
    finally:
        os.close(fd)
    return folder


def check_folder(folder: Path, uid: int | None = None) -> os.stat_result:
    """The folder's status if it is the job's own: a real folder of ``uid`` closed to others."""
    info = os.lstat(folder)
    _owned(folder, info, stat.S_ISDIR, "a folder", uid, 0o077, "open to other users")
    return info


def _owned(path: Path, info: os.stat_result, kind: Callable[[int], bool], named: str, uid: int | None,
           forbidden: int, says: str) -> None:
    """Untrusted unless ``path`` is of ``kind``, belongs to ``uid`` and has no ``forbidden`` bit."""
    uid = os.geteuid() if uid is None else uid
    if not kind(info.st_mode):
        raise Untrusted(f"{path} is {fsio.describe(info.st_mode)}, not {named}")
    if info.st_uid != uid:
        raise Untrusted(f"{path} belongs to uid {info.st_uid}, not to the job's uid {uid}")
    if info.st_mode & forbidden:
        raise Untrusted(f"{path} is {says} (mode {stat.S_IMODE(info.st_mode):o})")


def read_trusted(path: Path, uid: int | None = None) -> Any:
    """The JSON in ``path`` if it is a regular file of ``uid`` that only its owner may write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise Untrusted(f"{path} is a symbolic link") from None
        raise exc
    with os.fdopen(fd, "rb") as handle:
        _owned(path, os.fstat(fd), stat.S_ISREG, "a regular file", uid, 0o022, "writable by other users")
        blob = handle.read(MAX_BYTES + 1)
    if len(blob) > MAX_BYTES:
        raise Untrusted(f"{path} is larger than {MAX_BYTES} bytes")
    try:
        return json.loads(blob)
    except ValueError as exc:
        raise Untrusted(f"{path} is not valid JSON ({exc})") from None


def publish(folder: Path, name: str, data: Mapping[str, Any], exclusive: bool = False) -> bool:
    """Write ``folder/name`` whole (mode 0600); ``exclusive``: only if no such file exists yet
    (False then).  Written to a temporary name and linked or renamed into place."""
    fd = fsio.open_dir(folder)
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                      dir_fd=fd)
        try:
            os.write(out, json.dumps(dict(data)).encode())
        finally:
            os.close(out)
        if not exclusive:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            return True
        try:
            os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp, dir_fd=fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def entries(folder: Path) -> tuple[dict[int, str], dict[int, str], list[str]]:
    """The folder's start and stop request names by id, and its rank status names."""
    starts: dict[int, str] = {}
    stops: dict[int, str] = {}
    ranks: list[str] = []
    for name in os.listdir(folder):
        found = _NAME_RE.match(name)
        if found:
            (starts if found.group(1) == "start" else stops)[int(found.group(2))] = name
        elif _RANK_RE.match(name):
            ranks.append(name)
    return starts, stops, sorted(ranks)


def request_name(kind: str, number: int) -> str:
    return f"{kind}_{number:06d}.json"


def rank_name(key: str) -> str:
    return f"rank_{re.sub(r'[^0-9A-Za-z_.-]', '_', key)[:80]}.json"


def statuses(folder: Path, uid: int | None = None) -> list[dict[str, Any]]:
    """Every rank status the folder holds (untrusted or unreadable ones left out)."""
    found = []
    for name in entries(folder)[2]:
        try:
            data = read_trusted(folder / name, uid)
        except (OSError, Untrusted):
            continue
        if isinstance(data, dict) and isinstance(data.get("iteration"), int):
            found.append(data)
    return found


def live(status: Mapping[str, Any], now: float | None = None) -> bool:
    """Has this rank written its status recently (allowing for a few of its own iterations)?"""
    now = time.time() if now is None else now
    period = 1 / status["rate"] if status.get("rate") else 0.0
    return now - float(status.get("time", 0)) < max(STALE_S, 3 * period)


def agreed_iteration(states: Iterable[Mapping[str, Any]], now: float | None = None,
                     lead_s: float = LEAD_S) -> int | None:
    """The first iteration every live rank can still start a capture before (None: no live
    rank): the furthest rank's iteration projected to now, plus the iterations of ``lead_s``
    at the fastest rank's rate, plus :data:`LEAD_ITERATIONS`."""
    now = time.time() if now is None else now
    furthest, rate = None, 0.0
    for status in states:
        if not live(status, now):
            continue
        r = float(status.get("rate") or 0.0)
        projected = status["iteration"] + r * max(0.0, now - float(status.get("time", now)))
        furthest = projected if furthest is None else max(furthest, projected)
        rate = max(rate, r)
    if furthest is None:
        return None
    # rounded first: 100 + 50 * 0.2 is 110.00000000000001 in floats, not iteration 111
    return math.ceil(round(furthest, 3)) + math.ceil(round(rate * lead_s, 3)) + LEAD_ITERATIONS


def next_id(folder: Path) -> int:
    starts = entries(folder)[0]
    return max(starts, default=0) + 1
