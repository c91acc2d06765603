"""Analysis commands on a long multi-rank profile: wall time, rows per second, peak memory.

A real profile is made once: ``torchrun --nproc_per_node R examples/train_ddp.py --steps N``
(tiny batch) with ``training_trace``, ``hccl``, ``dp`` on and ``task_trace`` at ``l0``; it is
cached under ``--analysis-cache DIR`` (default: a temporary folder, removed afterwards), keyed
by ranks, iterations and options, so a rerun with the same folder skips the generation.

Each command then runs as a child process, ``repeats`` times in turn: ``jobprof summary --json``,
``jobprof report -o x.html``, ``jobprof merge -o m.json`` and ``jobprof export --layout cann8``
(each only when the installed ``jobprof`` has it).  Per command: the median wall time (the CLI's
start-up included: that is what a user waits for), its CPU time, rows per second (iterations x
ranks / wall s), raw records per second (summary, report: every raw record of the profile is
read) or events per second (merge: the events it wrote), and the child's peak RSS from
``os.wait4`` (that child alone, not the harness's other children).  Targets: summary and report
within ``TARGET_S`` and ``TARGET_MB`` for 1,000 iterations x 4 ranks; merge and export are
reported without a target.

    python bench/analysis.py [--quick] [--cache DIR] [--repeats N] [--hotspots]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, free_port

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "train_ddp.py"
OPTIONS = {"training_trace": "on", "hccl": "on", "dp": "on", "task_trace": "l0"}
ITERATIONS, RANKS = 1000, 4
QUICK_ITERATIONS, QUICK_RANKS = 200, 2
BATCH = 8
TARGET_S = 10.0  # summary, report of 1,000 x 4: "in seconds"
TARGET_MB = 500.0
TARGETED = ("summary", "report")
MARKER = "bench-analysis.json"


def _jobprof() -> Path:
    return Path(sys.executable).with_name("jobprof")


def _available() -> set[str]:
    """The installed ``jobprof``'s commands, from its usage line ("{check,plugins,...}"): one
    start-up, however many commands are asked about."""
    proc = subprocess.run([str(_jobprof()), "--help"], env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    found = re.search(r"\{([a-z0-9_,-]+)\}", proc.stdout)
    if proc.returncode != 0 or not found:
        raise HarnessError(f"`jobprof --help` did not list its commands:\n{proc.stdout}{proc.stderr}")
    return set(found.group(1).split(","))


def _raw_records(prof: Path) -> dict[str, int]:
    """Raw records per stream over every device: what summary and report read."""
    from jobprof.files import rawstore
    from jobprof.files.profdir import device_dirs

    counts: dict[str, int] = {}
    for device in device_dirs(prof):
        for _, streams in rawstore.read(device):
            for stream, records in streams.items():
                counts[stream] = counts.get(stream, 0) + len(records)
    return counts


def generate(cache: Path, iterations: int, ranks: int) -> dict[str, Any]:
    """The cached profile's description (``prof``, ``generate_s``, ``raw_records``), made if absent."""
    spec = json.dumps([iterations, ranks, BATCH, OPTIONS], sort_keys=True)
    key = hashlib.sha1(spec.encode()).hexdigest()[:8]
    folder = cache / f"ddp_{ranks}x{iterations}_{key}"
    marker = folder / MARKER
    if marker.exists():
        meta = json.loads(marker.read_text())
        if Path(meta["prof"]).is_dir():
            return {**meta, "cached": True}
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out = folder / "prof"
    env = clean_env({"PROFILING_MODE": "true",
                     "PROFILING_OPTIONS": json.dumps({"output": str(out), "export": "inline", **OPTIONS})})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={ranks}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(JOB),
           "--steps", str(iterations), "--batch", str(BATCH)]
    began = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(folder), capture_output=True, text=True, timeout=3600)
    took = time.perf_counter() - began
    if proc.returncode != 0:
        raise HarnessError(f"generating the profile failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    found = sorted(out.glob("PROF_*"))
    if len(found) != 1 or len(list(found[0].glob("device_*"))) != ranks:
        raise HarnessError(f"expected one PROF_ folder with {ranks} devices under {out}, found {found}")
    meta = {"prof": str(found[0]), "iterations": iterations, "ranks": ranks, "options": OPTIONS,
            "generate_s": took, "raw_records": _raw_records(found[0]),
            "bytes": sum(p.stat().st_size for p in found[0].rglob("*") if p.is_file())}
    marker.write_text(json.dumps(meta, indent=1))
    return {**meta, "cached": False}


#: runs ``jobprof <args>`` and reports its own peak RSS at exit.  Not ``wait4``'s ru_maxrss: Linux
#: carries the parent's high-water mark across fork and exec into it, so a harness that imported
#: torch would floor every child at its own size; VmHWM is the exec'd process's own.
_MEASURED = ("import atexit, sys\n"
             "def hwm():\n"
             "    for line in open('/proc/self/status'):\n"
             "        if line.startswith('VmHWM:'):\n"
             "            sys.stderr.write('jobprof-bench-vmhwm-kb %s\\n' % line.split()[1])\n"
             "atexit.register(hwm)\n"
             "from jobprof.cli.main import main\n"
             "sys.argv[0] = 'jobprof'\n"
             "sys.exit(main(sys.argv[1:]))\n")


def _timed(cmd: list[str], cwd: Path) -> dict[str, Any]:
    """One child run: wall s, CPU s (``os.wait4``), its own peak RSS (MB, VmHWM), its stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        began = time.perf_counter()
        child = subprocess.Popen(cmd, env=clean_env(), cwd=str(cwd), stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - began
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if child.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)!r} exited {child.returncode}:\n{stderr[-2000:]}")
    hwm = re.findall(r"jobprof-bench-vmhwm-kb (\d+)", stderr)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_mb": int(hwm[-1]) / 1024 if hwm else usage.ru_maxrss / 1024, "stdout": stdout}


def _commands(prof: Path, work: Path) -> dict[str, list[str] | None]:
    have = _available()
    run = [sys.executable, "-c", _MEASURED]  # what the console script runs, measuring itself
    commands = {"summary": [*run, "summary", "--json", str(prof)],
                "report": [*run, "report", str(prof), "-o", str(work / "x.html")],
                "merge": [*run, "merge", str(prof), "-o", str(work / "m.json")],
                "export": [*run, "export", "--layout", "cann8", str(prof)]}
    return {name: cmd if name in have else None for name, cmd in commands.items()}


def _events(stdout: str) -> int | None:
    """merge's own count of the events it wrote ("rank 0: 1234 events ...")."""
    found = [int(n) for n in re.findall(r"rank \d+: (\d+) events", stdout)]
    return sum(found) if found else None


def run(iterations: int, ranks: int, repeats: int, cache: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-analysis-") as tmp:
        work = Path(tmp)
        meta = generate(cache or work / "cache", iterations, ranks)
        prof = Path(meta["prof"])
        commands = _commands(prof, work)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, cmd in commands.items() if cmd}
        for _ in range(repeats):  # in turn, so slow drift of the machine spreads over all
            for name in runs:
                if name == "export" and runs[name]:
                    continue  # minutes per run, dominated by re-rendering every file: once is enough
                runs[name].append(_timed(commands[name], work))
    rows_n = meta["iterations"] * meta["ranks"]
    records = sum(meta["raw_records"].values())
    result: dict[str, Any] = {"profile": {k: v for k, v in meta.items()}, "repeats": repeats,
                              "skipped": [name for name, cmd in commands.items() if cmd is None],
                              "commands": {}}
    for name, tries in runs.items():
        wall = statistics.median(t["wall_s"] for t in tries)
        entry = {"wall_s": [t["wall_s"] for t in tries], "cpu_s": [t["cpu_s"] for t in tries],
                 "peak_mb": max(t["peak_mb"] for t in tries), "median_wall_s": wall,
                 "median_cpu_s": statistics.median(t["cpu_s"] for t in tries),
                 "rows_per_s": rows_n / wall}
        if name in ("summary", "report"):
            entry["records_per_s"] = records / wall
        if name == "merge":
            events = _events(tries[0]["stdout"])
            entry["events"] = events
            entry["events_per_s"] = events / wall if events else None
        result["commands"][name] = entry
    return result


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    prof = result["profile"]
    size = f"{prof['iterations']} it x {prof['ranks']} ranks"
    full = (prof["iterations"], prof["ranks"]) == (ITERATIONS, RANKS)
    out = []
    for name, c in result["commands"].items():
        rate = f"{c['rows_per_s']:,.0f} rows/s"
        if "records_per_s" in c:
            rate += f", {c['records_per_s']:,.0f} raw records/s"
        if c.get("events_per_s"):
            rate += f", {c['events_per_s']:,.0f} events/s"
        targeted = name in TARGETED
        time_word = ("pass" if c["median_wall_s"] <= TARGET_S else "FAIL") if targeted else "info"
        mem_word = ("pass" if c["peak_mb"] < TARGET_MB else "FAIL") if targeted else "info"
        if targeted and not full:  # the targets are for 1,000 x 4; a smaller profile is indicative
            time_word, mem_word = f"({time_word})", f"({mem_word})"
        out.append({"benchmark": f"analysis: jobprof {name}, {size}: wall s (start-up included)",
                    "baseline": f"{prof['iterations'] * prof['ranks']} rows",
                    "profiled": f"{c['median_wall_s']:.2f} s (CPU {c['median_cpu_s']:.2f} s)",
                    "delta / ratio": rate,
                    "spread": f"{len(c['wall_s'])} runs {min(c['wall_s']):.2f} .. {max(c['wall_s']):.2f} s",
                    "target": f"<= {TARGET_S:.0f} s" if targeted else "-", "result": time_word})
        out.append({"benchmark": f"analysis: jobprof {name}, {size}: peak RSS of the child",
                    "baseline": "-", "profiled": f"{c['peak_mb']:.0f} MB", "delta / ratio": "-",
                    "spread": "max over runs", "target": f"< {TARGET_MB:.0f} MB" if targeted else "-",
                    "result": mem_word})
    return out


def notes(result: dict[str, Any]) -> list[str]:
    prof = result["profile"]
    lines = [f"analysis: profile {'reused from the cache' if prof['cached'] else 'generated'} "
             f"({prof['generate_s']:.0f} s to generate, {prof['bytes'] / 1e6:.0f} MB, raw records "
             + ", ".join(f"{k} {v:,}" for k, v in sorted(prof["raw_records"].items())) + f"): {prof['prof']}"]
    if (prof["iterations"], prof["ranks"]) != (ITERATIONS, RANKS):
        lines.append(f"analysis: targets are for {ITERATIONS} it x {RANKS} ranks; "
                     "results in ( ) are indicative")
    for name in result["skipped"]:
        lines.append(f"analysis: jobprof {name} is not available in this install: not measured")
    return lines


def hotspots(prof: Path, top: int = 15) -> str:
    """cProfile of ``jobprof summary --json`` in this process: the functions with the most own time
    and the jobprof functions with the most cumulative time."""
    from jobprof.cli.main import main

    profiler = cProfile.Profile()
    sink = io.StringIO()
    stdout, sys.stdout = sys.stdout, sink
    try:
        profiler.runcall(main, ["summary", "--json", str(prof)])
    finally:
        sys.stdout = stdout
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"jobprof|/core/|/plugins/", top)
    return text.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ITERATIONS} iterations x {QUICK_RANKS} ranks, 1 run per command")
    parser.add_argument("--cache", type=Path, help="keep the generated profile here (reused next time)")
    parser.add_argument("--repeats", type=int, help="runs per command (default 3, quick 1)")
    parser.add_argument("--hotspots", action="store_true",
                        help="also cProfile `jobprof summary --json` on the profile and print the "
                        "top functions")
    args = parser.parse_args()
    iterations, ranks = (QUICK_ITERATIONS, QUICK_RANKS) if args.quick else (ITERATIONS, RANKS)
    try:
        result = run(iterations, ranks, max(args.repeats or (1 if args.quick else 3), 1), args.cache)
    except HarnessError as exc:
        print(f"bench: harness failure: {exc}", file=sys.stderr)
        return 2
    from tabulate import tabulate

    print(tabulate(rows(result), headers="keys", tablefmt="github"))
    for line in notes(result):
        print(f"- {line}")
    if args.hotspots:
        if args.cache is None:
            print("- --hotspots needs --cache (the profile is gone otherwise)")
        else:
            print(hotspots(Path(result["profile"]["prof"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
