"""Read-only view of a PROF_ directory for ``jobprof summary`` / ``report`` and report plugins.

A :class:`Profile` shows only what its :class:`~jobprof.analysis.selection.Selection` keeps (ranks,
iterations), so every plugin's report section follows ``--rank`` and ``--iterations`` without
knowing about them.  Reading raw data costs a JSON parse of every iteration line, so the first
full pass over a device keeps the small streams in memory (``iteration``, ``training_trace``,
``dp``, ``hccl``, ...): each plugin's section then reads them without another pass.  A stream
that grows past :data:`LIGHT_RECORDS` on a device (task_trace's ``ops``) is dropped from that
cache, which keeps memory bounded on long runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import Any, TextIO, TypeVar, cast

from jobprof.analysis.selection import ALL, Selection
from jobprof.files import fsio, rawstore
from jobprof.files.profdir import PROF_RE, device_dirs, device_id, info_rank, iteration_files
from jobprof.plugin.records import SharedRecord
from jobprof.plugin.timeline import NAME as MASTER
from jobprof.plugin.values import Iteration
from jobprof.plugin.views import DigestOf

_R = TypeVar("_R", bound=SharedRecord)

#: records of one stream on one device above which it is re-read instead of kept
LIGHT_RECORDS = 50_000


def find_prof_dir(path: Path) -> Path:
    """``path`` itself if it is a PROF_ folder, else the newest PROF_ folder inside it."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such directory")
    if not path.is_dir():
        raise NotADirectoryError(f"{path}: not a directory (give a PROF_* folder or one holding it)")
    if PROF_RE.match(path.name):
        return path
    found = sorted((p for p in path.iterdir() if PROF_RE.match(p.name) and p.is_dir()),
                   key=lambda p: p.name[12:29])
    if not found:
        raise FileNotFoundError(f"no PROF_* directory in {path}")
    return found[-1]


#: facts of a device gathered by :mod:`jobprof.analysis.facts`: ``{"plugins": {name: value}, ...}``
Facts = dict[str, Any]


