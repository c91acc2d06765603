"""The step tier of task_memory: the process's memory, sampled, with no operator capture.

A daemon thread reads, every :data:`PERIOD_S`, the process's resident set (``/proc/self/statm``,
one ``pread``) and its high-water mark (``getrusage``: the kernel's peak RSS of the process);
once CUDA is initialised by the program, every :data:`CUDA_EVERY`-th sample also reads the
caching allocator's counters of the program's device (``torch.cuda.memory_stats``: allocated,
reserved, and the allocated high-water mark).  A sample is also taken as each iteration is handed
over, on the training thread, stamped as the iteration's last instant when the program has
not run since the end (the optimizer step and ``jobprof.step()`` hand over as they end; else a
hand-over within :data:`END_SLACK_NS`), so that every iteration, however short, has one.
Nothing is reset: the program's own ``max_memory_allocated`` and
peak statistics read as they do unprofiled.

A peak between two samples is known exactly when it set a new high-water mark (the kernel's for
RSS, the allocator's on CUDA): then the iteration's peak is that mark.  Otherwise the peak shown
is the highest sample, and is marked as sampled.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections import deque
from typing import Any

from jobprof.plugin import Iteration

#: seconds between samples (msprof's host memory sampling runs at up to 50 Hz)
PERIOD_S = 0.02
#: read the CUDA allocator's counters every this many samples (``memory_stats`` builds a dict
#: of ~100 entries: ~0.1 ms)
CUDA_EVERY = 5
#: a hand-over this close to the iteration's end samples the iteration's end state
END_SLACK_NS = 1_000_000
#: samples kept waiting for their iteration (10 minutes at 50 Hz: older ones are dropped)
KEEP = 30_000


class MemorySampler:
    """Samples ``(ns, rss, hwm, allocated, reserved, max_allocated)`` (bytes; the last three
    None without CUDA) and hands each iteration the ones taken during it."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._samples: deque[tuple[int, int, int, int | None, int | None, int | None]] = deque(maxlen=KEEP)
        self._lock = threading.RLock()  # reentrant: a SIGTERM handler may end the session in here
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._statm = -1  # no procfs: the high-water mark alone
        #: the program's CUDA device, learnt on the training thread (the sampler's own thread
        #: has CUDA's default device, not the one the program set)
        self.cuda_device: int | None = None
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    @property
    def rss_source(self) -> str:
        return "/proc/self/statm" if self._statm >= 0 else "getrusage (high-water mark only)"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="jobprof-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and os.getpid() == self._pid:
            thread.join(1.0)
        if self._statm >= 0 and os.getpid() == self._pid:
            os.close(self._statm)
            self._statm = -1

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            try:
                self.sample()
            except Exception:
                return  # a sampler that cannot read stops; the iterations keep what they had

    def note_device(self) -> None:
        """On the training thread: learn the program's CUDA device, once CUDA is initialised."""
        cuda = self._torch.cuda
        if self.cuda_device is None and cuda.is_initialized():
            self.cuda_device = cuda.current_device()

    def current(self) -> tuple[int, int]:
        """(RSS, high-water mark) now, bytes; RSS -1 without procfs."""
        rss = -1
        if self._statm >= 0:
            fields = os.pread(self._statm, 128, 0).split()
            rss = int(fields[1]) * self._page
        return rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    def sample(self, cuda: bool | None = None, at: int | None = None) -> None:
        """Take one sample now (any thread), stamped now or ``at`` (monotonic ns)."""
        rss, hwm = self.current()
        allocated = reserved = peak = None
        self._count += 1
        device = self.cuda_device
        if device is not None and (cuda or (cuda is None and self._count % CUDA_EVERY == 0)):
            stats = self._torch.cuda.memory_stats(device)
            allocated = stats.get("allocated_bytes.all.current")
            reserved = stats.get("reserved_bytes.all.current")
            peak = stats.get("allocated_bytes.all.peak")
        with self._lock:
            self._samples.append(
                (time.monotonic_ns() if at is None else at, rss, hwm, allocated, reserved, peak)
            )

    def take(self, iteration: Iteration) -> list[dict[str, Any]]:
        """The samples taken during ``iteration``, oldest first, after the last one before it
        (``"before": true``: the marks the iteration's peak is judged against).  Samples
        older than that are dropped."""
        start, end = iteration.start_ns, iteration.end_ns
        with self._lock:
            samples = self._samples
            while len(samples) > 2 and samples[1][0] < start and samples[2][0] < start:
                samples.popleft()
            kept = sorted(s for s in samples if s[0] < end)
        earlier = [s for s in kept if s[0] < start]
        out = []
        for ns, rss, hwm, allocated, reserved, peak in earlier[-1:] + [s for s in kept if s[0] >= start]:
            record: dict[str, Any] = {"ns": ns, "rss": rss, "hwm": hwm}
            if allocated is not None:
                record.update(
                    allocated=allocated, reserved=reserved, max_allocated=peak, device=self.cuda_device
                )
            if ns < start:
                record["before"] = True
            out.append(record)
        return out
