"""The host sampler: the job's processes and the host's CPU, memory and network, at up to 50 Hz.

One daemon thread (``jobprof-host``) takes a :class:`Sample` every ``1 / host_sys_usage_freq``
seconds, and the training thread takes one more at each iteration's hand-over when the program
has not run since the iteration's end (stamped as the iteration's last instant, as task_memory's
sampler does), so that the counters of every iteration are exact deltas of cumulative counters.

What one sample reads (only what the options ask for), each a ``pread`` of a file kept open:

* the job's processes (the rank's process and every descendant: DataLoader workers and other
  children): CPU time (the rank's own process: ``clock_gettime(CLOCK_PROCESS_CPUTIME_ID)``, ns;
  a child: ``/proc/<pid>/stat`` utime + stime, clock ticks), ``/proc/<pid>/statm`` (size,
  resident, shared pages) and ``/proc/<pid>/io`` (``rchar``/``wchar``: everything read and
  written through read/write system calls, page cache included; ``read_bytes``/``write_bytes``:
  what went to or came from storage);
* ``/proc/stat`` (every core's tick counters), ``/proc/meminfo``, ``/proc/net/dev``.

The list of descendants comes from psutil (``Process.children(recursive=True)``, a scan of
/proc), refreshed at most once a second by the thread, never per sample.  A process that exits
between samples is dropped.  psutil's own per-sample reads (``Process.oneshot()`` with
``cpu_times``, ``memory_info``, ``io_counters``) cost 3.4x the kept-open ``pread`` per process
(36 against 10.5 us, measured; figures in docs/plugins/host_sys.md), which would put the thread
near 1% of a core at 50 Hz with two DataLoader workers: so the hot path reads the files itself.

The sampler's own CPU (its thread's ``time.thread_time_ns()`` and the hand-over samples' on the
training thread) is kept in every sample (``own_ns``) so that the rank's CPU is shown without it,
and jobprof's share as jobprof's.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from jobprof.plugin import Iteration

#: the descendants are listed again after this long (a scan of /proc)
REFRESH_NS = 1_000_000_000
#: samples kept waiting for their iteration (10 minutes at 50 Hz: older ones are dropped)
KEEP = 30_000
#: the fields of /proc/meminfo a sample keeps (kB; HugePages_* in pages)
MEMINFO = (
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "Shmem",
    "CommitLimit",
    "Committed_AS",
    "HugePages_Total",
    "HugePages_Free",
)
_MEMINFO_RE = re.compile(rb"^(" + "|".join(MEMINFO).encode() + rb"):\s+(\d+)", re.M)
#: the name torch gives a DataLoader worker process (torch >= 2.3: ``_set_thread_name``)
WORKER_COMM = "pt_data_worker"
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class CoreTicks(NamedTuple):
    """One ``cpu`` line of /proc/stat (USER_HZ ticks; guest time is inside user)."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int


class ProcSample(NamedTuple):
    """One process in one sample (-1: not read, or not readable)."""

    pid: int
    name: str
    label: str
    cpu_ns: int
    vms: int
    rss: int
    shared: int
    rchar: int
    wchar: int
    read_bytes: int
    write_bytes: int


class Sample(NamedTuple):
    ns: int
    own_ns: int
    procs: tuple[ProcSample, ...]
    cores: tuple[tuple[str, CoreTicks], ...] | None
    mem: dict[str, int] | None
    net: dict[str, tuple[int, int]] | None


def _open(path: str) -> int:
    try:
        return os.open(path, _FLAGS)
    except OSError:
        return -1


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


class _Proc:
    """A process of the job, with its /proc files kept open."""

    __slots__ = ("io", "label", "name", "pid", "stat", "statm")

    def __init__(self, pid: int, name: str, cpu: bool, mem: bool, disk: bool, own: bool = False) -> None:
        self.pid, self.name, self.label = pid, name, ""
        base = f"/proc/{pid}"
        self.stat = _open(f"{base}/stat") if cpu and not own else -1
        self.statm = _open(f"{base}/statm") if mem else -1
        self.io = _open(f"{base}/io") if disk else -1

    def close(self) -> None:
        for fd in (self.stat, self.statm, self.io):
            _close(fd)
        self.stat = self.statm = self.io = -1


