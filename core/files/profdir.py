"""The PROF_ directory of a job and the device_<id> folder of each process.

All processes of one job share one ``PROF_<index>_<timestamp>_<suffix>`` folder: the first
profiled process names it and exports ``JOBPROF_JOB_DIR``; children inherit the variable.
Nothing is created until a process finishes its first iteration, and each process claims its
own ``device_<id>`` with an atomic ``mkdir`` so no two processes ever write the same file.

The index counts jobs even when several start at the same moment.  The name must be final
before any child starts (children inherit it) yet nothing may be created until the first
iteration, so the index is claimed without touching the disk: the naming process binds the
abstract Unix socket ``jobprof-prof-<hash of the output folder>-<index>`` (Linux; it vanishes
with the process) for the next index no ``PROF_`` folder has, taking the next one while the
bind fails, and lists the folder again after a successful bind (a holder that has exited made
its folder first).  Jobs in different network namespaces sharing one folder can still get one
index; their names still differ (timestamp and random suffix).

``JOBPROF_JOB_DIR`` is honoured only when it names a ``PROF_`` entry directly inside the
resolved output folder that is absent or a real folder; anything else (``..``, a symbolic
link, another name) is ignored with one warning.  Folders are made through :mod:`jobprof.files.fsio`
(mode 0o750, no symbolic link followed below the output folder).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import re
import secrets
import socket
import stat
import string
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from jobprof.files import fsio

JOB_ENV = "JOBPROF_JOB_DIR"
PROF_RE = re.compile(r"^PROF_(\d{6})_(\d{17})_([0-9A-Z]{16})$")
DEVICE_RE = re.compile(r"^device_(\d+)$")
#: a writer's per-iteration file (``WriterSpec.filename``): ``<name>_<device>_<model>_<iteration>.<ext>``
ITERATION_FILE_RE = re.compile(
    r"^(?P<name>[a-z][a-z0-9_]*?)_(?P<device>\d+)_(?P<model>\d+)_(?P<iter>\d+)\.(?P<ext>json|csv)$")
#: the file extension of each per-iteration folder
FOLDER_EXT = {"timeline": "json", "summary": "csv"}


def device_id(device_dir: Path) -> int:
    """The id in a ``device_<id>`` folder's name (ValueError for any other name)."""
    named = DEVICE_RE.match(device_dir.name)
    if named is None:
        raise ValueError(f"{device_dir.name} is not a device_<id> folder")
    return int(named.group(1))


def device_dirs(prof_dir: Path) -> list[Path]:
    """The ``device_<id>`` folders of a PROF_ folder, by device id."""
    return sorted((p for p in prof_dir.iterdir() if DEVICE_RE.match(p.name) and p.is_dir()), key=device_id)


def _used_indices(output: str) -> set[int]:
    try:
        return {int(m.group(1)) for n in os.listdir(output) if (m := PROF_RE.match(n))}
    except OSError:
        return set()


def _claim_index(output: str) -> tuple[int, socket.socket | None]:
    """The next index no PROF_ folder of ``output`` has and no live naming process holds, with
    the socket that holds it (keep it open for the life of the process; None: no claim)."""
    index = max(_used_indices(output), default=0) + 1
    if not sys.platform.startswith("linux"):
        return index, None
    key = hashlib.sha256(os.fsencode(output)).hexdigest()[:16]
    for _ in range(10000):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"\0jobprof-prof-{key}-{index}")
        except OSError:
            sock.close()
            index += 1
            continue
        used = _used_indices(output)
        if index in used:  # its holder made the folder and exited between our look and the bind
            sock.close()
            index = max(used) + 1
            continue
        return index, sock
    return index, None


def inherited_problem(inherited: str, output: str) -> str | None:
    """Why ``JOBPROF_JOB_DIR=inherited`` cannot be this job's folder under ``output``, or None."""
    path = Path(inherited)
    if not path.is_absolute() or path.parent != Path(output) or not PROF_RE.match(path.name):
        return (f"is not a PROF_<index>_<timestamp>_<suffix> folder directly inside the output "
                f"folder {output}")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None if stat.S_ISDIR(mode) else f"is {fsio.describe(mode)}, not a folder"


def job_dir(output: str, environ: dict | os._Environ = os.environ,
            warn: Callable[[str], None] | None = None) -> tuple[Path, socket.socket | None]:
    """This job's PROF_ path, named now (and inherited by child processes), created later, and
    the claim on its index that the naming process holds while it lives (None when inherited).

    A ``JOBPROF_JOB_DIR`` that :func:`inherited_problem` refuses is replaced (for children too)
    and named in one ``warn`` (default: the process's reporter)."""
    inherited = environ.get(JOB_ENV)
    if inherited:
        problem = inherited_problem(inherited, output)
        if problem is None:
            return Path(inherited), None
        if warn is None:
            from jobprof.plugin.reporter import REPORTER

            warn = REPORTER.warning
        warn(f"{JOB_ENV}={inherited!r} ignored: it {problem}; this job gets a PROF_ folder of its own")
    index, claim = _claim_index(output)
    stamp = dt.datetime.now().strftime("%Y%m%d%H%M%S%f")[:17]
    # never the program's random module: a capture is named mid-run (dynamic mode), and a draw
    # from the shared generator would change every number the program draws after it
    suffix = "".join(secrets.choice(string.ascii_uppercase) for _ in range(16))
    path = Path(output, f"PROF_{index:06d}_{stamp}_{suffix}")
    environ[JOB_ENV] = str(path)
    return path, claim


