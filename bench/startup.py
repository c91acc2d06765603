"""Interpreter start-up cost of ``jobprof-autoload.pth``.

Faithful A/B: the A and B interpreters process the *same* site-packages, once without and once
with the real installed ``.pth``.  ``python -S`` skips the real site-packages, then
``site.addsitedir(D)`` processes D exactly as ``site.main()`` would (every ``.pth``, in sorted
order).  D is a farm of symlinks to every entry of the real site-packages, minus
``jobprof-autoload.pth`` for A; B additionally holds a copy of it.  Keeping the other ``.pth``
files (the editable-install finder among them) matters: for a PROFILING_MODE value the line
cannot rule out it imports ``jobprof._autoload``, which must be found the way a real start
finds it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import site
import statistics
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import HarnessError, Timed, clean_env, summary, timed_run, verdict

PTH_NAME = "jobprof-autoload.pth"
TARGET_MS = 1.0
WARMUP = 3  # untimed starts per case: fill the page cache and write .pyc files first
# The child also times site.addpackage() for the jobprof .pth alone (0 when absent): the same
# call site.main() makes, without the interpreter's init and teardown, whose noise (several ms
# on a busy 2-core VM) swamps a sub-ms difference in the whole-process figure.
ADDSITEDIR = "\n".join([
    "import site, sys, time",
    "spent, real = 0.0, site.addpackage",
    "def timed(sitedir, name, known):",
    "    global spent",
    "    t = time.perf_counter()",
    "    try:",
    "        return real(sitedir, name, known)",
    "    finally:",
    f"        spent += time.perf_counter() - t if name == {PTH_NAME!r} else 0.0",
    "site.addpackage = timed",
    "site.addsitedir(sys.argv[1])",
    "print(spent)",
])
# PROFILING_MODE values of the off cases: unset, the documented off value, and a value the
# .pth cannot rule out (so it imports jobprof._autoload, which then decides: no profiling)
MODES: dict[str, str | None] = {"unset": None, "false": "false", "other": "disabled"}
PROBE = ("import site, sys; site.addsitedir(sys.argv[1]); "
         "print('jobprof._autoload' in sys.modules)")


@dataclass(frozen=True)
class Case:
    name: str
    cmd: list[str]
    env: dict[str, str]


def installed_pth() -> Path:
    """The .pth the running interpreter really processes at start-up."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    for d in dirs:
        if Path(d, PTH_NAME).is_file():
            return Path(d, PTH_NAME)
    raise HarnessError(f"{PTH_NAME} not found in {dirs}; install jobprof first (pip install -e .)")


def build_farms(root: Path, pth: Path) -> tuple[Path, Path]:
    """Two site dirs mirroring the real one: without and with a copy of the .pth."""
    without, with_ = root / "site_without", root / "site_with"
    for farm in (without, with_):
        farm.mkdir()
        for entry in os.scandir(pth.parent):
            if entry.name != PTH_NAME:
                (farm / entry.name).symlink_to(entry.path)
    shutil.copy2(pth, with_ / PTH_NAME)
    return without, with_


def _probe(farm: Path, env: Mapping[str, str]) -> bool:
    """True when the start imported jobprof._autoload; fails on any stderr output."""
    out = timed_run([sys.executable, "-S", "-c", PROBE, str(farm)], env)
    if out.stderr.strip():
        raise HarnessError(f"start-up with {farm.name} wrote to stderr:\n{out.stderr}")
    return out.stdout.strip() == "True"


def _check_profiling_on(env: Mapping[str, str]) -> None:
    code = ("import sys; s = sys.modules.get('jobprof.runtime._state'); "
            "print(s is not None and s.SESSION is not None)")
    out = timed_run([sys.executable, "-c", code], env)
    if out.stdout.strip() != "True" or out.stderr.strip():
        raise HarnessError(f"PROFILING_MODE=true did not start a session:\n{out.stderr}")


def _verify(without: Path, with_: Path, envs: dict[str, dict[str, str]],
            on: dict[str, str]) -> dict[str, bool]:
    """Prove each case is what its name says before timing it.

    Returns, per PROFILING_MODE case, whether the .pth line imported ``jobprof._autoload``:
    observed, not assumed, since the line decides which values are worth an import.
    """
    imported = {}
    for mode, env in envs.items():
        if _probe(without, env):
            raise HarnessError(f"jobprof._autoload imported without the .pth ({mode})")
        imported[mode] = _probe(with_, env)
    if imported["unset"]:
        raise HarnessError("PROFILING_MODE unset imported jobprof._autoload")
    _check_profiling_on(on)
    return imported


def _field(t: Timed, field: str) -> float:
    return float(t.stdout) if field == "site_s" else getattr(t, field)


