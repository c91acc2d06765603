"""Atomic file writes: a reader never sees half a file (temp file in the same folder + rename)."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> int:
    """Write ``data`` to ``path`` atomically; return the number of bytes written."""
    # a lone surrogate (a name from a broken decode) becomes its \\u escape, valid in JSON
    blob = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(blob)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return len(blob)


def write_with_done(path: Path, data: str) -> int:
    """Write a metadata file and its msprof ``.done`` companion (``filesize:<bytes>``)."""
    size = atomic_write(path, data)
    atomic_write(path.with_name(path.name + ".done"), f"filesize:{size}\n")
    return size
