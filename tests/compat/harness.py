"""The compatibility matrix's one rule: a program runs the same profiled and unprofiled.

Every case runs a real program (``programs/*.py``, plain user code that knows nothing of
jobprof) once unprofiled and once per option set, in the same test, and compares what the
program itself shows: its exit code, its stdout (losses as ``repr`` floats, so equal text is
bit-identical floats; RNG draws and compile counters printed at the end), its own stderr lines
(jobprof's are prefixed ``jobprof:``).  Then it checks what jobprof recorded: the iterations
found against the true optimizer steps, the method, and a sane summary.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest

PROGRAMS = Path(__file__).resolve().parent / "programs"
REPO = Path(__file__).resolve().parents[2]

#: the option sets of every row: the step tier, the operator tier at l0 and l1, one aic group
#: task_trace is on by default (msprof's default): the step tier turns it off
STEP_TIER = {"training_trace": "on", "dp": "on", "msproftx": "on", "task_trace": "off"}
OPTION_SETS: dict[str, dict[str, str]] = {
    "step": STEP_TIER,
    "l0": {**STEP_TIER, "task_trace": "l0"},
    "l1": {**STEP_TIER, "task_trace": "l1", "aicpu": "on"},
    "aic": {**STEP_TIER, "task_trace": "on", "aic_metrics": "PipeUtilization"},
    # the sampled operator tier: Kineto paused and resumed at every other iteration end; with
    # the default export: what the job's exit leaves, a background exporter renders
    "sampled": {**STEP_TIER, "task_trace": "l1", "task_trace_every": 2, "export": "background"},
    # task_memory: with the operator tier (Kineto's memory profiling, module calls recorded) and
    # on the step tier alone (the sampler thread)
    "memory": {**STEP_TIER, "task_trace": "l1", "task_memory": "on"},
    "memory_step": {**STEP_TIER, "task_memory": "on"},
    # every host value (host_sys, host_sys_usage at its default 50 Hz: a sampler thread, perf
    # trace where the machine lets it run) and runtime_api (a CPU job has none: one line)
    "host": {**STEP_TIER, "host_sys": "cpu,mem,disk,network,osrt", "host_sys_usage": "cpu,mem",
             "runtime_api": "on"},
    # compiled programs only (tests/compat/test_compile.py): Inductor emits a profiler range per
    # C++ kernel, a different compile of the same graph
    "kernels": {**STEP_TIER, "task_trace": "on", "fusion_op": "kernels"},
    # dynamic mode (PROFILING_MODE=dynamic): the step tier always, and a trigger that fires at
    # almost every iteration with no cool-down: captures of two iterations (the operator tier
    # at l1, dp, msproftx) begin and end all through the run
    "dynamic": {**STEP_TIER, "task_trace": "l1",
                "trigger": {"slow_iteration": 1.1, "warmup": 2, "iterations": 2, "cooldown_s": 0}},
}
#: the PROFILING_MODE of a set (default "true")
MODE_OF = {"dynamic": "dynamic"}
#: the sets every row of the matrix runs.  The torch version legs (.ci/legs) narrow them with
#: COMPAT_SETS=l1: what differs between torch releases is the capture, and l1 runs the step tier's
#: hooks and the operator tier's Kineto session (with shapes); l0 drops the shapes, aic only adds
#: export-time columns.  The main suite runs all four.
DEFAULT_SETS = tuple(os.environ.get("COMPAT_SETS", "step,l0,l1,aic").split(","))
assert set(DEFAULT_SETS) <= set(OPTION_SETS), f"COMPAT_SETS names an unknown set: {DEFAULT_SETS}"

#: lines a program may print that differ run to run whatever jobprof does (wall times, rates)
DEFAULT_VOLATILE = re.compile(r"runtime|per_second|elapsed|it/s|s/it|\d+:\d\d")
#: torch's log records (``TORCH_LOGS`` artifacts, dynamo/inductor warnings) carry a time stamp
#: and a pid: compared as level and message, never dropped as volatile
TORCH_LOG = re.compile(r"^(?:\[rank\d+\]:)?([VIWEC])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ (.*)$")


def _own_lines(text: str, volatile: re.Pattern[str]) -> list[str]:
    out = []
    for line in text.splitlines():
        log = TORCH_LOG.match(line)
        if log:
            out.append(f"{log[1]} {log[2]}")
        elif line.strip() and not line.startswith("jobprof:") and not volatile.search(line):
            out.append(line)
    return out


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PROFILING_", "JOBPROF_", "TORCH_LOGS"))
           and k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    # one thread and deterministic algorithms make a run's floats a function of its inputs alone
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0",
                "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    # the suite keeps both cores busy: a background exporter at nice 19 (its default) would get
    # almost no CPU while a test waits for its files
    env["JOBPROF_EXPORTER_NICE"] = "0"
    env.update(extra)
    return env


@attrs.frozen
class Run:
    """One run of a program: what it showed and, when profiled, where jobprof wrote."""

    label: str
    code: int
    stdout: str
    stderr: str
    output: Path | None

    def own_stderr(self, volatile: re.Pattern[str] = DEFAULT_VOLATILE) -> list[str]:
        """The program's own stderr lines: jobprof's prefixed lines and volatile ones dropped,
        torch's log records without their time stamp and pid."""
        return _own_lines(self.stderr, volatile)

    def own_stdout(self, volatile: re.Pattern[str] = DEFAULT_VOLATILE) -> list[str]:
        return _own_lines(self.stdout, volatile)

    def jobprof_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("jobprof:")]

    def prof_dir(self) -> Path:
        assert self.output is not None, f"{self.label} was not profiled"
        found = sorted(self.output.glob("PROF_*"))
        # dynamic mode: the job's folder (its captures are folders beside it)
        found = [p for p in found if (p / "control").is_dir()] or found
        assert len(found) == 1, f"{self.label}: expected one PROF_ folder, found {found}"
        return found[0]

    def describe(self) -> str:
        return (f"[{self.label}] exit {self.code}\nstdout:\n{self.stdout[-3000:]}\n"
                f"stderr:\n{self.stderr[-6000:]}")