def _paired(times: dict[str, list[Timed]], a: str, b: str, field: str) -> dict[str, Any]:
    base = [_field(t, field) for t in times[a]]
    prof = [_field(t, field) for t in times[b]]
    diffs = [p - q for p, q in zip(prof, base, strict=True)]  # same round: shared noise cancels
    return {"baseline_ms": summary(base, 1e3), "profiled_ms": summary(prof, 1e3),
            "delta_ms": summary(diffs, 1e3),
            "delta_of_medians_ms": (statistics.median(prof) - statistics.median(base)) * 1e3}


def run(repeats: int, seed: int = 0) -> dict[str, Any]:
    pth = installed_pth()
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-startup-") as tmp:
        without, with_ = build_farms(Path(tmp), pth)
        out_dir = Path(tmp, "prof")
        pyc = str(Path(tmp, "pycache"))
        envs = {mode: clean_env({} if value is None else {"PROFILING_MODE": value}, pyc)
                for mode, value in MODES.items()}
        on = clean_env({"PROFILING_MODE": "true", "PROFILING_OPTIONS": json.dumps(
            {"output": str(out_dir), "export": "inline", "training_trace": "on", "task_trace": "off"})}, pyc)
        py = sys.executable
        cases = [Case(f"{mode}/{farm.name.removeprefix('site_')}",
                      [py, "-S", "-c", ADDSITEDIR, str(farm)], env)
                 for mode, env in envs.items() for farm in (without, with_)]
        # real site-packages, plain `python -c pass`: the profiling-on start (informational)
        cases += [Case("pass/off", [py, "-c", "pass"], envs["unset"]),
                  Case("pass/true", [py, "-c", "pass"], on)]
        imported = _verify(without, with_, envs, on)
        for case in cases:
            for _ in range(WARMUP):
                timed_run(case.cmd, case.env)
        times: dict[str, list[Timed]] = {c.name: [] for c in cases}
        rng = random.Random(seed)
        for _ in range(repeats):
            # every round runs each case once, in a fresh random order: drift and position
            # effects spread evenly over the cases instead of biasing one of them
            for case in rng.sample(cases, len(cases)):
                times[case.name].append(timed_run(case.cmd, case.env))
        if out_dir.exists() and any(out_dir.iterdir()):
            raise HarnessError(f"a process that ran no step wrote to {out_dir}")

    results: dict[str, Any] = {
        mode: {"profiling_mode": MODES[mode], "autoload_imported": imported[mode],
               **{f: _paired(times, f"{mode}/without", f"{mode}/with", f"{f}_s")
                  for f in ("wall", "cpu", "site")}}
        for mode in MODES
    }
    results["true_no_torch"] = {f: _paired(times, "pass/off", "pass/true", f"{f}_s")
                                for f in ("wall", "cpu")}
    return {
        "pth": str(pth), "pth_line": pth.read_text().strip(), "repeats": repeats,
        "bytecode": "cached under a temporary PYTHONPYCACHEPREFIX (warm-up starts write it)",
        "checks": [f"PROFILING_MODE{_mode_label(m)}: jobprof._autoload "
                   f"{'imported' if imported[m] else 'not imported'}, nothing printed"
                   for m in MODES] + ["PROFILING_MODE=true: session started, waiting for torch"],
        "cases": {name: {"wall_s": [t.wall_s for t in ts], "cpu_s": [t.cpu_s for t in ts],
                         **({"site_s": [float(t.stdout) for t in ts]}
                            if not name.startswith("pass/") else {})}
                  for name, ts in times.items()},
        "results": results,
    }


def _mode_label(mode: str) -> str:
    return " unset" if MODES[mode] is None else f"={MODES[mode]}"


def _row(name: str, stats: dict[str, Any], gated: bool, unit: str = "ms") -> dict[str, Any]:
    d = stats["delta_ms"]
    return {
        "benchmark": name,
        "baseline": f"{stats['baseline_ms']['median']:.2f} {unit}",
        "profiled": f"{stats['profiled_ms']['median']:.2f} {unit}",
        "delta / ratio": f"{d['median']:+.3f} {unit}",
        "spread": (f"IQR [{d['q1']:+.2f}, {d['q3']:+.2f}], "
                   f"{d['ci_coverage']:.0%} CI [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]"),
        "target": f"< {TARGET_MS:g} {unit}" if gated else "-",
        "result": verdict(d["median"], d["ci_low"], d["ci_high"], TARGET_MS) if gated else "info",
    }


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows: whole-process wall time (the figure that matters) and the precise site time.

    Deltas are medians of per-round paired differences (with .pth minus without).
    """
    res = result["results"]
    out = []
    for mode in MODES:
        label = f"startup .pth, PROFILING_MODE{_mode_label(mode)}"
        out.append(_row(f"{label}: process wall", res[mode]["wall"], True))
        out.append(_row(f"{label}: .pth line in-process", res[mode]["site"], True))
    out.append(_row("startup PROFILING_MODE=true, no torch: process wall (info)",
                    res["true_no_torch"]["wall"], False))
    return out