class HostSampler:
    """Samples what ``what`` names (``cpu``, ``mem``, ``disk``, ``network``, ``cores``,
    ``meminfo``) at ``freq`` Hz and hands each iteration its samples."""

    def __init__(self, psutil: Any, what: frozenset[str], freq: int,
                 exclude: Callable[[], set[int]] | None = None) -> None:
        self._psutil = psutil
        #: jobprof's own children (osrt's perf): not the job's processes
        self._exclude = exclude or set
        self.what = what
        self.freq = freq
        self._cpu, self._mem, self._disk = "cpu" in what, "mem" in what, "disk" in what
        self._pid = os.getpid()
        self._tick_ns = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._me = psutil.Process(self._pid)
        self._self = _Proc(self._pid, self._me.name(), self._cpu, self._mem, self._disk, own=True)
        self._children: dict[int, _Proc] = {}
        self._retired: list[_Proc] = []  # gone, their files closed at the next listing
        self._handover = (0, 0)  # the last hand-over's sample: (stamped at, read at)
        self._full: Sample | None = None  # the thread's last sample with the host's readings
        self._refreshed = 0
        self._stat = _open("/proc/stat") if "cores" in what else -1
        #: a cpu line is at most 8 x 20 digits + its name: the lines of every core and the total
        self._stat_bytes = 200 * ((os.cpu_count() or 1) + 2)
        self._meminfo = _open("/proc/meminfo") if "meminfo" in what else -1
        self._netdev = _open("/proc/net/dev") if "network" in what else -1
        self._samples: deque[Sample] = deque(maxlen=KEEP)
        self._lock = threading.RLock()  # reentrant: a SIGTERM handler may end the session in here
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_ns = 0  # the sampler thread's CPU (its thread_time)
        self._handover_ns = 0  # the hand-over samples' CPU, on the training thread
        self.count = 0  # samples taken (both threads)
        self.sample_wall_ns = 0  # wall time inside sample() (both threads)
        self.started_ns = time.monotonic_ns()
        self.stopped_ns = 0
        self.failed = ""

    # -- the thread ------------------------------------------------------------------------------

    def start(self) -> None:
        self.started_ns = time.monotonic_ns()
        self._thread = threading.Thread(target=self._run, name="jobprof-host", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and os.getpid() == self._pid:
            thread.join(1.0)
        self.stopped_ns = self.stopped_ns or time.monotonic_ns()
        if os.getpid() == self._pid:
            with self._lock:
                for proc in (self._self, *self._children.values(), *self._retired):
                    proc.close()
                self._children.clear()
                for fd in (self._stat, self._meminfo, self._netdev):
                    _close(fd)
                self._stat = self._meminfo = self._netdev = -1

    def _run(self) -> None:
        period = 1.0 / self.freq
        due = time.monotonic() + period
        try:
            # on a fixed schedule (a late sample does not delay the next ones)
            while not self._stop.wait(max(0.0, due - time.monotonic())):
                due = max(due + period, time.monotonic() + period / 2)
                if time.monotonic_ns() - self._refreshed >= REFRESH_NS:
                    self._refresh()
                self.sample()
                self._thread_ns = time.thread_time_ns()
        except Exception as exc:  # a sampler that cannot read stops; the iterations keep what they had
            self.failed = f"{type(exc).__name__}: {exc}"
        self._thread_ns = time.thread_time_ns()

    def _refresh(self) -> None:
        """List the job's descendants again (psutil scans /proc): open the new ones' files, read
        every name again (a forked DataLoader worker renames itself), number the workers."""
        psutil = self._psutil
        found: dict[int, tuple[str, float]] = {}
        try:
            children = self._me.children(recursive=True)
        except psutil.Error:
            return
        own = self._exclude()
        for child in children:  # psutil's reads, outside the lock: a hand-over never waits on them
            if child.pid in own:
                continue
            try:
                found[child.pid] = (child.name(), child.create_time())
            except psutil.Error:
                continue
        opened = {pid: _Proc(pid, name, self._cpu, self._mem, self._disk)
                  for pid, (name, _) in found.items() if pid not in self._children}
        with self._lock:
            self._refreshed = time.monotonic_ns()
            # a sample may still be reading what was retired last time: closed a second later
            for proc in self._retired:
                proc.close()
            self._retired = [self._children.pop(pid) for pid in [p for p in self._children if p not in found]]
            self._children.update(opened)
            workers = []
            for pid, (name, created) in found.items():
                proc = self._children[pid]
                proc.name = name
                if name == WORKER_COMM:
                    workers.append((created, pid))
                else:
                    proc.label = ""
            for n, (_, pid) in enumerate(sorted(workers)):
                self._children[pid].label = f"DataLoader worker {n}"

    # -- one sample ------------------------------------------------------------------------------

    @property
    def handover_ns(self) -> int:
        return self._handover_ns

    def own_ns(self) -> int:
        """jobprof's sampling CPU so far (ns): the thread's and the hand-over samples'."""
        return self._thread_ns + self._handover_ns

    def handover(self, at: int) -> None:
        """On the training thread, at an iteration's hand-over: a sample stamped ``at``; its
        CPU counts as jobprof's."""
        cpu0 = time.thread_time_ns()
        self.sample(at, light=True)
        self._handover_ns += time.thread_time_ns() - cpu0

    def sample(self, at: int | None = None, light: bool = False) -> None:
        """Take one sample now (any thread), stamped now or ``at`` (monotonic ns).  ``light``
        (the hand-over's, on the training thread): the job's processes and the network only;
        the host's cores and memory come from the thread's samples (with them a sample cost
        ~57 us hot and ~300 us cold here, 6 and ~100 us without: 0.8% of a 37 ms step if read at
        every iteration end)."""
        wall0 = time.perf_counter_ns()
        # read outside the lock (the thread's sample and the hand-over's never wait on each
        # other): a child's files are closed only a refresh after it was retired
        with self._lock:
            children = list(self._children.values())
        # stamped as the rank's CPU is read (clock_gettime keeps the GIL): each pread below gives
        # the GIL away and, while the training thread runs Python, waits up to the switch
        # interval (5 ms) to get it back, so the later reads may come ms after the stamp
        now = time.monotonic_ns()
        procs = [self._read(self._self, time.process_time_ns() if self._cpu else -1)]
        for proc in children:
            try:
                procs.append(self._read(proc, -1))
            except OSError:  # it exited (ESRCH): not an error; the next listing retires it
                pass
        cores = self._cores() if self._stat >= 0 and not light else None
        mem = self._read_meminfo() if self._meminfo >= 0 and not light else None
        # network even at the hand-over: a collective's bytes belong to their iteration
        net = self._net() if self._netdev >= 0 else None
        ns = now if at is None else at
        with self._lock:
            samples = self._samples
            if light and self._full is not None:
                # the hand-over reads no host files: the thread's last readings (at most a period
                # old) stand for them, so an iteration's first and last samples both carry some
                cores, mem = self._full.cores, self._full.mem
            sample = Sample(ns, self.own_ns(), tuple(procs), cores, mem, net)
            self.count += 1
            if not light and (cores is not None or mem is not None):
                self._full = sample
            if at is None:
                last_at, last_read = self._handover
                if last_at < now < last_read:
                    # read between an iteration's end and its hand-over (stamped at the end):
                    # the job's counters would go backwards after it; its host readings stay
                    return
            else:
                # the thread's samples read between the iteration's end and this hand-over hold
                # less than it does: the hand-over stands for the end, they are dropped
                while samples and samples[-1].ns > at:
                    samples.pop()
                self._handover = (at, now)
            samples.append(sample)
        self.sample_wall_ns += time.perf_counter_ns() - wall0

    def _read(self, proc: _Proc, cpu_ns: int) -> ProcSample:
        if proc.stat >= 0:
            data = os.pread(proc.stat, 1024, 0)
            fields = data[data.rfind(b")") + 2 :].split()
            cpu_ns = (int(fields[11]) + int(fields[12])) * self._tick_ns
        vms = rss = shared = -1
        if proc.statm >= 0:
            m = os.pread(proc.statm, 256, 0).split()
            vms, rss, shared = int(m[0]), int(m[1]), int(m[2])
        rchar = wchar = read_bytes = write_bytes = -1
        if proc.io >= 0:
            # rchar, wchar, syscr, syscw, read_bytes, write_bytes, cancelled_write_bytes: the
            # kernel's fixed order (proc_pid_io_accounting), each "name: value"
            io = os.pread(proc.io, 512, 0).split()
            rchar, wchar, read_bytes, write_bytes = int(io[1]), int(io[3]), int(io[9]), int(io[11])
        return ProcSample(
            proc.pid, proc.name, proc.label, cpu_ns, vms, rss, shared, rchar, wchar, read_bytes, write_bytes
        )

    def _cores(self) -> tuple[tuple[str, CoreTicks], ...]:
        out = []
        # the cpu lines only (they come first): a buffer the size of the whole file (its
        # interrupt counters run to 100s of KB on big hosts) cost ~100 us a read in malloc's mmap
        for line in os.pread(self._stat, self._stat_bytes, 0).splitlines():
            if not line.startswith(b"cpu"):
                break
            fields = line.split()
            name = fields[0][3:].decode() or "Avg"
            out.append((name, CoreTicks._make(int(v) for v in fields[1:9])))
        return tuple(out)

    def _read_meminfo(self) -> dict[str, int]:
        found = _MEMINFO_RE.findall(os.pread(self._meminfo, 8192, 0))  # ~1.5 KB: 55 lines
        return {key.decode(): int(value) for key, value in found}

    def _net(self) -> dict[str, tuple[int, int]]:
        out = {}
        for line in os.pread(self._netdev, 1 << 16, 0).splitlines()[2:]:
            name, _, rest = line.partition(b":")
            fields = rest.split()
            if len(fields) >= 9:
                out[name.strip().decode()] = (int(fields[0]), int(fields[8]))
        return out

    # -- hand-over -------------------------------------------------------------------------------

    def take(self, iteration: Iteration) -> list[dict[str, Any]]:
        """The samples taken during ``iteration``, oldest first, after the last one before it
        (``"before": true``); older ones are dropped.  The first and last carry each core's
        tick counters by kind (``cpu_detail``), the others each core's busy and total ticks."""
        start, end = iteration.start_ns, iteration.end_ns
        with self._lock:
            samples = self._samples
            while len(samples) > 3 and samples[1].ns < start and samples[3].ns < start:
                samples.popleft()
            kept = sorted((s for s in samples if s.ns < end), key=lambda s: s.ns)
        earlier = [s for s in kept if s.ns < start]
        chosen = earlier[-1:] + [s for s in kept if s.ns >= start]
        with_cores = [i for i, s in enumerate(chosen) if s.cores is not None]
        detail = {with_cores[0], with_cores[-1]} if with_cores else set()
        out = []
        for i, s in enumerate(chosen):
            record: dict[str, Any] = {"ns": s.ns, "own_ns": s.own_ns, "procs": [p._asdict() for p in s.procs]}
            if s.ns < start:
                record["before"] = True
            if s.cores is not None:
                record["cores"] = {
                    name: {"busy": sum(t) - t.idle - t.iowait, "total": sum(t)} for name, t in s.cores
                }
                if i in detail:
                    record["cpu_detail"] = {name: t._asdict() for name, t in s.cores}
            if s.mem is not None:
                record["mem"] = dict(s.mem)
            if s.net is not None:
                record["net"] = {name: {"recv": r, "sent": t} for name, (r, t) in s.net.items()}
            out.append(record)
        return out