def wait_rendered(output: Path, timeout: float = 300) -> None:
    """Wait for the job's background exporters (what its exit did not render)."""
    from jobprof.files import handover

    for device_dir in output.glob("PROF_*/device_*"):
        assert handover.wait(device_dir, timeout), f"{device_dir}: the background exporter is still rendering"


def run(program: str | Path, tmp: Path, label: str, options: Mapping[str, Any] | None = None,
        args: Iterable[str] = (), env: Mapping[str, str] | None = None, timeout: float = 600,
        launcher: list[str] | None = None) -> Run:
    """Run ``program`` (a file in ``programs/`` or a path), profiled when ``options`` is given
    (in the PROFILING_MODE of the set named ``label``: :data:`MODE_OF`)."""
    path = Path(program) if Path(program).is_absolute() else PROGRAMS / program
    work = tmp / label
    work.mkdir(parents=True, exist_ok=True)
    extra = dict(env or {})
    output = None
    if options is not None:
        output = work / "prof"
        extra["PROFILING_MODE"] = MODE_OF.get(label, "true")
        # every file before the job returns unless the set chooses (an exporter per run cost
        # the matrix a Python start-up each); the default, "background", is the `export` set's
        extra["PROFILING_OPTIONS"] = json.dumps({"output": str(output), "export": "inline", **options})
    cmd = [*(launcher or [sys.executable]), str(path), *args]
    proc = subprocess.run(cmd, cwd=work, env=clean_env(**extra), capture_output=True, text=True,
                          timeout=timeout)
    if output is not None:
        wait_rendered(output)
    return Run(label, proc.returncode, proc.stdout, proc.stderr, output)


def run_matrix(program: str | Path, tmp: Path, option_sets: Iterable[str] = DEFAULT_SETS,
               args: Iterable[str] = (), env: Mapping[str, str] | None = None, timeout: float = 600,
               launcher: list[str] | None = None, parallel: int = 2) -> tuple[Run, dict[str, Run]]:
    """The unprofiled run and one profiled run per option set, two at a time (one thread each).

    With the dynamic set, every run (the unprofiled one too) makes its fourth iteration slow
    (``COMPAT_SLOW_STEP`` 2, see programs/common.py) so the set's trigger fires whatever the
    machine's load: CI run 79 saw a 6-step amp loop never 1.1x its running median."""
    args, option_sets = list(args), tuple(option_sets)
    if "dynamic" in option_sets:
        env = {"COMPAT_SLOW_STEP": "2", **(env or {})}
    jobs = {"unprofiled": None, **{name: OPTION_SETS[name] for name in option_sets}}
    with ThreadPoolExecutor(parallel) as pool:
        futures = {label: pool.submit(run, program, tmp, label, opts, args, env, timeout, launcher)
                   for label, opts in jobs.items()}
        runs = {label: f.result() for label, f in futures.items()}
    return runs.pop("unprofiled"), runs


