"""Atomic file writes: a reader never sees half a file (temp file in the same folder + rename)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

_F = TypeVar("_F", bound="StreamedFile")


def atomic_write(path: Path, data: str | bytes) -> int:
    """Write ``data`` to ``path`` atomically; return the number of bytes written."""
    # a lone surrogate (a name from a broken decode) becomes its \\u escape, valid in JSON
    blob = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    with StreamedFile(path, binary=True, compress=False) as out:
        out.handle.write(blob)
        out.finish()
    return len(blob)


def write_with_done(path: Path, data: str) -> int:
    """Write a metadata file and its msprof ``.done`` companion (``filesize:<bytes>``)."""
    size = atomic_write(path, data)
    atomic_write(path.with_name(path.name + ".done"), f"filesize:{size}\n")
    return size


class StreamedFile:
    """A file written as a stream into ``.<name>.<pid>.tmp`` beside ``path`` and renamed into
    place by :meth:`finish` (a reader never sees half of it); an error inside ``with`` removes
    the temporary file.  ``compress`` (default: a ``.gz`` name) gzip-compresses it.
    ``self.handle`` is text (UTF-8, a lone surrogate as its ``\\u`` escape) or, with ``binary``,
    bytes.  The folder must exist.  ``atomic_write`` is its one-shot form."""

    def __init__(self, path: Path, binary: bool = False, compress: bool | None = None) -> None:
        import gzip

        self.path = path
        self._tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        mode = "wb" if binary else "wt"
        text = {} if binary else {"encoding": "utf-8", "errors": "backslashreplace"}
        # closed by finish() or abort()
        packed = path.suffix == ".gz" if compress is None else compress
        self.handle = (gzip.open(self._tmp, mode, compresslevel=6, **text) if packed  # noqa: SIM115
                       else open(self._tmp, mode, **text))  # noqa: SIM115

    def finish(self) -> Path:
        self.handle.close()
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        self.handle.close()
        try:
            self._tmp.unlink()
        except OSError:
            pass

    def __enter__(self: _F) -> _F:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None:
            self.abort()
