"""host_sys ``osrt``: the system calls of the job's processes and threads, traced with ``perf``.

msprof traces system calls with perf and pthread calls with ltrace; here ``perf record`` records
the kernel's ``raw_syscalls:sys_enter`` / ``sys_exit`` tracepoints of the job's process, and a
thread of the job pairs them into calls.  Interface (what ``host_sys/__init__.py`` calls)::

    reason = OsrtTracer.available()           # None: it can run; else why not and what would
                                              # enable it (say it once, write no osrt file)
    tracer = OsrtTracer()
    tracer.start(os.getpid(), folder)         # jobprof_session_start (raises OsrtError)
    # jobprof_iteration_end: a deferred stream (the sink thread waits up to ~1.5 s for perf's
    # next segment, never the training thread)
    return {OSRT_STREAM: functools.partial(tracer.take_raw, iteration.start_ns, iteration.end_ns)}
    tracer.stop()                             # jobprof_session_end (after the last take)
    tracer.notes                              # caps hit, calls perf lost: for session.set_info

    WriterSpec("os_runtime_statistic", "csv", render_os_runtime_statistic, ...)
    jobprof_timeline: add_to_master(ctx, timeline)   # the "OS Runtime API" layer

How (measured on perf 6.1, kernel 6.18, x86_64):

* ``perf record -k CLOCK_MONOTONIC``: perf stamps every event on ``time.monotonic_ns()``'s clock,
  so no alignment is needed (a ``clock_nanosleep`` enters 5-25 us after the program's own stamp
  before it).  ``perf trace`` (live) has no ``--clockid``: its clock (``local_clock``) was 5 ms
  off CLOCK_MONOTONIC here, and live ``perf trace -p`` followed neither threads created after it
  attached nor forked children.
* ``perf record -p`` inherits: threads and processes the job starts later (DataLoader workers,
  fork or spawn) are traced too; processes started by others are not.
* ``--switch-output=1s`` closes a segment file every second; the tracer converts each with
  ``perf script`` (ns times, pid, tid), deletes it, and pairs enter and exit per thread across
  segments.  Hence :meth:`OsrtTracer.take` waits for the segment that covers the iteration's end.
* syscall numbers are named from the kernel headers (``asm/unistd_64.h``, ``asm-generic/unistd.h``);
  without them a call is ``syscall_<nr>``.
* bounds: at most ``max_calls_per_s`` calls kept per second of the job (default 20 000; the rest
  counted, said once in :attr:`OsrtTracer.notes`), ``segment_bytes_cap`` of unconverted segments.
* pthread calls: not traced.  ltrace is absent, and uprobes on libc's ``pthread_*`` would need
  root, a system-wide probe definition and one trap per call; a contended mutex or condition
  wait shows as the ``futex`` system call it blocks in.

``JOBPROF_OSRT_PERF`` names the perf binary (a missing path makes :meth:`available` give its
reason: the unavailable path is testable).
"""

from __future__ import annotations

import collections
import glob
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from jobprof.plugin import ExportContext, Timeline

#: the raw stream: one ``[name, start_ns, dur_ns, pid, tid]`` array per call (orjson encodes
#: arrays, not NamedTuples)
OSRT_STREAM = "osrt_calls"
#: the environment variable naming the perf binary (default: ``perf`` on PATH)
PERF_ENV = "JOBPROF_OSRT_PERF"
#: the master timeline's layer (msprof's name)
LAYER = "OS Runtime API"
HEADER = ["Device_id", "Process ID", "Thread ID", "Name", "Time(%)", "Time(us)", "Count", "Avg(us)",
          "Max(us)", "Min(us)"]
