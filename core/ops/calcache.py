"""The calibration (:mod:`jobprof.ops.calibrate`) measured once per machine and setting, kept in
the user's cache folder and reused, so that a job does not spend a second or more measuring
peaks before its first iteration.

Where: ``$JOBPROF_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/jobprof`` (an absolute
``XDG_CACHE_HOME`` only), else ``~/.cache/jobprof``; one file per key,
``calibration-<digest of the key>.json``.

A stale or foreign result is never used: the file holds its key, which must equal the one this
process computes (the digest in the name only finds it), and the key is everything that changes
what torch reaches here (:func:`machine_key`): the host's identity (``/etc/machine-id``, else the
boot's id, digested; the host name; the kernel release), the CPU (``/proc/cpuinfo``'s model,
microcode, digested flags; the CPU count, this process's affinity size, a cgroup CPU quota), the
memory total, Python's version, torch's version and build (``torch.__config__``, the CPU
capability its kernels use, MKL / oneDNN / OpenMP), its thread count and float32 matmul
precision, a few environment variables that select kernels, the device (``cpu``, or the GPU's
name, capability, UUID, SM count, memory, CUDA and driver versions and its matmul precision
flags), and the calibration's method (:func:`jobprof.ops.calibrate.method_key`: its
``METHOD_VERSION``, text and budget).  A result older than :data:`MAX_AGE_S` is measured
again.  Computing the key takes about 1 ms (``torch.__config__.show()`` is the largest part),
reading the file well under 1 ms.

A measurement that other processes disturbed is not kept for long: on a CPU, ``/proc/stat`` is
read around it, and when other processes used more than :data:`QUIET_SHARE` of the CPU time
this process's CPUs (its affinity) had, the file is marked so and serves for
:data:`DISTURBED_AGE_S` only (the job's other ranks on this host), after which the next job
measures again; a quiet measurement replaces it at once and a disturbed one never replaces a
quiet one.  (A GPU's measurement is not checked: other GPU users are not visible without NVML.)
Processes that miss at the same time (the ranks of a job on one host) measure one at a time
under a lock (``flock``, waited for at most :data:`LOCK_WAIT_S`), so the others read the first
one's result instead of disturbing it; where two measurements of one key meet anyway, the
stored figures are the best of both, as the calibration itself keeps the best of its runs.

Safety: the folder is created 0700 and refused when it is not the user's or others may write
to it; the file is opened with ``O_NOFOLLOW`` (a symbolic link is never followed, nor replaced),
must be a regular file of the user's, and is written whole to a temporary file (0600) moved into
place with ``os.replace``.  Nothing here raises: any problem reading or writing the cache means
the peaks are measured for this job, and the problems are said in one warning.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

#: the variable naming the cache folder (tests point it at a temporary folder)
ENV = "JOBPROF_CACHE_DIR"
#: the cache file's layout; bump when it changes (an older file is then a miss)
FORMAT = 1
#: a cached result older than this is measured again (seconds)
MAX_AGE_S = 30 * 86400
#: a measurement is kept only when other processes used at most this share of the CPU time of
#: this process's CPUs while it ran
QUIET_SHARE = 0.25
#: a disturbed measurement is kept this long only (seconds): for the other processes of the job
#: (its ranks on this host), which then need not measure, disturbing each other
DISTURBED_AGE_S = 120
#: how long a process waits for another that measures the same key (a cold first calibration
#: takes seconds)
LOCK_WAIT_S = 20.0
#: a larger file is not ours (ours is about 2 KB)
MAX_FILE_BYTES = 1 << 16
#: environment variables that select kernels (their values join the key when set)
KERNEL_ENV = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
              "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG", "TORCH_BLAS_PREFER_CUBLASLT")
#: /proc/cpuinfo fields of the first processor that identify the CPU (x86 and Arm spellings)
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "microcode", "cache size",
               "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision")
_CPU_DIGESTED = ("flags", "Features")
_MATMUL, _VECTOR, _MEMORY = "matmul_flops_per_s", "vector_flops_per_s", "memory_bytes_per_s"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# -- where ------------------------------------------------------------------------------------
def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The cache folder this process uses (not created here)."""
    env = os.environ if environ is None else environ
    named = env.get(ENV)
    if named:
        return Path(named).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is ignored
        return Path(xdg) / "jobprof"
    return Path.home() / ".cache" / "jobprof"


