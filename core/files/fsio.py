"""Every file jobprof writes goes through here: atomic, never through a planted link, narrow modes.

*Atomic*: a file is written into a temporary file beside it and renamed into place
(:class:`StreamedFile`, :func:`atomic_write`), so a reader never sees half of it.

*Never through a link*: profiles are read and re-exported by people other than their writer,
often as root, so nothing found inside a profile is trusted.  Temporary files are created with
``O_CREAT|O_EXCL|O_NOFOLLOW`` (a name already taken, a planted symbolic link included, is never
opened: another unique name is picked), inside a folder opened as a directory file descriptor
and renamed through that same descriptor; with ``root`` (the PROF_ folder) ``root`` itself and
every folder between it and the file are opened with ``O_NOFOLLOW``, so a symlinked
``PROF_``/``device_<id>``/``summary``/``timeline``/``data`` folder is refused with
:class:`UnsafePath`, an ``OSError`` whose message names the folder and what it is.  A command's
``-o`` target (:func:`check_output`) is written only if it is absent or a regular file; a
symbolic link, FIFO, device, socket or directory there is refused, and ``-`` is standard output.

*Modes* (the one permission policy): folders are created ``0o750`` and files ``0o640``; the
umask can only narrow these, so with umask 000 nothing is wider than ``rwxr-x---`` /
``rw-r-----`` and with umask 077 it is ``rwx------`` / ``rw-------``.  Existing folders keep
their mode.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

_F = TypeVar("_F", bound="StreamedFile")

#: the mode of every folder jobprof creates (before the umask, which only narrows it)
DIR_MODE = 0o750
#: the mode of every file jobprof creates (before the umask, which only narrows it)
FILE_MODE = 0o640
#: the ``-o`` value that means standard output
STDOUT = "-"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class CannotWrite(OSError):
    """A file jobprof cannot write; ``str()`` and ``strerror`` are one line naming the path."""

    def __init__(self, path: Path | str, message: str, code: int | None = errno.EIO) -> None:
        super().__init__(code or errno.EIO, message, str(path))

    def __str__(self) -> str:
        return str(self.strerror)


class UnsafePath(CannotWrite):
    """A place jobprof refuses to write through (a symbolic link, FIFO, device...)."""

    def __init__(self, path: Path | str, what: str, code: int = errno.EPERM, message: str = "") -> None:
        super().__init__(path, message or f"{path} is {what}: jobprof does not write through it", code)


def describe(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words (for messages)."""
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return "not a regular file"