#: the option read for the timeline's cap (task_trace's key) and this layer's own default
LIMIT_KEY = "timeline_max_events"
DEFAULT_TIMELINE_LIMIT = 200_000
SEGMENT_S = 1
_EVENTS = "raw_syscalls:sys_enter,raw_syscalls:sys_exit"
_SEGMENT_RE = re.compile(r"^perf\.data\.(\d{16})$")
# perf script -F pid,tid,time,event,trace --ns:
#   "  123/  124 19874.058122973: raw_syscalls:sys_enter: NR 121 (f4240, ...)"
#   "  123/  124 19874.058126187:  raw_syscalls:sys_exit: NR 121 = -3"
_LINE_RE = re.compile(rb"^\s*(\d+)/\s*(\d+)\s+(\d+)\.(\d{9}):\s+raw_syscalls:sys_(enter|exit):\s+NR (-?\d+)")
_CAP_SYS_ADMIN, _CAP_PERFMON = 21, 38


class OsrtError(RuntimeError):
    """The tracer could not start (the message says why)."""


class SyscallRecord(NamedTuple):
    """One system call: ``start_ns`` on ``time.monotonic_ns()``'s clock."""

    name: str
    start_ns: int
    dur_ns: int
    pid: int
    tid: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns

    @classmethod
    def from_raw(cls, raw: Any) -> SyscallRecord | None:
        """A record from the stream (an array as JSON gives it back); None if not shaped right."""
        if isinstance(raw, SyscallRecord):
            return raw
        if not isinstance(raw, (list, tuple)) or len(raw) != 5 or not isinstance(raw[0], str):
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in raw[1:]):
            return None
        return cls(*raw)


def records(raw: Iterable[Any]) -> list[SyscallRecord]:
    """The well-shaped records of a stream."""
    return [r for r in map(SyscallRecord.from_raw, raw) if r is not None]


# -- can it run ------------------------------------------------------------------------------

def perf_path() -> str | None:
    given = os.environ.get(PERF_ENV)
    if given:
        return given if os.path.isfile(given) and os.access(given, os.X_OK) else None
    return shutil.which("perf")


def _privileged() -> bool:
    if os.geteuid() == 0:
        return True
    try:
        with open("/proc/self/status") as f:
            caps = next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), 0)
    except OSError:
        return False
    return bool(caps & (1 << _CAP_SYS_ADMIN | 1 << _CAP_PERFMON))


def _tracefs() -> str | None:
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.isdir(os.path.join(root, "events")):
            return root
    return None


_probed: dict[str, str | None] = {}


def available(perf: str | None = None) -> str | None:
    """None when syscall tracing can run here, else the reason and what would enable it."""
    perf = perf or perf_path()
    if perf is None:
        where = os.environ.get(PERF_ENV)
        return (f"perf not found at {PERF_ENV}={where}" if where else "perf not found") + \
            ": install linux-perf (Debian) / linux-tools-$(uname -r) (Ubuntu) / perf (RHEL)"
    if not _privileged():
        try:
            paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
        except (OSError, ValueError):
            paranoid = 2
        if paranoid > -1:
            return (f"perf_event_paranoid is {paranoid} and not root: set kernel.perf_event_paranoid=-1 "
                    "or grant CAP_PERFMON (tracepoint samples need it)")
    root = _tracefs()
    if root is None:
        return "no tracefs: mount -t tracefs nodev /sys/kernel/tracing"
    if not os.access(os.path.join(root, "events", "raw_syscalls"), os.R_OK | os.X_OK):
        return f"{root}/events/raw_syscalls not readable by this user: run as root or chmod tracefs"
    if perf not in _probed:
        _probed[perf] = _probe(perf)
    return _probed[perf]


def _probe(perf: str) -> str | None:
    """Record `true` for real: the checks above cannot see everything (a container's seccomp, an
    old perf without ``-k``)."""
    with tempfile.TemporaryDirectory(prefix="jobprof-osrt-") as tmp:
        try:
            done = subprocess.run([perf, "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", _EVENTS, "-o",
                                   os.path.join(tmp, "probe.data"), "--", "true"],
                                  capture_output=True, timeout=30, cwd=tmp)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"perf record failed: {exc}"
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.decode(errors="replace").splitlines() if ln.strip()]
        return "perf record failed: " + (" ".join(lines[:3]) or f"exit {done.returncode}")
    return None


# -- syscall names ---------------------------------------------------------------------------