class Profile:
    def __init__(self, path: Path, selection: Selection = ALL, device: int | None = None) -> None:
        """``device``: hold that one device alone (a worker reducing it), whatever its rank;
        the other folders are listed but none of their files is opened."""
        self.path = find_prof_dir(Path(path))
        self.selection = selection
        self._info: dict[int, dict[str, Any]] = {}
        self._finished: dict[int, bool] = {}
        #: every device folder, listed when first asked (a worker holding one device of
        #: thousands never lists them: that made reducing N devices O(N^2))
        self._every: dict[int, Path] | None = None
        if device is not None:
            folder = self.path / f"device_{device}"
            if not folder.is_dir():
                raise FileNotFoundError(f"{self.path}: no device_{device} folder")
            self._devices = {device: folder}
        else:
            self._devices = {dev: d for dev, d in self._folders.items()
                             if selection.has_rank(self._rank(dev, d))}
        self._facts: dict[int, Facts] = {}
        #: by device, iteration: the plugins' jobprof_iteration_facts digests an exporter kept
        #: (JSON text, by plugin)
        self._digests: dict[int, dict[int, dict[str, str]]] = {}
        # device -> stream -> tagged records; devices whose light streams are all cached
        self._cache: dict[int, dict[str, list[Any]]] = {}
        self._heavy: dict[int, set[str]] = {}
        self._complete: set[int] = set()

    # -- devices and ranks ----------------------------------------------------------------
    @property
    def devices(self) -> list[int]:
        """The selected devices (one per rank), in id order."""
        return sorted(self._devices)

    @property
    def _folders(self) -> dict[int, Path]:
        if self._every is None:
            self._every = {device_id(d): d for d in device_dirs(self.path)}
        return self._every

    @property
    def all_devices(self) -> list[int]:
        """Every device folder, selected or not."""
        return sorted(self._folders)

    def _rank(self, device: int, folder: Path) -> int:
        rank = info_rank(self._read_info(device, folder))
        return device if rank is None else rank

    def rank(self, device: int) -> int:
        """The job rank that wrote ``device`` (``rank_id`` in info.json; the device id without one)."""
        folder = self._devices.get(device) or self._folders[device]
        return self._rank(device, folder)

    def _read_info(self, device: int, folder: Path) -> dict[str, Any]:
        if device not in self._info:  # a missing or unusable info.json (reported) reads as empty
            self._info[device] = rawstore.read_info(folder / f"info.json.{device}") or {}
        return self._info[device]

    def info(self, device: int) -> dict[str, Any]:
        return self._read_info(device, self._devices[device])

    def options(self, device: int) -> dict[str, Any]:
        """The options the device's job ran with (info.json's ``jobprof.options``, the
        validated effective set; ``{}`` when it records none)."""
        options = (self.info(device).get("jobprof") or {}).get("options")
        return options if isinstance(options, dict) else {}

    def is_on(self, device: int, key: str) -> bool:
        """Whether option ``key`` was on for the device: set, and not ``"off"``.

        ``profile.is_on(0, "kineto_trace")``"""
        return self.options(device).get(key) not in (None, "", "off")

    def task_trace_every(self, device: int) -> int:
        """The device's ``task_trace_every`` (1: every iteration's operators were captured)."""
        every = self.options(device).get("task_trace_every", 1)
        return every if isinstance(every, int) and not isinstance(every, bool) and every >= 1 else 1

    def finished(self, device: int) -> bool:
        if device not in self._finished:
            end = rawstore.read_end(self._devices[device] / f"end_info.{device}")
            self._finished[device] = end is not None
        return self._finished[device]

    def folder(self, device: int) -> Path:
        return self._devices[device]

    # -- gathered facts (jobprof_rank_facts) -------------------------------------------------
    def attach_facts(self, device: int, facts: Facts) -> None:
        """Hand the profile a device's gathered facts: :meth:`facts` and :meth:`iterations`
        answer from them, with no raw read."""
        self._facts[device] = facts

    def facts(self, plugin: str, device: int, compute: Callable[[Profile, int], Any]) -> Any:
        """What ``plugin``'s ``jobprof_rank_facts`` answered for ``device``: the gathered answer
        (a facts file, a worker's) when the command gathered facts, else ``compute(self,
        device)`` here (a Profile made by hand, a plugin loaded after the facts were written)."""
        gathered = self._facts.get(device)
        if gathered is not None and plugin in gathered.get("asked", ()):
            return gathered["plugins"].get(plugin)
        return compute(self, device)

    def keep_digests(self, device: int, digests: dict[int, dict[str, str]]) -> None:
        """Hand the profile the digests an exporter kept as it rendered (``{iteration:
        {plugin: digest as JSON text}}``): :meth:`iteration_facts` answers from them."""
        self._digests[device] = digests

    def iteration_facts(self, plugin: str, device: int, compute: DigestOf) -> Iterator[tuple[int, Any]]:
        """``(iteration, digest)`` of each selected iteration of ``device`` where ``plugin``'s
        ``jobprof_iteration_facts`` answered: the kept digest (its operator windows are not
        read), else ``compute(iteration, streams)`` on the raw data; JSON-plain either way."""
        kept = self._digests.get(device, {})
        have = {index for index, digests in kept.items() if plugin in digests}
        for index, streams in self.streams(device, skip_ops=have):
            if index in have:
                value = json.loads(kept[index][plugin])
            else:
                records = streams.get(rawstore.ITERATION_STREAM) or []
                if not records:
                    continue
                value = compute(Iteration.from_record(records[0]), streams)
                if value is not None:
                    value = json.loads(json.dumps(value, allow_nan=False))
            if value is not None:
                yield index, value

    # -- raw data -------------------------------------------------------------------------
    def iterations(self, device: int) -> list[Iteration]:
        gathered = self._facts.get(device)
        records = gathered["iterations"] if gathered is not None else \
            self.records(rawstore.ITERATION_STREAM, device)
        return [Iteration.from_record(r) for r in records]

    def iteration_count(self, device: int) -> int:
        """How many selected iterations :meth:`streams` will give for ``device`` (for a progress
        bar's total): each raw line's index read without decoding the line."""
        indices = rawstore.indices(self._devices[device])
        return sum(1 for index in indices if self.selection.has_iteration(index))

    def streams(self, device: int,
                skip_ops: Container[int] = ()) -> Iterator[tuple[int, dict[str, list[Any]]]]:
        """Each selected iteration's raw streams as stored, ``(index, {stream: records})``: for
        streams whose records are lists (``ops``) or when an iteration's streams are read together.
        A complete pass also fills the cache :meth:`records` reads from.  ``skip_ops``: iterations
        given without their ``ops`` stream (their operator windows are not read)."""
        filling = device not in self._complete
        cache: dict[str, list[Any]] = {}
        heavy: set[str] = {rawstore.OPS_STREAM} if skip_ops else set()  # not cached with gaps
        for index, streams in rawstore.read(self._devices[device], skip_ops):
            if not self.selection.has_iteration(index):
                continue
            if filling:
                for stream, records in streams.items():
                    if stream in heavy:
                        continue
                    kept = cache.setdefault(stream, [])
                    kept.extend({**r, "_device": device, "_iteration": index} if isinstance(r, dict)
                                else r for r in records)
                    if len(kept) > LIGHT_RECORDS:
                        heavy.add(stream)
                        del cache[stream]
            yield index, streams
        if filling:
            self._cache[device], self._heavy[device] = cache, heavy
            self._complete.add(device)

    def records(self, stream: str, device: int | None = None) -> Iterator[dict[str, Any]]:
        """Every selected raw record of ``stream``, tagged with ``_device`` and ``_iteration``."""
        for dev in [device] if device is not None else self.devices:
            if dev in self._complete and stream not in self._heavy[dev]:
                yield from self._cache[dev].get(stream, ())
                continue
            for index, streams in self.streams(dev):
                for record in streams.get(stream, ()):
                    yield {**record, "_device": dev, "_iteration": index} if isinstance(record, dict) \
                        else record

    def typed(self, kind: type[_R], device: int | None = None) -> Iterator[tuple[int, int, _R]]:
        """Every selected record of a declared shared stream (``kind``, e.g.
        :class:`~jobprof.plugin.CollectiveRecord`) that is shaped as ``kind`` declares, as
        ``(device, iteration, record)``; the others (an old or damaged profile) are left out."""
        for raw in self.records(kind.STREAM, device):
            record = kind.from_raw(raw)
            if record is not None:
                yield raw["_device"], raw["_iteration"], record

    # -- rendered files -------------------------------------------------------------------
    def rendered(self, device: int) -> set[int]:
        """The iterations of ``device`` whose master timeline (the last file rendered for an
        iteration) is on disk: from the gathered facts, else from a listing of timeline/."""
        gathered = self._facts.get(device)
        if gathered is not None and isinstance(gathered.get("rendered"), list):
            return {i for first, last in gathered["rendered"] for i in range(first, last + 1)}
        return {f.iteration for f in iteration_files(self._devices[device], "timeline", MASTER)}

    def open_text(self, path: Path) -> TextIO:
        """A file of the profile opened to read as UTF-8 text (``newline=""``); OSError for
        anything but a regular file (:func:`jobprof.files.fsio.open_read`)."""
        return cast(TextIO, fsio.open_read(path, "r", newline="", encoding="utf-8"))

    def problem(self, text: str) -> None:
        """Report one read problem (the command shows it once, after its output)."""
        rawstore.problem(text)

    def summary_files(self, device: int, name: str) -> list[Path]:
        """The selected iterations' ``summary/<name>_<dev>_<model>_<iter>.csv`` files."""
        return self._files(device, "summary", name)

    def timeline_files(self, device: int, name: str) -> list[Path]:
        """The selected iterations' ``timeline/<name>_<dev>_<model>_<iter>.json`` files."""
        return self._files(device, "timeline", name)

    def _files(self, device: int, folder: str, name: str) -> list[Path]:
        return [f.path for f in iteration_files(self._devices[device], folder, name)
                if self.selection.has_iteration(f.iteration)]
