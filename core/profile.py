"""Read-only view of a PROF_ directory for ``jobprof summary`` and report plugins."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobprof import rawstore
from jobprof.export import device_dirs
from jobprof.profdir import PROF_RE
from jobprof.types import Iteration


def find_prof_dir(path: Path) -> Path:
    """``path`` itself if it is a PROF_ folder, else the newest PROF_ folder inside it."""
    if PROF_RE.match(path.name):
        return path
    found = sorted((p for p in path.iterdir() if PROF_RE.match(p.name)), key=lambda p: p.name[12:29])
    if not found:
        raise FileNotFoundError(f"no PROF_* directory in {path}")
    return found[-1]


class Profile:
    def __init__(self, path: Path) -> None:
        self.path = find_prof_dir(Path(path))
        self._devices = {int(d.name.split("_")[1]): d for d in device_dirs(self.path)}

    @property
    def devices(self) -> list[int]:
        return sorted(self._devices)

    def info(self, device: int) -> dict[str, Any]:
        try:
            return json.loads((self._devices[device] / f"info.json.{device}").read_text())
        except (OSError, ValueError):
            return {}

    def finished(self, device: int) -> bool:
        return (self._devices[device] / f"end_info.{device}").exists()

    def iterations(self, device: int) -> list[Iteration]:
        return [Iteration.from_record(r) for r in self.records(rawstore.ITERATION_STREAM, device)]

    def streams(self, device: int) -> Iterator[tuple[int, dict[str, list[Any]]]]:
        """Each iteration's raw streams as stored, ``(index, {stream: records})``: for streams
        whose records are lists (``ops``) or when an iteration's streams are read together."""
        yield from rawstore.read(self._devices[device])

    def records(self, stream: str, device: int | None = None) -> Iterator[dict[str, Any]]:
        """Every raw record of ``stream``, tagged with ``_device`` and ``_iteration``."""
        for dev in [device] if device is not None else self.devices:
            for index, streams in rawstore.read(self._devices[dev]):
                for record in streams.get(stream, ()):
                    yield {**record, "_device": dev, "_iteration": index}
