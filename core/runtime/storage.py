"""storage_limit: ages a device's raw data and per-iteration files, oldest first.

Follows msprof (docs/msprof.md section 6): when this device's files would exceed the limit minus
20 MB, or the disk has less than 20 MB free, the oldest data is deleted first.  The unit of
ageing is one raw segment (up to 100 iterations) together with the files exported from its
iterations.  Metadata files are never tracked here, so never deleted, and the newest segment
(the newest raw file of every stream) always stays.  jobprof also bounds the file count
(inodes), since it writes files per iteration.  Without storage_limit the budget is a share
of the free disk (docs/storage.md).  Thread-safe: the training thread and the exporter both add.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

MB = 1024 * 1024
RESERVE = 20 * MB
DEFAULT_DISK_SHARE = 0.2
DEFAULT_INODE_SHARE = 0.1
FREE_CHECK_S = 0.5


class StorageBudget:
    """Tracks what this process wrote, per unit, and deletes the oldest units when over budget."""

    def __init__(self, root: Path, limit_bytes: int, max_files: int, block: int = 1,
                 on_ageing: Callable[[str], None] | None = None) -> None:
        self.root = root
        #: told once, when ageing starts (the user must know data is being deleted)
        self.on_ageing = on_ageing
        #: iterations deleted, as merged [first, last] runs (a unit is its first iteration;
        #: it holds every iteration up to the next unit's first)
        self.aged: list[list[int]] = []
        self.limit_bytes = limit_bytes
        self.max_files = max_files
        self.block = block  # small files cost whole filesystem blocks: count what the disk loses
        self._units: OrderedDict[int, dict[Path, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.total_bytes = 0
        self.total_files = 0
        self.aged_units = 0
        self._free_checked, self._free = -FREE_CHECK_S, 0

    @classmethod
    def for_device(cls, root: Path, limit_mb: int | None,
                   on_ageing: Callable[[str], None] | None = None) -> StorageBudget:
        stat = os.statvfs(root)
        free = stat.f_bavail * stat.f_frsize
        limit = limit_mb * MB if limit_mb else max(200 * MB, int(free * DEFAULT_DISK_SHARE))
        inodes = stat.f_favail if stat.f_files else 0
        max_files = max(1000, int(inodes * DEFAULT_INODE_SHARE)) if inodes else 1 << 62
        return cls(root, limit, max_files, max(1, stat.f_bsize), on_ageing)

    def _blocks(self, size: int) -> int:
        return -(-size // self.block) * self.block

    def account(self, unit: int, path: Path, size: int) -> bool:
        """Record that ``path`` (belonging to ``unit``) now has ``size`` bytes.

        Returns False, and records nothing, when the unit was already aged away.
        """
        with self._lock:
            files = self._units.get(unit)
            if files is None:
                if self._units and unit < next(iter(self._units)):
                    return False  # older than everything kept: it was aged
                files = self._units.setdefault(unit, {})
            before = files.get(path)
            if before is None:
                self.total_files += 1
            self.total_bytes += self._blocks(size) - self._blocks(before or 0)
            files[path] = size
            return True

    def alive(self, unit: int) -> bool:
        with self._lock:
            return unit in self._units

    def over(self) -> bool:
        return self.why_over() is not None

    def why_over(self) -> str | None:
        """Which budget is exceeded, in words; None when within all of them."""
        if self.total_bytes > self.limit_bytes - RESERVE:
            return (f"this process's files reached the storage limit ({self.limit_bytes // MB} MB, "
                    f"less {RESERVE // MB} MB kept free)")
        if self.total_files > self.max_files:
            return f"this process wrote more than {self.max_files} files"
        free = self._free_bytes()
        if free < RESERVE:
            return f"the disk has {free // MB} MB free (under {RESERVE // MB} MB)"
        return None

    def _free_bytes(self) -> int:
        """Free disk space, read at most every FREE_CHECK_S (statvfs on every step adds up)."""
        now = time.monotonic()
        if now >= self._free_checked + FREE_CHECK_S:
            self._free_checked, self._free = now, _free_bytes(self.root)
        return self._free

    def enforce(self) -> int:
        """Delete the oldest units until within budget (never the newest); return how many."""
        aged = 0
        with self._lock:
            while len(self._units) > 1 and (why := self.why_over()) is not None:
                unit, files = self._units.popitem(last=False)
                last = next(iter(self._units)) - 1
                if self.aged and self.aged[-1][1] + 1 >= unit:
                    self.aged[-1][1] = max(self.aged[-1][1], last)
                else:
                    self.aged.append([unit, last])
                if not self.aged_units and not aged and self.on_ageing is not None:
                    self._tell(why, unit, last)
                for path, size in files.items():
                    try:
                        path.unlink()
                    except FileNotFoundError:
                        pass
                    self.total_bytes -= self._blocks(size)
                    self.total_files -= 1
                aged += 1
            self.aged_units += aged
        return aged

    def _tell(self, why: str, first: int, last: int) -> None:
        try:
            assert self.on_ageing is not None  # _tell's one caller checked it
            self.on_ageing(f"{why}: deleting the oldest profile data, starting with iterations "
                           f"{first}-{last} in {self.root} (storage_limit ageing; later deletions "
                           "are listed in info.json's jobprof.aged and in `jobprof summary`)")
        except Exception:
            pass  # a message must never stop the ageing that keeps the disk usable


def _free_bytes(path: Path) -> int:
    try:
        stat = os.statvfs(path)
    except OSError:
        return 1 << 62
    return stat.f_bavail * stat.f_frsize
