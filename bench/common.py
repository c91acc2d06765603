"""Shared helpers: a clean child environment, timed child runs, and robust statistics."""

from __future__ import annotations

import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Variables that change what jobprof (or the interpreter's start-up) does: the harness's own
# environment must not leak into a case, so each case starts from a scrubbed copy.
_SCRUB_PREFIXES = ("PROFILING_", "JOBPROF_")
_SCRUB_NAMES = {"PYTHONPATH", "PYTHONSTARTUP", "PYTHONPROFILEIMPORTTIME", "PYTHONINSPECT",
                "PYTHONVERBOSE", "PYTHONDEVMODE", "PYTHONTRACEMALLOC", "PYTHONNOUSERSITE"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a gloo rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HarnessError(RuntimeError):
    """The harness could not measure (a child failed); distinct from a slow result."""


def clean_env(extra: Mapping[str, str] | None = None,
              pycache_prefix: str | None = None) -> dict[str, str]:
    """The harness's environment minus anything that steers jobprof or the start-up.

    With ``pycache_prefix``, bytecode is cached there even if PYTHONDONTWRITEBYTECODE is set:
    an installed jobprof has .pyc files (pip compiles wheels; an editable install writes them
    at first import), and compiling its sources at every start would be measured otherwise.
    The prefix keeps those .pyc files out of the source tree.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_SCRUB_PREFIXES) and k not in _SCRUB_NAMES}
    if pycache_prefix is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache_prefix
    env.update(extra or {})
    return env


#: the line a Python child started with :func:`own_peak_env` writes to stderr as it exits
OWN_PEAK_LINE = "jobprof-bench-vmhwm-kb"
_OWN_PEAK_SITE = (
    "import atexit, os, sys\n"
    "def _own_peak():\n"
    "    try:\n"
    "        for line in open('/proc/self/status'):\n"
    "            if line.startswith('VmHWM:'):\n"
    f"                os.write(2, ('{OWN_PEAK_LINE} %s\\n' % line.split()[1]).encode())\n"
    "    except OSError:\n"
    "        pass\n"
    "atexit.register(_own_peak)\n")


def own_peak_env(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """``env`` for Python children that report their own peak RSS as they exit (VmHWM, through a
    ``sitecustomize`` in ``folder``): ``wait4``'s ru_maxrss is floored at the harness's own size,
    which Linux carries across fork and exec into the child (546 MB once the harness imported
    torch); VmHWM is the exec'd process's own.  Read it back with :func:`own_peak_kb`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_OWN_PEAK_SITE)
    paths = [str(folder), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def own_peak_kb(stderr: str) -> int | None:
    """The largest peak (KiB) reported in ``stderr`` by a child of :func:`own_peak_env` and the
    Python processes it started (its workers), or None when none reported (``os._exit``)."""
    found = [int(line.split()[1]) for line in stderr.splitlines() if line.startswith(OWN_PEAK_LINE + " ")]
    return max(found) if found else None


@dataclass(frozen=True)
class Timed:
    wall_s: float
    cpu_s: float  # user+sys of the child: less sensitive to a busy neighbour than wall time
    stdout: str
    stderr: str


def timed_run(cmd: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
              timeout: float = 600.0) -> Timed:
    """Run ``cmd`` to completion and return its wall and CPU time; raise if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=dict(env), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)!r} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return Timed(wall, cpu, proc.stdout, proc.stderr)


def wait_exporters(output: Path) -> None:
    """Wait for the detached exporters of the profiles under ``output`` (the default ``export``,
    background, leaves one after the job): untimed, so the next run never shares the CPU with
    one.  ``jobprof export --wait`` also renders what one left."""
    exe = Path(sys.executable).with_name("jobprof")
    for prof in output.glob("PROF_*"):
        if any(prof.glob("device_*")):
            timed_run([str(exe), "export", "--wait", str(prof)], clean_env(), cwd=str(output))


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3); the inclusive method keeps small samples inside their range."""
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, med, q3


def summary(values: Sequence[float], scale: float = 1.0) -> dict[str, Any]:
    q1, med, q3 = quartiles(values)
    low, high, coverage = median_ci(values)
    return {"n": len(values), "median": med * scale, "q1": q1 * scale, "q3": q3 * scale,
            "iqr": (q3 - q1) * scale, "min": min(values) * scale, "max": max(values) * scale,
            "ci_low": low * scale, "ci_high": high * scale, "ci_coverage": coverage}


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free confidence interval of the median (sign test order statistics).

    Returns ``(low, high, coverage)``; with too few values for ``level`` it falls back to
    ``[min, max]`` and reports that interval's real, lower coverage.
    """
    xs, n = sorted(values), len(values)

    def coverage(k: int) -> float:  # P(x_(k) <= median <= x_(n-k+1)) for a continuous variable
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def verdict(point: float, low: float, high: float, target: float) -> str:
    """pass/FAIL of the point estimate against an upper target; '?' when the CI straddles it."""
    word = "pass" if point <= target else "FAIL"
    return word if (high <= target or low > target) else f"{word}?"


@dataclass(frozen=True)
class CpuSnapshot:
    busy_s: float  # whole machine, all CPUs (steal included: the VM lost that time too)
    total_s: float
    own_s: float  # this harness and the children it waited for


def cpu_snapshot() -> CpuSnapshot | None:
    """Machine-wide CPU accounting from /proc/stat (None where there is no /proc)."""
    try:
        with open("/proc/stat") as handle:
            ticks = [int(v) for v in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    hz = os.sysconf("SC_CLK_TCK")
    own = sum(getattr(resource.getrusage(who), f) for who in
              (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
    busy = user + nice + system + irq + softirq + steal
    return CpuSnapshot(busy / hz, (busy + idle + iowait) / hz, own)


def foreign_share(before: CpuSnapshot | None, after: CpuSnapshot | None) -> float | None:
    """Share of the machine's CPU time used by processes other than the harness's own.

    The load average cannot tell: it counts the benchmark's own processes too.
    """
    if before is None or after is None or after.total_s <= before.total_s:
        return None
    foreign = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(0.0, foreign / (after.total_s - before.total_s))


def rotated(arms: Sequence[str], round_index: int) -> Sequence[str]:
    """The arms in the order of round ``round_index``: rotated one place per round, so drift over
    a run spreads over all of them."""
    k = round_index % len(arms)
    return [*arms[k:], *arms[:k]]


def table_row(benchmark: str, baseline: str, profiled: str, value: str, target: str, ok: bool | None,
              spread: str = "") -> dict[str, Any]:
    """One row of the bench table: ``result`` is ``info`` (no target), ``pass`` or ``FAIL``."""
    return {"benchmark": benchmark, "baseline": baseline, "profiled": profiled, "delta / ratio": value,
            "spread": spread, "target": target, "result": "info" if ok is None else "pass" if ok else "FAIL"}
