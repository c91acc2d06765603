"""Hardware (and software) performance counters of the calling thread, via Linux ``perf_event_open``.

The l2 plugin reads last-level-cache accesses and misses around each operator.  The kernel
interface is one syscall plus ``read``/``ioctl`` on the returned descriptors, so it is driven
through ``ctypes`` rather than a new dependency: a ``perf_event_attr`` Structure, ``syscall()``
from libc, ``os.read`` and ``fcntl.ioctl``.

Scope: every counter is opened with ``pid=0, cpu=-1`` -- the calling thread, on whatever CPU it
runs.  Per-thread is what a per-operator reading needs: a delta between two reads on the thread
that ran the operator holds that operator's events and not those of the DataLoader, the other
ranks' processes or other jobs on the machine.  The counters stay bound to the thread that opened
them (open the group on the thread that runs the operators).  ``inherit`` is left off because the
kernel cannot read an inherited group in one go, so work torch hands to its intra-op pool threads
is not in the count.

The counters of a group are read together with one ``read`` (``PERF_FORMAT_GROUP``), so their
ratio (a hit rate) comes from one instant.  When the PMU has fewer counters than are in use, the
kernel time-shares (multiplexes) them; the read then carries time_enabled > time_running, and
the values are scaled by enabled/running -- the kernel's own estimate, as ``perf stat`` prints.

Every platform problem (not Linux, no such counter on a VM, perf_event_paranoid, seccomp) comes
back as an ``Unavailable`` with the reason, never as an exception.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import struct
import sys

import attrs

# perf_event_attr.type
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_HW_CACHE = 3

# PERF_TYPE_HARDWARE configs
PERF_COUNT_HW_CACHE_REFERENCES = 2
PERF_COUNT_HW_CACHE_MISSES = 3

# PERF_TYPE_SOFTWARE configs
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_COUNT_SW_PAGE_FAULTS = 2

# PERF_TYPE_HW_CACHE config = cache_id | (op << 8) | (result << 16)
PERF_COUNT_HW_CACHE_LL = 2
PERF_COUNT_HW_CACHE_OP_READ = 0
PERF_COUNT_HW_CACHE_RESULT_ACCESS = 0
PERF_COUNT_HW_CACHE_RESULT_MISS = 1

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_GROUP = 1 << 3
_READ_FORMAT = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING

# perf_event_attr flag bits (one u64 bitfield in the C struct)
_FLAG_DISABLED = 1 << 0
_FLAG_EXCLUDE_KERNEL = 1 << 5
_FLAG_EXCLUDE_HV = 1 << 6

# _IO('$', n); PERF_IOC_FLAG_GROUP applies the ioctl to the whole group through its leader
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
PERF_IOC_FLAG_GROUP = 1

# the descriptors must not survive an exec (a DataLoader worker started by spawn, a subprocess)
PERF_FLAG_FD_CLOEXEC = 1 << 3

#: perf_event_open's syscall number; aarch64 and riscv64 share the generic table
_SYSCALL_NUMBERS = {"x86_64": 298, "amd64": 298, "aarch64": 241, "arm64": 241, "riscv64": 241}

PARANOID_PATH = "/proc/sys/kernel/perf_event_paranoid"


class PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to PERF_ATTR_SIZE_VER5 (112 bytes); the kernel zero-fills the rest."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),  # union with sample_freq
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),  # disabled:1, inherit:1, pinned:1, ..., exclude_kernel (bit 5), ...
        ("wakeup_events", ctypes.c_uint32),  # union with wakeup_watermark
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # union with bp_addr
        ("config2", ctypes.c_uint64),  # union with bp_len
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
    ]


@attrs.frozen
class CounterSpec:
    """One event to count: a display name and the kernel's (type, config) pair."""

    name: str
    type: int
    config: int


def hw_cache_config(cache: int, op: int, result: int) -> int:
    return cache | (op << 8) | (result << 16)


