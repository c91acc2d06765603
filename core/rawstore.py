"""Raw data: one JSON file per (stream, iteration) under ``device_<id>/data/``.

The core's own stream ``iteration`` holds the :class:`~jobprof.types.Iteration` record; each
plugin's records go to the streams it names.  Files are written atomically, so after a crash
every file present is complete, and ``jobprof export`` can render it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jobprof.fsio import atomic_write

ITERATION_STREAM = "iteration"
_RAW_RE = re.compile(r"^([a-z][a-z0-9_]*)\.(\d{9})\.json$")


def raw_path(device_dir: Path, stream: str, index: int) -> Path:
    return device_dir / "data" / f"{stream}.{index:09d}.json"


def write_iteration(device_dir: Path, index: int, streams: Mapping[str, list[Any]],
                    on_bad_stream: Callable[[str, Exception], None] | None = None,
                    ) -> list[tuple[Path, int, str]]:
    """Write every stream of one iteration; returns (path, bytes, stream) per file.

    A stream whose records are not JSON-serialisable is skipped and handed to
    ``on_bad_stream`` (its plugin's fault, not the other streams'); OSError propagates.
    """
    written = []
    for stream, records in streams.items():
        try:
            text = json.dumps(records, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            if on_bad_stream is None:
                raise
            on_bad_stream(stream, exc)
            continue
        path = raw_path(device_dir, stream, index)
        written.append((path, atomic_write(path, text), stream))
    return written


def iterations(device_dir: Path) -> dict[int, dict[str, Path]]:
    """Index the raw files present: ``{iteration: {stream: path}}`` (complete iterations only)."""
    found: dict[int, dict[str, Path]] = defaultdict(dict)
    data = device_dir / "data"
    if data.is_dir():
        for entry in data.iterdir():
            match = _RAW_RE.match(entry.name)
            if match:
                found[int(match.group(2))][match.group(1)] = entry
    return {i: s for i, s in sorted(found.items()) if ITERATION_STREAM in s}


def load(files: Mapping[str, Path]) -> dict[str, list[Any]]:
    return {stream: json.loads(path.read_text(encoding="utf-8")) for stream, path in files.items()}
