"""storage_limit: ages a device's raw data and per-iteration files, oldest iteration first.

Follows msprof (contract section 6): when this device's files would exceed the limit minus
20 MB, or the disk has less than 20 MB free, the oldest iterations' files are deleted first.
Metadata files are never tracked here, so never deleted, and the newest file of each raw
stream is kept.  jobprof also bounds the file count (inodes), since it writes files per
iteration.  Without storage_limit the budget is a share of the free disk (see README).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

MB = 1024 * 1024
RESERVE = 20 * MB
DEFAULT_DISK_SHARE = 0.2
DEFAULT_INODE_SHARE = 0.1


class StorageBudget:
    """Tracks what this process wrote, per iteration, and deletes the oldest when over budget."""

    def __init__(self, root: Path, limit_bytes: int, max_files: int, block: int = 1) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self.max_files = max_files
        self.block = block  # small files cost whole filesystem blocks: count what the disk loses
        self._entries: OrderedDict[int, list[tuple[Path, int, str | None]]] = OrderedDict()
        self._newest: dict[str, int] = {}
        self.total_bytes = 0
        self.total_files = 0
        self.aged_iterations = 0

    @classmethod
    def for_device(cls, root: Path, limit_mb: int | None) -> StorageBudget:
        stat = os.statvfs(root)
        free = stat.f_bavail * stat.f_frsize
        limit = limit_mb * MB if limit_mb else max(200 * MB, int(free * DEFAULT_DISK_SHARE))
        inodes = stat.f_favail if stat.f_files else 0
        max_files = max(1000, int(inodes * DEFAULT_INODE_SHARE)) if inodes else 1 << 62
        return cls(root, limit, max_files, max(1, stat.f_bsize))

    def add(self, index: int, files: list[tuple[Path, int, str | None]]) -> None:
        """Record the files of one iteration (``stream`` is None for exported files)."""
        files = [(path, -(-size // self.block) * self.block, stream) for path, size, stream in files]
        self._entries.setdefault(index, []).extend(files)
        for _, size, stream in files:
            self.total_bytes += size
            self.total_files += 1
            if stream is not None:
                self._newest[stream] = max(index, self._newest.get(stream, index))

    def over(self) -> bool:
        return (
            self.total_bytes > self.limit_bytes - RESERVE
            or self.total_files > self.max_files
            or _free_bytes(self.root) < RESERVE
        )

    def enforce(self) -> int:
        """Delete the oldest iterations until within budget; return how many were aged."""
        aged = 0
        while len(self._entries) > 1 and self.over():
            index, files = self._entries.popitem(last=False)
            for path, size, stream in files:
                if stream is not None and self._newest.get(stream) == index:
                    continue  # the newest file of each stream survives
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                self.total_bytes -= size
                self.total_files -= 1
            aged += 1
        self.aged_iterations += aged
        return aged


def _free_bytes(path: Path) -> int:
    try:
        stat = os.statvfs(path)
    except OSError:
        return 1 << 62
    return stat.f_bavail * stat.f_frsize