def file_name(key: Mapping[str, Any]) -> str:
    return f"calibration-{_digest(_canonical(key))[:24]}.json"


# -- the key ----------------------------------------------------------------------------------
def machine_key(torch: Any, device: str, method: Mapping[str, Any]) -> dict[str, Any]:
    """Everything that changes the calibration's figures on this machine (module docstring);
    ``method`` identifies the calibration method (:func:`jobprof.ops.calibrate.method_key`).
    JSON values only, so that a key read back from a file compares equal."""
    key: dict[str, Any] = {"format": FORMAT, "method": dict(method), "host": _host(), "cpu": _cpu(),
                           "python": f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}",
                           "torch": _torch(torch),
                           "env": {name: os.environ[name] for name in KERNEL_ENV if name in os.environ}}
    dev = torch.device(device)
    key["device"] = _cuda(torch, dev) if dev.type == "cuda" else {"type": dev.type}
    return json.loads(_canonical(key))


def _host() -> dict[str, Any]:
    identity = _read_text("/etc/machine-id").strip() or _read_text("/var/lib/dbus/machine-id").strip()
    source = "machine-id"
    if not identity:
        identity, source = _read_text("/proc/sys/kernel/random/boot_id").strip(), "boot_id"
    uname = os.uname()
    return {"id": _digest("jobprof calibration " + identity)[:32] if identity else "", "id_from": source,
            "name": uname.nodename, "kernel": uname.release, "machine": uname.machine,
            "memory_total": _memory_total()}