#: last-level cache read accesses and misses (hit rate = 1 - misses / accesses)
LLC = (
    CounterSpec("LLC-loads", PERF_TYPE_HW_CACHE, hw_cache_config(
        PERF_COUNT_HW_CACHE_LL, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_ACCESS)),
    CounterSpec("LLC-load-misses", PERF_TYPE_HW_CACHE, hw_cache_config(
        PERF_COUNT_HW_CACHE_LL, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS)),
)
#: the generic cache events (usually the LLC too; the CPU vendor decides what they count)
CACHE_GENERIC = (
    CounterSpec("cache-references", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_REFERENCES),
    CounterSpec("cache-misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES),
)
#: kernel-implemented events that exist on every Linux machine, VMs included: the tests use them
SOFTWARE = (
    CounterSpec("task-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK),
    CounterSpec("page-faults", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS),
)


@attrs.frozen
class Unavailable:
    """Why a counter group cannot be opened here (shown to the user as is)."""

    reason: str


class CounterGroup:
    """An open group of counters on the calling thread; read them together with ``read()``."""

    def __init__(self, specs: tuple[CounterSpec, ...], fds: list[int]) -> None:
        self.specs = specs
        self._fds = fds
        self._leader = fds[0]
        # read layout: nr, time_enabled, time_running, then one u64 per counter
        layout = struct.Struct(f"={3 + len(specs)}Q")
        self._unpack = layout.unpack
        self._size = layout.size

    @property
    def closed(self) -> bool:
        return not self._fds

    def read(self) -> tuple[int, ...] | None:
        """Current counts, in ``specs`` order, scaled when the kernel multiplexed the group.

        None when the group has not run at all since it was enabled (time_running == 0: the
        group is disabled, or the PMU never had room for it) -- the counts are then unknown,
        not zero.  Counts are cumulative; the caller subtracts two reads.
        """
        raw = self._unpack(os.read(self._leader, self._size))
        if raw[1] == raw[2] and raw[2]:  # the common case: never multiplexed
            return raw[3:]
        return scaled(raw[3:], raw[1], raw[2])

    def enable(self) -> None:
        _ioctl(self._leader, PERF_EVENT_IOC_ENABLE)

    def disable(self) -> None:
        _ioctl(self._leader, PERF_EVENT_IOC_DISABLE)

    def reset(self) -> None:
        """Zero the counts (the time_enabled/running totals keep going)."""
        _ioctl(self._leader, PERF_EVENT_IOC_RESET)

    def close(self) -> None:
        """Close every descriptor (members first); idempotent."""
        fds, self._fds = self._fds, []
        # a closed number can be reused by another file: read()/ioctl must fail with EBADF instead
        self._leader = -1
        for fd in reversed(fds):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> CounterGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter teardown: os may already be gone
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"fd={self._leader}"
        return f"CounterGroup({', '.join(s.name for s in self.specs)}; {state})"


def scaled(values: list[int] | tuple[int, ...], enabled: int, running: int) -> tuple[int, ...] | None:
    """The kernel's multiplexing estimate: each count times enabled/running; None if it never ran."""
    if running == 0:
        return None
    return tuple(v * enabled // running for v in values)


def _ioctl(fd: int, request: int) -> None:
    import fcntl

    fcntl.ioctl(fd, request, PERF_IOC_FLAG_GROUP)


def open_group(specs: tuple[CounterSpec, ...] | list[CounterSpec], *,
               enabled: bool = True) -> CounterGroup | Unavailable:
    """Open ``specs`` as one group on the calling thread (the first is the leader).

    User space only (exclude_kernel, exclude_hv): that is what perf_event_paranoid 2, the usual
    default, allows a process to measure of itself.  The leader is opened disabled and enabled
    once all members joined, so every counter covers the same interval; ``enabled=False``
    leaves it to the caller's ``enable()``.  On any failure the descriptors opened so far are
    closed and the reason comes back as ``Unavailable``.
    """
    specs = tuple(specs)
    if not specs:
        return Unavailable("no counters requested")
    syscall = _syscall()
    if isinstance(syscall, Unavailable):
        return syscall
    fds: list[int] = []
    for spec in specs:
        attr = PerfEventAttr()
        attr.type = spec.type
        attr.size = ctypes.sizeof(PerfEventAttr)
        attr.config = spec.config
        attr.read_format = _READ_FORMAT
        # members follow their leader: only the leader is ever disabled/enabled
        attr.flags = _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV | (0 if fds else _FLAG_DISABLED)
        group_fd = fds[0] if fds else -1
        fd = syscall(ctypes.byref(attr), 0, -1, group_fd, PERF_FLAG_FD_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            for opened in reversed(fds):
                os.close(opened)
            return Unavailable(_explain(spec, code))
        fds.append(fd)
    group = CounterGroup(specs, fds)
    if enabled:
        try:
            group.enable()
        except OSError as exc:
            group.close()
            return Unavailable(f"{specs[0].name}: enabling the group failed: {exc.strerror}")
    return group


def probe(specs: tuple[CounterSpec, ...] | list[CounterSpec]) -> str | None:
    """None when the group opens on this machine, else why not (for a start-up message)."""
    result = open_group(specs, enabled=False)
    if isinstance(result, Unavailable):
        return result.reason
    result.close()
    return None


@functools.cache
def _syscall():
    """libc's ``syscall`` bound to perf_event_open, or why there is none here."""
    if not sys.platform.startswith("linux"):
        return Unavailable("perf events exist only on Linux")
    machine = platform.machine().lower()
    number = _SYSCALL_NUMBERS.get(machine)
    if number is None:
        return Unavailable(f"perf_event_open's syscall number is not known for {machine or 'this CPU'}")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        raw = libc.syscall
    except (OSError, AttributeError) as exc:
        return Unavailable(f"libc's syscall() is not reachable: {exc}")
    raw.restype = ctypes.c_long
    raw.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                    ctypes.c_ulong]

    def perf_event_open(attr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
        return raw(number, attr, pid, cpu, group_fd, flags)

    return perf_event_open


def read_paranoid() -> int | None:
    """kernel.perf_event_paranoid, or None when it cannot be read."""
    try:
        with open(PARANOID_PATH) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _explain(spec: CounterSpec, code: int) -> str:
    # Linux's ENOTSUP is EOPNOTSUPP, the name the kernel source and perf use
    name = "EOPNOTSUPP" if code == errno.EOPNOTSUPP else errno.errorcode.get(code, f"errno {code}")
    head = f"{spec.name} (type {spec.type}, config {spec.config:#x}): {name}"
    if code in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
        return f"{head}: the CPU or hypervisor exposes no such counter (common on VMs)"
    if code in (errno.EACCES, errno.EPERM):
        paranoid = read_paranoid()
        setting = f"kernel.perf_event_paranoid is {paranoid}" if paranoid is not None else \
            f"{PARANOID_PATH} is unreadable"
        return (f"{head}: permission denied ({setting}; measuring this process's user space needs 2 or "
                f"less, or CAP_PERFMON; a container's seccomp profile can also block perf_event_open)")
    if code == errno.ENOSYS:
        return f"{head}: this kernel has no perf events (CONFIG_PERF_EVENTS is off)"
    return f"{head}: {os.strerror(code)}"