def syscall_names() -> dict[int, str]:
    """Syscall number -> name from the kernel headers of this machine's architecture."""
    machine = platform.machine()
    if machine in ("x86_64", "amd64"):
        paths = [*glob.glob("/usr/include/*/asm/unistd_64.h"), "/usr/include/asm/unistd_64.h"]
    else:  # aarch64, riscv64, loongarch64: the generic table
        paths = ["/usr/include/asm-generic/unistd.h"]
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", text)}
        names = {nr: name for name, nr in numbers.items()}
        # asm-generic: "#define __NR_fstatat __NR3264_fstatat"-style aliases name the 64-bit call
        for m in re.finditer(r"#define __NR_(\w+)\s+__NR3264_(\w+)", text):
            if m[2] in numbers and not m[1].endswith("64"):
                names[numbers[m[2]]] = m[1]
        if names:
            return names
    return {}


# -- the tracer ------------------------------------------------------------------------------

class OsrtTracer:
    """``perf record`` of one process tree's system calls, read back as :class:`SyscallRecord`."""

    def __init__(self, perf: str | None = None, max_calls_per_s: int = 20_000,
                 segment_bytes_cap: int = 512 << 20) -> None:
        self.perf = perf or perf_path()
        self.max_calls_per_s = max_calls_per_s
        self.segment_bytes_cap = segment_bytes_cap
        self.notes: list[str] = []
        self.dropped = 0  # calls over the rate cap
        self.lost_segments = 0
        self._names = syscall_names()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._lock = threading.Lock()
        self._ready: list[SyscallRecord] = []  # converted, not yet taken
        self._pending: dict[int, tuple[int, int]] = {}  # tid -> (nr, enter ns)
        self._per_second: collections.Counter[int] = collections.Counter()
        self._covered_ns = 0  # every call that ended before this is converted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cap_said = False
        self._pid = 0
        self._perf_cpu = (0.0, 0.0)  # (monotonic s, perf's CPU s) at the last look
        self._proc_lock = threading.Lock()
        self.reattached = 0
        self.perf_cpu_s = 0.0  # perf record's own CPU (every attach), measured as each ends
        self._attached_tids: set[int] = set()  # the job's threads when perf last attached
        # the tracer's own work (its converting thread, the `perf script` processes it forks,
        # which perf follows as the job's children): the measurement, not the job's; dropped
        self._own_tids: set[int] = set()
        self._own_pids: collections.deque[int] = collections.deque(maxlen=64)

    available = staticmethod(available)

    def start(self, pid: int, folder: str | os.PathLike[str]) -> None:
        """Trace ``pid`` (its threads, and the threads and processes it starts from now on).

        Segments go to a fresh 0700 folder made inside ``folder`` (no planted link can be in it);
        ``folder`` itself must be a real directory, not a link."""
        self._prepare(pid, folder)
        self._launch()
        self._covered_ns = time.monotonic_ns()  # nothing before the start will come
        self._thread = threading.Thread(target=self._convert_loop, name="jobprof-osrt", daemon=True)
        self._thread.start()

    def run(self, pid: int, folder: str | os.PathLike[str]) -> None:
        """:meth:`start`, then convert in the calling thread until :meth:`stop` (no second thread:
        a thread of the job that existed when perf attached and then ends makes perf 6.1 spin,
        see :meth:`_watch`; the plugin's starting thread therefore never ends before the trace)."""
        self._thread = threading.current_thread()
        self._prepare(pid, folder)
        with self._proc_lock:
            if self._stop.is_set():  # the job ended while perf was being found
                return
            self._launch()
        with self._lock:
            self._covered_ns = time.monotonic_ns()
        self._convert_loop()

    def _prepare(self, pid: int, folder: str | os.PathLike[str]) -> None:
        """perf can run, ``folder`` is a real directory: a fresh 0700 folder for perf's output."""
        reason = available(self.perf)
        if reason is not None or self.perf is None:
            raise OsrtError(reason or "perf not found")
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode):
            raise OsrtError(f"{folder} is not a directory (or is a link)")
        self._dir = tempfile.mkdtemp(prefix="osrt-", dir=folder)
        self._pid = pid

    def _launch(self) -> None:
        """Start ``perf record`` on the job's process (its threads now, and those it starts)."""
        assert self.perf is not None and self._dir is not None
        out = os.path.join(self._dir, "perf.data")
        cmd = [self.perf, "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", _EVENTS, "-p", str(self._pid),
               f"--switch-output={SEGMENT_S}s", "--no-buildid", "--no-buildid-cache", "-o", out]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, cwd=self._dir, start_new_session=True)
        deadline = time.monotonic() + 10
        # perf writes the file's header once its events are open; then it synthesizes the
        # process's maps and enables them, well within the grace below
        while not (os.path.exists(out) and os.path.getsize(out) > 0):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._fail("perf record did not start")
            time.sleep(0.01)
        time.sleep(0.1)
        self._perf_cpu = (time.monotonic(), _cpu_s(self._proc.pid))
        self._attached_tids = _tids(self._pid)

    def _watch(self) -> None:
        """perf 6.1's ``record -p`` spins (poll() returning POLLHUP in a loop: a whole core) once a
        thread that existed when it attached ends.  When one has ended (or perf is seen spinning):
        stop it (its last segment is kept) and attach again to the threads alive now; the calls
        of the ~0.3 s that takes are not traced (said once, counted in :attr:`reattached`)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        # a thread perf attached to has ended (a listing of /proc/<pid>/task every 0.1 s: it is
        # about to spin), or, for what that cannot see, perf used over half a core for 0.5 s
        alive = _tids(self._pid)
        if not alive:  # the traced process itself ended: nothing to attach to again
            return
        ended = bool(self._attached_tids - alive)
        then, used = self._perf_cpu
        now, cpu = time.monotonic(), _cpu_s(proc.pid)
        if not ended:
            if now - then < 0.5:
                return
            self._perf_cpu = (now, cpu)
            if cpu - used < 0.5 * (now - then):
                return
        self._say_once("osrt: perf re-attached after a traced thread ended (perf 6.1 spins otherwise); "
                       "system calls during each re-attach (~0.3 s) are not traced")
        self.reattached += 1
        self._end_perf(proc)
        if not self._stop.is_set():
            try:
                self._launch()
            except OsrtError as exc:
                self._say_once(f"osrt: perf could not attach again: {exc}")
                self._proc = None

    def _end_perf(self, proc: subprocess.Popen[bytes]) -> None:
        self.perf_cpu_s += _cpu_s(proc.pid)  # as it ends (a spinning perf shows here)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()

    def _fail(self, what: str) -> None:
        err = b""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            err = self._proc.communicate()[1] or b""
        lines = [ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        raise OsrtError(f"{what}: {' '.join(lines[:3]) or 'no message'}")

    def stop(self) -> None:
        """Stop perf (its last segment is converted) and the converting thread."""
        self._stop.set()
        with self._proc_lock:  # not while the converting thread re-attaches
            proc, self._proc = self._proc, None
        if proc is not None:
            self._end_perf(proc)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
            self._thread = None
        self._convert_ready(final=True)
        with self._lock:
            self._covered_ns = 1 << 62
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- reading --------------------------------------------------------------------------

    def own_pids(self) -> set[int]:
        """The processes the tracer started (perf record, perf script): jobprof's, not the job's."""
        proc = self._proc
        return {*self._own_pids, *([proc.pid] if proc is not None else [])}

    def take(self, start_ns: int, end_ns: int, wait_s: float = 3.0) -> list[SyscallRecord]:
        """The calls that overlap ``[start_ns, end_ns)`` not given before, once perf's segments
        cover ``end_ns`` (waiting up to ``wait_s``).  A call still running when an iteration is
        taken comes with the next iteration it overlaps; calls between iterations are dropped."""
        deadline = time.monotonic() + wait_s
        while self._covered() < end_ns and time.monotonic() < deadline and self._alive():
            time.sleep(0.05)
        with self._lock:
            ready, keep = self._ready, []
            out = []
            for r in ready:
                if r.start_ns >= end_ns:
                    keep.append(r)
                elif r.start_ns + r.dur_ns > start_ns or r.start_ns >= start_ns:
                    out.append(r)
            self._ready = keep
        out.sort(key=lambda r: r.start_ns)
        return out

    def take_raw(self, start_ns: int, end_ns: int) -> list[list[Any]]:
        """:meth:`take` as the stream's JSON arrays (the deferred stream of jobprof_iteration_end)."""
        return [list(r) for r in self.take(start_ns, end_ns)]

    def drain(self) -> list[SyscallRecord]:
        """Every converted call not taken yet (e.g. after :meth:`stop`)."""
        with self._lock:
            out, self._ready = self._ready, []
        return out

    def _covered(self) -> int:
        with self._lock:
            return self._covered_ns

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _convert_loop(self) -> None:
        self._own_tids.add(threading.get_native_id())
        while not self._stop.wait(0.1):
            try:
                with self._proc_lock:
                    if not self._stop.is_set():
                        self._watch()
                self._convert_ready(final=False)
            except Exception as exc:  # never let a bad segment kill the job's thread silently
                self.notes.append(f"osrt: converting stopped: {type(exc).__name__}: {exc}")
                return

    def _segments(self) -> list[tuple[str, str]]:
        if self._dir is None:
            return []
        out = []
        for entry in os.scandir(self._dir):
            m = _SEGMENT_RE.match(entry.name)
            if m and entry.is_file(follow_symlinks=False):
                out.append((m[1], entry.path))
        return sorted(out)

    def _convert_ready(self, final: bool) -> None:
        segments = self._segments()
        total = sum(os.path.getsize(p) for _, p in segments)
        for stamp, path in segments:
            if total > self.segment_bytes_cap and not final:  # conversion fell behind: drop
                total -= os.path.getsize(path)
                os.unlink(path)
                self.lost_segments += 1
                self._say_once(f"osrt: a second of system calls dropped: more than "
                               f"{self.segment_bytes_cap >> 20} MiB of perf data waited to be read")
                continue
            self._convert(path)
            total -= os.path.getsize(path)
            os.unlink(path)
            covered = _stamp_ns(stamp)
            with self._lock:
                self._covered_ns = max(self._covered_ns, covered)

    def _convert(self, path: str) -> None:
        assert self.perf is not None
        proc = subprocess.Popen([self.perf, "script", "-i", path, "-F", "pid,tid,time,event,trace", "--ns"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd=self._dir)
        self._own_pids.append(proc.pid)
        self._own_tids.add(threading.get_native_id())  # stop() converts the last segment itself
        assert proc.stdout is not None
        with proc.stdout:
            got = list(self._pair(proc.stdout))
        proc.wait()
        with self._lock:
            self._ready.extend(got)

    def _pair(self, lines: Iterable[bytes]) -> Iterator[SyscallRecord]:
        pending, names, cap, per_second = self._pending, self._names, self.max_calls_per_s, self._per_second
        match = _LINE_RE.match
        own_tids, own_pids = self._own_tids, set(self._own_pids)
        for line in lines:
            m = match(line)
            if m is None:
                continue
            tid, nr = int(m[2]), int(m[6])
            ns = int(m[3]) * 1_000_000_000 + int(m[4])
            if m[5] == b"enter":
                pending[tid] = (nr, ns)
                continue
            entered = pending.pop(tid, None)
            if entered is None or entered[0] != nr:  # in flight at the start, or a lost event
                continue
            if tid in own_tids or int(m[1]) in own_pids:
                continue
            second = entered[1] // 1_000_000_000
            per_second[second] += 1
            if per_second[second] > cap:
                self.dropped += 1
                self._say_once(f"osrt: capped at {cap} system calls per second (the first ones "
                               "of each second kept)")
                continue
            yield SyscallRecord(names.get(nr) or f"syscall_{nr}", entered[1], ns - entered[1],
                                int(m[1]), tid)
        if len(per_second) > 4:  # only the current seconds can still grow
            for old in sorted(per_second)[:-4]:
                del per_second[old]

    def _say_once(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)


def _tids(pid: int) -> set[int]:
    """The threads of a process now (empty when it is gone)."""
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except (OSError, ValueError):
        return set()


def _cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _stamp_ns(stamp: str) -> int:
    """A segment's name (perf's wall-clock YYYYmmddHHMMSScc at its switch) on the monotonic clock,
    10 ms early so that it never claims more than the segment holds."""
    wall = time.mktime(time.strptime(stamp[:14], "%Y%m%d%H%M%S")) + int(stamp[14:]) / 100
    return int(wall * 1e9) - (time.time_ns() - time.monotonic_ns()) - 10_000_000


# -- writers ---------------------------------------------------------------------------------

def _us(ns: float) -> str:
    return f"{ns / 1000:.3f}"


def statistic_rows(calls: Iterable[SyscallRecord], device: Any = "host") -> list[list[Any]]:
    """One row per (process, thread, name); Time(%) is the name's share of the thread's traced
    call time (a thread's rows add up to 100)."""
    groups: dict[tuple[int, int, str], list[int]] = {}
    for r in calls:
        g = groups.setdefault((r.pid, r.tid, r.name), [0, 0, r.dur_ns, r.dur_ns])
        g[0] += r.dur_ns
        g[1] += 1
        g[2] = max(g[2], r.dur_ns)
        g[3] = min(g[3], r.dur_ns)
    thread_total: collections.Counter[tuple[int, int]] = collections.Counter()
    for (pid, tid, _), g in groups.items():
        thread_total[pid, tid] += g[0]
    rows = []
    for (pid, tid, name), (total, count, most, least) in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[1][0], kv[0][2])):
        whole = thread_total[pid, tid]
        share = f"{100 * total / whole:.2f}" if whole else "0.00"
        rows.append([device, pid, tid, name, share, _us(total), count, _us(total / count), _us(most),
                     _us(least)])
    return rows