def _cpu() -> dict[str, Any]:
    fields = _first_cpuinfo_block()
    out: dict[str, Any] = {name: fields[name] for name in _CPU_FIELDS if name in fields}
    for name in _CPU_DIGESTED:
        if name in fields:
            out[name] = _digest(" ".join(sorted(fields[name].split())))[:32]
    out["count"] = os.cpu_count() or 0
    try:
        out["affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["affinity"] = out["count"]
    out["quota"] = _cpu_quota()
    return out


def _torch(torch: Any) -> dict[str, Any]:
    backends = torch.backends
    parallel = [line.strip() for line in torch.__config__.parallel_info().splitlines()
                if line.strip() and "thread" not in line.lower() and not line.startswith("ATen/")]
    return {
        "version": str(torch.__version__),
        "git": str(getattr(torch.version, "git_version", "") or ""),
        "build": _digest(torch.__config__.show())[:32],
        "parallel": parallel,
        "capability": _call(lambda: backends.cpu.get_cpu_capability()),
        "mkl": _call(lambda: bool(backends.mkl.is_available())),
        "mkldnn": _call(lambda: bool(backends.mkldnn.is_available())),
        "openmp": _call(lambda: bool(backends.openmp.is_available())),
        "threads": int(torch.get_num_threads()),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
    }


def _cuda(torch: Any, dev: Any) -> dict[str, Any]:
    """The GPU's identity and the flags that change its matmul kernels (UNVERIFIED on a GPU here)."""
    props = torch.cuda.get_device_properties(dev)
    matmul = torch.backends.cuda.matmul
    with warnings.catch_warnings():  # allow_tf32 & co. are deprecated in favour of fp32_precision
        warnings.simplefilter("ignore")
        flags: dict[str, Any] = {}
        for name in ("allow_tf32", "fp32_precision", "allow_fp16_reduced_precision_reduction",
                     "allow_bf16_reduced_precision_reduction"):
            flags[name] = _call(partial(getattr, matmul, name))
        flags["blas"] = _call(lambda: str(torch.backends.cuda.preferred_blas_library()))
    driver = getattr(torch._C, "_cuda_getDriverVersion", None)
    return {"type": "cuda", "name": str(props.name), "capability": f"{props.major}.{props.minor}",
            "uuid": str(getattr(props, "uuid", "")), "sms": int(getattr(props, "multi_processor_count", 0)),
            "memory": int(getattr(props, "total_memory", 0)), "cuda": str(torch.version.cuda),
            "driver": _call(driver) if driver is not None else None, "matmul": flags}


def _first_cpuinfo_block() -> dict[str, str]:
    """The first processor's fields (the kernel generates /proc/cpuinfo as it is read: reading
    one block of a 200-CPU machine's costs what a small one's does)."""
    fields: dict[str, str] = {}
    text = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
        while "\n\n" not in text:
            chunk = handle.read(8192)
            if not chunk:
                break
            text += chunk
    for line in text.split("\n\n", 1)[0].splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def _memory_total() -> int:
    for line in _read_text("/proc/meminfo", 512).splitlines():
        if line.startswith("MemTotal:"):
            with contextlib.suppress(ValueError, IndexError):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_quota() -> str:
    text = _read_text("/sys/fs/cgroup/cpu.max").strip()  # cgroup v2: "<quota|max> <period>"
    if text:
        return text
    quota = _read_text("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").strip()  # cgroup v1
    period = _read_text("/sys/fs/cgroup/cpu/cpu.cfs_period_us").strip()
    return f"{quota} {period}".strip()


def _read_text(path: str, limit: int = 4096) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return ""


def _call(fn: Callable[[], Any] | None) -> Any:
    try:
        return _json_value(fn()) if fn is not None else None
    except Exception:
        return None


def _json_value(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- the CPU other processes used ---------------------------------------------------------------
class _Quiet:
    """Other processes' share of the CPU time of this process's CPUs between :meth:`start` and
    :meth:`share` (from /proc/stat, minus this process's own CPU time); None when unknown."""

    def __init__(self) -> None:
        try:
            self.cpus: set[int] | None = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpus = None
        try:
            self.hz = os.sysconf("SC_CLK_TCK")
        except (AttributeError, ValueError, OSError):
            self.hz = 100
        self.busy0 = self.own0 = self.wall0 = 0.0

    def start(self) -> None:
        self.busy0, self.own0, self.wall0 = self._busy(), time.process_time(), time.perf_counter()

    def share(self) -> float | None:
        busy, own, wall = self._busy(), time.process_time(), time.perf_counter()
        if math.isnan(busy) or math.isnan(self.busy0) or not self.cpus or wall <= self.wall0:
            return None
        other = max(0.0, (busy - self.busy0) - (own - self.own0))
        return round(other / ((wall - self.wall0) * len(self.cpus)), 3)

    def _busy(self) -> float:
        """Seconds the CPUs of the affinity spent busy since boot (NaN when unknown)."""
        if not self.cpus:
            return math.nan
        ticks = 0
        try:
            with open("/proc/stat", encoding="ascii", errors="replace") as handle:
                for line in handle:
                    if not line.startswith("cpu"):
                        break
                    name, *values = line.split()
                    if name == "cpu" or int(name[3:]) not in self.cpus:
                        continue
                    # user nice system idle iowait irq softirq steal (guest is inside user)
                    numbers = [int(v) for v in values[:8]]
                    ticks += sum(numbers) - numbers[3] - (numbers[4] if len(numbers) > 4 else 0)
        except (OSError, ValueError, IndexError):
            return math.nan
        return ticks / self.hz


# -- reading and writing ----------------------------------------------------------------------
class _Problems:
    """What went wrong with the cache, said in one warning at the end."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, text: str) -> None:
        if text not in self.items:
            self.items.append(text)


def _usable_dir(folder: Path, problems: _Problems) -> bool:
    """Create ``folder`` (0700) if missing; False (said) when it is not the user's, others may
    write to it, or it cannot be made."""
    try:
        if not folder.exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
        info = os.stat(folder)
        link = os.lstat(folder)
    except OSError as exc:
        problems.add(f"cannot use the cache folder {folder} ({exc.strerror or exc})")
        return False
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if not stat.S_ISDIR(info.st_mode):
        problems.add(f"the cache folder {folder} is not a folder")
    elif uid is not None and (info.st_uid != uid or link.st_uid != uid):
        problems.add(f"the cache folder {folder} is not the user's (owner uid {info.st_uid}, "
                     f"link owner uid {link.st_uid}): not used")
    elif info.st_mode & 0o022:
        problems.add(f"others may write to the cache folder {folder} (mode {stat.S_IMODE(info.st_mode):o}): "
                     "not used")
    else:
        return True
    return False


#: why a file was not used, when it must not be replaced either (someone else's, a link)
_KEEP = "keep"


def _read(path: Path, problems: _Problems) -> tuple[dict[str, Any] | None, str]:
    """(the file's JSON object or None, why not: '' when there is no file, ``_KEEP`` when the
    file must not be written over)."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            problems.add(f"the cache file {path} is a symbolic link: not followed")
        else:
            problems.add(f"cannot read the cache file {path} ({exc.strerror or exc})")
        return None, _KEEP
    try:
        info = os.fstat(fd)
        uid = os.geteuid() if hasattr(os, "geteuid") else info.st_uid
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            problems.add(f"the cache file {path} is not a regular file of the user's: not used")
            return None, _KEEP
        if info.st_size > MAX_FILE_BYTES:
            problems.add(f"the cache file {path} is too large ({info.st_size} bytes): replaced")
            return None, "too large"
        data = b""
        while len(data) <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        problems.add(f"cannot read the cache file {path} ({exc.strerror or exc})")
        return None, _KEEP
    finally:
        os.close(fd)
    try:
        entry = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        entry = None
    if not isinstance(entry, dict):
        problems.add(f"the cache file {path} is not a calibration (unreadable JSON): replaced")
        return None, "unreadable"
    return entry, ""


def _why_unusable(entry: Mapping[str, Any], key: Mapping[str, Any], now: float) -> str:
    """'' when ``entry`` is a usable result for ``key`` at ``now``, else why not."""
    stored = entry.get("key")
    if entry.get("format") != FORMAT or not isinstance(stored, dict):
        return "of another format"
    if stored != key:
        differ = sorted(name for name in set(stored) | set(key) if stored.get(name) != key.get(name))
        return f"of another setting ({', '.join(differ)} differ)"
    measured = entry.get("measured_at")
    if not isinstance(measured, (int, float)) or isinstance(measured, bool) or not math.isfinite(measured):
        return "without a measurement time"
    if not isinstance(entry.get("quiet"), bool):
        return "of another format"
    if measured > now + 86400:
        return "measured in the future"
    if not entry["quiet"] and now - measured > DISTURBED_AGE_S:
        return f"disturbed and older than {DISTURBED_AGE_S} s"
    if now - measured > MAX_AGE_S:
        return f"older than {MAX_AGE_S // 86400} days"
    if not _has_peaks(entry.get("result")):
        return "without peaks"
    return ""


def _has_peaks(result: Any) -> bool:
    if not isinstance(result, dict) or "error" in result:
        return False
    values: list[Any] = [result.get(_MEMORY)]
    for table in (result.get(_MATMUL), result.get(_VECTOR)):
        if not isinstance(table, dict) or not table:
            return False
        values += table.values()
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
               for v in values)


def _write(path: Path, entry: Mapping[str, Any], problems: _Problems) -> bool:
    """``entry`` as the whole new content of ``path``, atomically (temporary file + os.replace)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".tmp", dir=path.parent)  # 0600
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(entry, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)  # a rename: a link at ``path`` is replaced, never followed
        return True
    except OSError as exc:
        problems.add(f"cannot write the cache file {path} ({exc.strerror or exc})")
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False


@contextlib.contextmanager
def _locked(path: Path, wait_s: float):
    """Hold ``<path>.lock`` (flock) while measuring; yields whether it is held (a lock that
    cannot be had in ``wait_s`` or at all: go on without it)."""
    fd = None
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
    except OSError:
        if fd is not None:
            os.close(fd)
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)  # releases the lock


def _best_of(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` with each peak replaced by ``old``'s where that is higher (with the size it was
    measured at): the peaks are the best torch reached."""
    out = dict(new)
    for table, sizes in ((_MATMUL, "matmul_n"), (_VECTOR, None)):
        merged, merged_n = dict(new.get(table) or {}), dict(new.get(sizes) or {}) if sizes else {}
        for dtype, value in (old.get(table) or {}).items():
            if isinstance(value, (int, float)) and value > (merged.get(dtype) or 0):
                merged[dtype] = value
                if sizes and dtype in (old.get(sizes) or {}):
                    merged_n[dtype] = old[sizes][dtype]
                elif table == _VECTOR and "vector_elements" in old:
                    out["vector_elements"] = old["vector_elements"]
        out[table] = merged
        if sizes:
            out[sizes] = merged_n
    if (old.get(_MEMORY) or 0) > (new.get(_MEMORY) or 0):
        out[_MEMORY] = old[_MEMORY]
        if "memory_buffer_bytes" in old:
            out["memory_buffer_bytes"] = old["memory_buffer_bytes"]
    return out


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the entry point --------------------------------------------------------------------------
def calibrate(torch: Any, device: str, measure: Callable[[Any, str], dict[str, Any]],
              method: Mapping[str, Any], *, warn: Callable[[str], None] | None = None,
              folder: Path | None = None, quiet_share: float = QUIET_SHARE,
              lock_wait_s: float = LOCK_WAIT_S) -> dict[str, Any]:
    """The calibration of ``device`` for info.json: the cached one when a usable one exists,
    else ``measure(torch, device)`` now (:func:`jobprof.ops.calibrate.calibrate`), kept for the
    next job; ``method`` joins the key (:func:`jobprof.ops.calibrate.method_key`).  The result
    is the calibration's dict plus where it came from: ``source`` (``"cache"`` /
    ``"measured"``), ``cache_file`` (None when no cache could be used), ``measured_at`` (UTC,
    ISO 8601), ``cache_note`` (what happened with the cache) and ``other_cpu_share`` (other
    processes' share of the CPU time while it was measured; None for a GPU or where unknown).
    Never raises; cache problems go to ``warn``, in one message."""
    problems = _Problems()
    try:
        result = _calibrate_cached(torch, device, measure, method, folder, quiet_share, lock_wait_s, problems)
    except Exception as exc:  # a bug here must cost the cache, never the job
        problems.add(f"{type(exc).__name__}: {exc}")
        result = dict(measure(torch, device))
        result.update(source="measured", cache_file=None, measured_at=_iso(time.time()),
                      cache_note="not stored: the cache failed", other_cpu_share=None)
    if problems.items and warn is not None:
        tail = "; the peaks were measured for this job" if result.get("source") == "measured" else ""
        with contextlib.suppress(Exception):
            warn(f"calibration cache: {'; '.join(problems.items)}{tail}")
    return result


def _calibrate_cached(torch: Any, device: str, measure: Callable[[Any, str], dict[str, Any]],
                      method: Mapping[str, Any], folder: Path | None, quiet_share: float, lock_wait_s: float,
                      problems: _Problems) -> dict[str, Any]:
    try:
        key = machine_key(torch, device, method)
    except Exception as exc:  # e.g. a torch without some API: no cache, the measurement decides
        return _measured(torch, device, measure, None, f"not stored: no key ({type(exc).__name__}: {exc})")
    folder = cache_dir() if folder is None else folder
    if not _usable_dir(folder, problems):
        return _measured(torch, device, measure, None, "not stored: the cache folder cannot be used")
    path = folder / file_name(key)
    entry, why = _read(path, problems)
    found = _hit_or_note(entry, key, why)
    if isinstance(found, dict):
        return _from_cache(found, device, path)
    with _locked(path, lock_wait_s) as held:
        if held:  # another process may have measured it while this one waited
            entry, why = _read(path, _Problems())
            again = _hit_or_note(entry, key, why)
            if isinstance(again, dict):
                return _from_cache(again, device, path)
        if why == _KEEP:
            note = f"{found}; not stored: the cache file is not replaced"
            return _measured(torch, device, measure, path, note)
        started = time.time()
        result = _measured(torch, device, measure, path, f"{found}; ")
        result["cache_note"] += _store(path, key, result, started, quiet_share, problems)
        return result


def _store(path: Path, key: dict[str, Any], result: dict[str, Any], started: float, quiet_share: float,
           problems: _Problems) -> str:
    """Keep a fresh measurement (best of it and a usable one of the same kind that met it);
    what was done, for ``cache_note``."""
    if "error" in result:
        return "not stored: the measurement failed"
    share = result.get("other_cpu_share")
    quiet = share is None or share <= quiet_share
    now = time.time()
    figures = {k: v for k, v in result.items() if k not in _PROVENANCE}
    measurements = 1
    current, _ = _read(path, _Problems())
    if current is not None and not _why_unusable(current, key, now):
        if current.get("quiet") and not quiet:
            return "not stored: disturbed, and a quiet measurement is cached"
        if bool(current.get("quiet")) == quiet:  # two measurements met: the best of both
            figures = _best_of(current["result"], figures)
            measurements += int(current.get("measurements", 1) or 1)
    entry = {"format": FORMAT, "key": key, "measured_at": started, "quiet": quiet, "other_cpu_share": share,
             "measurements": measurements, "result": figures}
    if not _write(path, entry, problems):
        return "not stored: cannot write"
    if quiet:
        return "stored"
    return (f"stored for {DISTURBED_AGE_S} s only: other processes used {share:.0%} of the CPU while it "
            "ran")


#: the keys :func:`calibrate` adds to the calibration's own
_PROVENANCE = ("source", "cache_file", "measured_at", "cache_note", "other_cpu_share")


def _hit_or_note(entry: dict[str, Any] | None, key: Mapping[str, Any], why: str) -> dict[str, Any] | str:
    """The usable entry, or the note saying why it was a miss."""
    if entry is None:
        return f"miss: cache file {why if why != _KEEP else 'unusable'}" if why else "miss: no cached result"
    reason = _why_unusable(entry, key, time.time())
    return entry if not reason else f"miss: cached result {reason}"


def _from_cache(entry: Mapping[str, Any], device: str, path: Path) -> dict[str, Any]:
    result = dict(entry["result"])
    result["device"] = device  # the same device by the key (a GPU by its UUID)
    note = "hit"
    if not entry.get("quiet"):
        note = (f"hit: a measurement disturbed by other processes, reused for {DISTURBED_AGE_S} s after it "
                "only")
    result.update(source="cache", cache_file=str(path), measured_at=_iso(float(entry["measured_at"])),
                  cache_note=note, other_cpu_share=entry.get("other_cpu_share"))
    return result


def _measured(torch: Any, device: str, measure: Callable[[Any, str], dict[str, Any]], path: Path | None,
              note: str) -> dict[str, Any]:
    cpu = not device.startswith("cuda")
    quiet = _Quiet() if cpu else None
    if quiet is not None:
        quiet.start()
    started = time.time()
    result = dict(measure(torch, device))
    result.update(source="measured", cache_file=None if path is None else str(path),
                  measured_at=_iso(started), cache_note=note,
                  other_cpu_share=None if quiet is None else quiet.share())
    return result