def assert_same(base: Run, profiled: Run, volatile: re.Pattern[str] = DEFAULT_VOLATILE) -> None:
    """(a)+(b): exit code, stdout (losses, RNG draws, counters) and own stderr lines are equal."""
    assert base.code == 0, base.describe()
    assert profiled.code == base.code, profiled.describe()
    shown = f"--- unprofiled\n{base.stdout[-3000:]}\n--- {profiled.label}\n{profiled.stdout[-3000:]}"
    assert profiled.own_stdout(volatile) == base.own_stdout(volatile), f"stdout differs\n{shown}"
    shown = f"--- unprofiled\n{base.stderr[-4000:]}\n--- {profiled.label}\n{profiled.stderr[-4000:]}"
    assert profiled.own_stderr(volatile) == base.own_stderr(volatile), f"stderr differs\n{shown}"


def facts(run_: Run) -> dict[str, str]:
    """``KEY value`` lines a program prints about itself (``STEPS 12``, ``FORWARDS 20``)."""
    out = {}
    for line in run_.stdout.splitlines():
        m = re.match(r"^([A-Z_]+) (.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def iterations(run_: Run, device: int = 0) -> tuple[list[Any], dict[str, Any]]:
    from jobprof.analysis.profile import Profile

    profile = Profile(run_.prof_dir())
    return profile.iterations(device), profile.info(device).get("jobprof", {})


def assert_iterations(run_: Run, expected: int, method: str, device: int = 0) -> list[Any]:
    """(c): one iteration per true step, found by ``method``, tiling the run."""
    its, info = iterations(run_, device)
    assert info.get("iteration_method") == method, (run_.label, info.get("iteration_method"))
    assert [it.index for it in its] == list(range(1, expected + 1)), \
        f"{run_.label}: {len(its)} iterations recorded, {expected} true steps\n{run_.describe()}"
    for prev, it in itertools.pairwise(its):
        assert it.start_ns == prev.end_ns and it.end_ns > it.start_ns
    assert info.get("end_reason") == "exit", info.get("end_reason")
    return its


def step_trace_rows(run_: Run, device: int = 0) -> dict[int, dict[str, str]]:
    rows = {}
    for path in sorted((run_.prof_dir() / f"device_{device}" / "summary").glob("step_trace_*.csv")):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                rows[int(row["Iteration ID"])] = row
    return rows


def summary(run_: Run) -> dict[str, Any]:
    exe = Path(sys.executable).with_name("jobprof")
    proc = subprocess.run([str(exe), "summary", "--json", str(run_.prof_dir())], capture_output=True,
                          text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _us(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def assert_summary_sane(run_: Run, device: int = 0) -> dict[str, Any]:
    """(f): the summary's FP→BP is the step_trace CSV's (less what was painted before it), the
    jobprof part lies where jobprof worked, and no iteration is blamed for jobprof's start-up."""
    from jobprof.files import rawstore

    model = summary(run_)
    csv_rows = step_trace_rows(run_, device)
    raw = dict(rawstore.read(run_.prof_dir() / f"device_{device}"))
    rows = [r for r in model["iterations"] if r["device"] == device]
    assert rows, model
    for r in rows:
        index = r["iteration"]
        fp_bp = _us(csv_rows[index]["FP to BP Time(us)"])
        fb = r["forward_backward_ms"]
        before = sum(r[k] or 0.0 for k in ("profiler_ms", "data_wait_ms", "communication_not_overlapped_ms"))
        if fp_bp is None:
            assert fb is None, (index, fb)
            continue
        assert fb is not None, (index, r)
        assert fp_bp / 1e3 - before - 1e-3 <= fb <= fp_bp / 1e3 + 1e-3, (index, fb, fp_bp, r)
        it = raw[index]["iteration"][0]
        for start, end in raw[index].get(rawstore.PROFILER_STREAM, []):
            # jobprof's span starts where its work started: after the iteration began
            assert it["start_ns"] < start <= end, (index, start, end, it)
    rank = rows[0]["rank"]
    if any(f["key"] == "warmup" and f["evidence"].get("rank") == rank for f in model["findings"]):
        first = next(r for r in rows if r["iteration"] == 1)
        median = next(x for x in model["ranks"] if x["rank"] == rank)["breakdown_ms"]["iteration"]["median"]
        assert first["iteration_ms"] - (first["profiler_ms"] or 0) > 3 * median, (first, median)
    return model


def _clip(line: str | None, at: int, width: int = 160) -> str:
    """``line`` around column ``at`` (where it first differs from the other arm's)."""
    if line is None:
        return "<none>"
    start = max(0, at - 40)
    return ("..." if start else "") + line[start:start + width] + ("..." if len(line) > start + width else "")


def reason(base, run, exc, volatile: re.Pattern[str] = DEFAULT_VOLATILE) -> str:
    """One line saying why ``run`` failed: the first difference the program shows, else the check."""
    if run.code != base.code:
        last = [line for line in run.stderr.splitlines() if line.strip()][-1:] or ["(no stderr)"]
        return f"exit {run.code} (unprofiled {base.code}): {last[0][:200]}"
    for what, mine, theirs in (("stdout", run.own_stdout(volatile), base.own_stdout(volatile)),
                               ("stderr", run.own_stderr(volatile), base.own_stderr(volatile))):
        if mine != theirs:
            pairs = zip(mine, theirs, strict=False)
            k = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(mine), len(theirs)))
            a = mine[k] if k < len(mine) else None
            b = theirs[k] if k < len(theirs) else None
            at = next((i for i, (x, y) in enumerate(zip(a or "", b or "", strict=False)) if x != y),
                      min(len(a or ""), len(b or "")))
            return f"{what} line {k}: profiled {_clip(a, at)!r}, unprofiled {_clip(b, at)!r}"
    text = str(exc).splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def check_all(base, runs, steps, method, extra=(), volatile: re.Pattern[str] = DEFAULT_VOLATILE):
    """(a)-(f) for every profiled run, then each ``extra(base, run)`` check; one failure report
    naming each option set that failed, at which check and why."""
    assert base.code == 0, base.describe()
    checks = [("same", lambda base, run: assert_same(base, run, volatile)),
              ("captures", assert_captures),
              ("iterations", lambda base, run: assert_iterations(run, steps, method)),
              ("summary", lambda base, run: assert_summary_sane(run)),
              *((getattr(check, "__name__", "extra"), check) for check in extra)]
    failures = {}
    for label, run in runs.items():
        for name, check in checks:
            try:
                check(base, run)
            except AssertionError as exc:
                failures[label] = (f"[{name}] {reason(base, run, exc, volatile)}", str(exc))
                break
    if failures:
        heads = "\n".join(f"  {label}: {line}" for label, (line, _) in failures.items())
        details = "\n\n".join(f"===== {label}\n{text}" for label, (_, text) in failures.items())
        pytest.fail(f"{len(failures)}/{len(runs)} option sets failed:\n{heads}\n\n{details}", pytrace=False)


def captures(run_: Run) -> list[Path]:
    """Dynamic mode: the capture folders beside the job's (each a complete profile)."""
    assert run_.output is not None
    job = run_.prof_dir()
    return [p for p in sorted(run_.output.glob("PROF_*")) if p != job]


def assert_captures(base: Run, run_: Run) -> None:
    """The dynamic set: its trigger fired; each capture is a whole profile of the iterations
    it names (step_trace and op_summary for each), and ended as a capture or with the job."""
    if MODE_OF.get(run_.label) != "dynamic":
        return
    from jobprof.analysis.profile import Profile

    found = captures(run_)
    assert found, f"{run_.label}: no capture was made\n{run_.describe()}"
    for folder in found:
        profile = Profile(folder)
        info = profile.info(0).get("jobprof", {})
        capture = info.get("capture") or {}
        assert info.get("end_reason") in ("capture end", "exit"), (folder.name, info.get("end_reason"))
        its = [it.index for it in profile.iterations(0)]
        assert its == list(range(capture["first"], capture["last"] + 1)), (folder.name, its, capture)
        summary = folder / "device_0" / "summary"
        for name in ("step_trace", "op_summary"):
            assert len(list(summary.glob(f"{name}_*.csv"))) == len(its), (folder.name, name)