def preferred_device_id(torch: Any) -> tuple[int, str]:
    """The msprof device id of this process and how it was chosen (docs/msprof.md section 8)."""
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_device(), "cuda current device"
    except Exception:
        pass
    if os.environ.get("LOCAL_RANK", "").isdigit():
        return int(os.environ["LOCAL_RANK"]), "LOCAL_RANK"
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), "torch.distributed rank"
    except Exception:
        pass
    return 0, "single process"


def job_rank(torch: Any, environ: Any = os.environ) -> dict[str, Any]:
    """This process's place in a distributed job: ``rank_id``, ``world_size`` and the default
    group's ``backend`` (``N/A`` outside one), from torchrun's ``RANK`` / ``WORLD_SIZE`` or else
    torch.distributed (set up by ``init_process_group``, e.g. under ``torch.multiprocessing.spawn``)."""
    rank, world, source = environ.get("RANK", ""), environ.get("WORLD_SIZE", ""), "RANK / WORLD_SIZE"
    backend, found = "N/A", None
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            backend = str(dist.get_backend())
            found = {"rank_id": dist.get_rank(), "world_size": dist.get_world_size(),
                     "rank_from": "torch.distributed", "backend": backend}
    except Exception:
        pass
    if rank.isdigit() and world.isdigit():
        return {"rank_id": int(rank), "world_size": int(world), "rank_from": source, "backend": backend}
    return found or {"rank_id": "N/A", "world_size": "N/A", "rank_from": "not distributed", "backend": "N/A"}


def claim_device_dir(job: Path, preferred: int) -> tuple[int, Path]:
    """Create ``job/device_<id>`` atomically, taking the next free id if another process has it.

    The output folder may be reached through links (the user's path); ``job`` and everything
    below it are real folders (a symbolic link raises :class:`jobprof.files.fsio.UnsafePath`)."""
    fsio.make_dirs(job.parent)
    fd = fsio.open_dir(job, root=job, create=True)
    try:
        device = preferred
        while True:
            name = f"device_{device}"
            try:
                os.mkdir(name, fsio.DIR_MODE, dir_fd=fd)
            except FileExistsError:
                device += 1
                continue
            break
    finally:
        os.close(fd)
    path = job / name
    for sub in ("data", "timeline", "summary"):
        fsio.make_dirs(path / sub, root=job)
    return device, path


def program_name() -> str:
    """The profiled program as msprof's ``pid_name`` shows it: the script's file name."""
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"


def host_info(device_id: int, extra: dict[str, Any]) -> dict[str, Any]:
    """msprof's info.json body for a CPU/CUDA host, with what jobprof can really measure."""
    mem_kb = None
    try:
        with open("/proc/meminfo") as handle:
            mem_kb = int(handle.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {
        "jobInfo": "NA",
        "version": "1.0",
        "OS": f"{platform.system()}-{platform.release()}-{platform.version()}",
        "cpuCores": os.cpu_count(),
        "hostname": socket.gethostname(),
        "hwtype": platform.machine(),
        "devices": str(device_id),
        "pid": str(os.getpid()),
        "pid_name": program_name(),
        "memoryTotal": mem_kb if mem_kb is not None else "N/A",
        **extra,
    }


def info_rank(info: dict[str, Any]) -> int | None:
    """The job rank in a device's info.json (``rank_id``), or None when it has none (``N/A``
    outside a distributed job): readers then name the device by its id."""
    rank = info.get("rank_id")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


@attrs.frozen(order=True)
class IterationFile:
    """One per-iteration file of a device folder; sorts by iteration, then model."""

    iteration: int
    model: int
    name: str
    path: Path


def iteration_files(device_dir: Path, folder: str, name: str | None = None) -> list[IterationFile]:
    """The writers' files in ``device_dir/<folder>`` (``timeline`` or ``summary``), of writer
    ``name`` or of all, in iteration order; only those named for this folder's device."""
    device = device_id(device_dir)
    base = device_dir / folder
    found = []
    for path in base.glob(f"{name or '*'}_*.{FOLDER_EXT[folder]}") if base.is_dir() else ():
        m = ITERATION_FILE_RE.match(path.name)
        if m and int(m["device"]) == device and (name is None or m["name"] == name):
            found.append(IterationFile(int(m["iter"]), int(m["model"]), m["name"], path))
    return sorted(found)