class NotRegular(OSError):
    """A file of a profile that is not a regular file (a FIFO, a device, a socket): never read,
    since a FIFO with no writer blocks its reader forever.  The message names it."""

    def __init__(self, path: Path | str, what: str) -> None:
        super().__init__(errno.EINVAL, f"{what}, not a regular file", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def open_read(path: Path | str, mode: str = "rb", **kwargs: Any) -> IO[Any]:
    """Open a file of a profile for reading, only if it is a regular file (a symbolic link to
    one included; the link rule is the writers'): the file is opened without blocking, its type
    checked on the open descriptor (no race with a rename), then read as usual.  Anything else
    raises :class:`NotRegular`.  ``mode`` and ``kwargs`` as for :func:`open` (read modes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(st_mode):
            raise NotRegular(path, describe(st_mode))
        os.set_blocking(fd, True)
        return open(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path | str) -> bytes:
    """A profile file's bytes (:func:`open_read`'s rule: regular files only)."""
    with open_read(path) as handle:
        return handle.read()


def read_text(path: Path | str, encoding: str = "utf-8", errors: str = "strict") -> str:
    """A profile file's text (:func:`open_read`'s rule: regular files only)."""
    with open_read(path, "r", encoding=encoding, errors=errors) as handle:
        return handle.read()


def _lmode(name: str | Path, dir_fd: int | None = None) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None


def open_dir(folder: Path, root: Path | None = None, create: bool = False) -> int:
    """A directory file descriptor of ``folder`` (the caller closes it).

    Without ``root`` the path is followed as given (a user's own ``-o`` path may pass through
    links).  With ``root``, ``folder`` must be ``root`` or below it; ``root`` and each folder
    below it are opened with ``O_NOFOLLOW``: a symbolic link or non-folder there raises
    :class:`UnsafePath`.  ``create`` makes missing folders with :data:`DIR_MODE`.
    """
    if root is None:
        if create:
            make_dirs(folder)
        return os.open(folder, _DIR_FLAGS)
    rel = Path(os.path.relpath(folder, root)) if folder != root else Path()
    if any(part == ".." for part in rel.parts):
        raise UnsafePath(folder, f"outside {root}")
    parts = [root.name, *(p for p in rel.parts if p != ".")]
    fd = os.open(root.parent, _DIR_FLAGS)
    here = root.parent
    try:
        for part in parts:
            here = here / part
            try:
                child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass  # made by another process meanwhile: opened (and checked) below
                child = _open_child(part, fd, here)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise UnsafePath(here, describe(_lmode(part, fd) or 0)) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child(part: str, fd: int, here: Path) -> int:
    try:
        return os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise UnsafePath(here, describe(_lmode(part, fd) or 0)) from None


def make_dirs(folder: Path, root: Path | None = None) -> Path:
    """Create ``folder`` and its missing parents, each with :data:`DIR_MODE` (``os.makedirs``
    gives parents the default 0o777); with ``root``, through no symbolic link below it."""
    if root is not None:
        os.close(open_dir(folder, root, create=True))
        return folder
    missing = []
    probe = Path(folder)
    # one lstat per level: a folder another process makes meanwhile (the ranks of a job make
    # the output folder at the same moment) then shows up as FileExistsError below, never as
    # "exists but is no folder" between two separate looks
    while (mode := _lmode(probe)) is None or not (stat.S_ISDIR(mode) or probe.is_dir()):
        if mode is not None:  # a file, a FIFO, a link to no folder: not ours to replace
            raise UnsafePath(probe, describe(mode), errno.ENOTDIR)
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            if not path.is_dir():
                raise
    return folder


def make_unique_dir(parent: Path, prefix: str, root: Path | None = None) -> Path:
    """A new empty folder ``parent/<prefix><random>`` (never an existing name or link)."""
    fd = open_dir(parent, root)
    try:
        while True:
            name = f"{prefix}{os.getpid()}.{os.urandom(4).hex()}"
            try:
                os.mkdir(name, DIR_MODE, dir_fd=fd)
                return parent / name
            except FileExistsError:
                continue
    finally:
        os.close(fd)


def create(path: Path, root: Path | None = None, binary: bool = False) -> IO[Any]:
    """A new file at ``path`` (``O_EXCL|O_NOFOLLOW``, :data:`FILE_MODE`), open for writing;
    an existing name, a link included, raises ``FileExistsError``."""
    fd = open_dir(path.parent, root)
    try:
        new = os.open(path.name, _NEW_FLAGS, FILE_MODE, dir_fd=fd)
    finally:
        os.close(fd)
    if binary:
        return os.fdopen(new, "wb")
    return os.fdopen(new, "w", newline="", encoding="utf-8", errors="backslashreplace")


def new_empty_file(folder: Path, name: Callable[[], str], root: Path | None = None, tries: int = 100) -> Path:
    """A new empty file in ``folder`` (made if missing, through no link below ``root``), named
    ``name()`` until a name is free (``O_EXCL|O_NOFOLLOW``, :data:`FILE_MODE`): one walk of the
    path and no file object, for a file made at every iteration end on the training thread."""
    fd = open_dir(folder, root, create=True)
    try:
        for _ in range(tries):
            path = folder / name()
            try:
                os.close(os.open(path.name, _NEW_FLAGS, FILE_MODE, dir_fd=fd))
            except FileExistsError:
                continue
            return path
    finally:
        os.close(fd)
    raise FileExistsError(f"no free name in {folder}")


def open_append(path: Path, root: Path | None = None) -> int:
    """A descriptor appending to the regular file ``path`` (created :data:`FILE_MODE` if absent);
    a link, FIFO or device there raises :class:`UnsafePath`."""
    fd = open_dir(path.parent, root)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            out = os.open(path.name, flags, FILE_MODE, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise UnsafePath(path, describe(_lmode(path.name, fd) or 0)) from None
            raise
    finally:
        os.close(fd)
    mode = os.fstat(out).st_mode
    if not stat.S_ISREG(mode):
        os.close(out)
        raise UnsafePath(path, describe(mode))
    return out


def check_output(path: Path | str, what: str = "-o", parents: bool = False) -> Path:
    """Check a command's output target before the work: ``-`` (standard output), an absent
    name or a regular file pass; anything else raises :class:`UnsafePath` naming the path, and
    so does a missing folder unless ``parents`` (the command will make it)."""
    path = Path(path)
    if str(path) == STDOUT:
        return path
    mode = _lmode(path)
    if mode is not None and not stat.S_ISREG(mode):
        raise UnsafePath(path, describe(mode), errno.EEXIST)
    if mode is None and not parents and not path.parent.is_dir():
        raise UnsafePath(path.parent, "missing", errno.ENOENT,
                         f"{path.parent} does not exist (the folder for {what} {path})")
    return path


def atomic_write(path: Path, data: str | bytes, root: Path | None = None) -> int:
    """Write ``data`` to ``path`` atomically; return the number of bytes written."""
    # a lone surrogate (a name from a broken decode) becomes its \\u escape, valid in JSON
    blob = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    with StreamedFile(path, binary=True, compress=False, root=root) as out:
        out.handle.write(blob)
        out.finish()
    return len(blob)


def write_with_done(path: Path, data: str, root: Path | None = None) -> int:
    """Write a device folder's metadata file and its msprof ``.done`` companion
    (``filesize:<bytes>``); ``root`` defaults to the PROF_ folder (``path``'s grandparent)."""
    root = path.parent.parent if root is None else root
    size = atomic_write(path, data, root)
    atomic_write(path.with_name(path.name + ".done"), f"filesize:{size}\n", root)
    return size


class StreamedFile:
    """A file written as a stream into ``.<name>.<pid>.tmp`` beside ``path`` (another unique
    name if that one is taken) and renamed into place by :meth:`finish` (a reader never sees
    half of it); an error inside ``with`` removes the temporary file.  ``compress`` (default: a
    ``.gz`` name) gzip-compresses it.  ``self.handle`` is text (UTF-8, a lone surrogate as its
    ``\\u`` escape) or, with ``binary``, bytes.  The folder must exist; ``root``: see
    :func:`open_dir`.  ``level``: the gzip level (raw data that is read back soon: 1, as a live
    job's windows).  ``output``: a command's ``-o`` (:func:`check_output`, checked again just
    before the rename; ``-`` writes to standard output).  ``atomic_write`` is its one-shot form."""

    def __init__(self, path: Path, binary: bool = False, compress: bool | None = None,
                 root: Path | None = None, output: bool = False, level: int = 6) -> None:
        import gzip

        self.path = path
        self._output = output
        self._dir: int | None = None
        self._tmp: str | None = None
        packed = path.suffix == ".gz" if compress is None else compress
        if output and str(path) == STDOUT:
            raw: IO[bytes] = io.BufferedWriter(_Unclosed(sys.stdout.buffer))
            sys.stdout.flush()
        else:
            if output:
                check_output(path)
            try:
                self._dir = open_dir(path.parent, root)
            except CannotWrite:
                raise
            except OSError as exc:
                raise CannotWrite(path, f"cannot write {path}: {exc.strerror or exc}", exc.errno) from None
            try:
                raw = os.fdopen(self._new_temp(), "wb")
            except CannotWrite:
                self._release()
                raise
            except OSError as exc:
                self._release()
                raise CannotWrite(path, f"cannot write {path}: {exc.strerror or exc}", exc.errno) from None
        self._raw = raw
        stream: IO[bytes] | gzip.GzipFile = \
            gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=raw) if packed else raw
        self._packed = stream if packed else None
        # closed by finish() or abort()
        self.handle: Any = stream if binary else io.TextIOWrapper(
            stream, encoding="utf-8", errors="backslashreplace", write_through=False)

    def _new_temp(self) -> int:
        base = f".{self.path.name}.{os.getpid()}"
        for attempt in range(64):
            name = f"{base}.tmp" if attempt == 0 else f"{base}.{os.urandom(4).hex()}.tmp"
            try:
                fd = os.open(name, _NEW_FLAGS, FILE_MODE, dir_fd=self._dir)
            except FileExistsError:
                continue  # a leftover, or something planted: never opened
            self._tmp = name
            return fd
        raise CannotWrite(self.path, f"cannot write {self.path}: no free temporary name beside it",
                          errno.EEXIST)

    def _close(self) -> None:
        self.handle.close()
        if self._packed is not None:
            self._packed.close()
        self._raw.close()

    def finish(self) -> Path:
        self._close()
        if self._dir is None:
            return self.path
        try:
            if self._output:
                mode = _lmode(self.path.name, self._dir)
                if mode is not None and not stat.S_ISREG(mode):  # appeared while we wrote
                    raise UnsafePath(self.path, describe(mode), errno.EEXIST)
            assert self._tmp is not None  # __init__ set it with _dir
            os.replace(self._tmp, self.path.name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except CannotWrite:
            self._unlink()
            raise
        except OSError as exc:
            self._unlink()
            raise CannotWrite(self.path, f"cannot write {self.path}: {exc.strerror or exc}",
                              exc.errno) from None
        except BaseException:
            self._unlink()
            raise
        finally:
            self._release()
        return self.path

    def abort(self) -> None:
        try:
            self._close()
        except OSError:
            pass
        self._unlink()
        self._release()

    def _unlink(self) -> None:
        if self._dir is not None and self._tmp is not None:
            try:
                os.unlink(self._tmp, dir_fd=self._dir)
            except OSError:
                pass
            self._tmp = None

    def _release(self) -> None:
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def __enter__(self: _F) -> _F:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is not None:
            self.abort()


class _Unclosed(io.RawIOBase):
    """Standard output as a stream whose close only flushes (the process keeps it)."""

    def __init__(self, target: IO[bytes]) -> None:
        super().__init__()
        self._target = target

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._target.write(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._target.flush()
        super().close()