def render_os_runtime_statistic(ctx: ExportContext) -> str | None:
    """``os_runtime_statistic``: msprof's columns; nothing when the stream is absent (osrt off or
    unavailable: never an empty file)."""
    if OSRT_STREAM not in ctx.streams:
        return None
    return ctx.csv(HEADER, statistic_rows(records(ctx.records(OSRT_STREAM)), ctx.device_id))


def _limit(config: Mapping[str, Any] | Any) -> int:
    value = config.get(LIMIT_KEY) if config is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, DEFAULT_TIMELINE_LIMIT)
    return DEFAULT_TIMELINE_LIMIT


def add_to_master(ctx: ExportContext, timeline: Timeline) -> None:
    """Each call on the ``OS Runtime API`` layer: a process per traced pid, a track per thread;
    the first calls in time order up to the cap, with a marker and a note where it cut."""
    calls = sorted(records(ctx.records(OSRT_STREAM)), key=lambda r: r.start_ns)
    if not calls:
        return
    limit = _limit(ctx.config)
    kept = calls[:limit]
    pids: dict[int, int] = {}
    events: list[dict[str, Any]] = []
    for r in kept:
        pid = pids.get(r.pid)
        if pid is None:
            name = LAYER if r.pid == ctx.pid else f"{LAYER} (pid {r.pid})"
            pid = pids[r.pid] = timeline.process(name)
        timeline.thread(pid, r.tid, f"Thread {r.tid}")
        events.append({"name": r.name, "ph": "X", "pid": pid, "tid": r.tid, "ts": ctx.to_us(r.start_ns),
                       "dur": ctx.dur_us(r.start_ns, r.start_ns + r.dur_ns)})
    if len(calls) > limit:
        ctx.notes.append(f"{LAYER} layer capped at {limit} system calls per iteration (the first in "
                         "time order; os_runtime_statistic counts every call)")
        first = next(iter(pids.values()))
        events.append({"name": "jobprof: timeline capped", "ph": "i", "s": "p", "pid": first, "tid": 0,
                       "ts": ctx.to_us(calls[limit].start_ns),
                       "args": {"kept events": limit, "events": len(calls)}})
    timeline.add(events)
