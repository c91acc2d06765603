"""``jobprof import`` against HTA on the same files, interleaved: events per second and peak memory.

Arms per input and round, alternating: ``jobprof import`` (every file written: op_summary,
task_time, timelines, hccl, facts; ``--jobs 1``, and ``--jobs 2`` for a folder of ranks) and HTA
0.5's ``TraceAnalysis(trace_dir)`` + ``get_temporal_breakdown()`` (a subprocess each; HTA's own
parse runs one process per rank).  Peak RSS of each child: its own VmHWM as it exits
(``common.own_peak_env``; the largest of it and the Python processes it spawns: a forked worker,
as HTA's, reports none).

Inputs: the real A100 NCCL trace (``tests/data/hta``, 40,573 events), HTA's 2-rank sampled
traces (a folder of ranks), and a large trace made of the NCCL trace's own steps repeated
(``--big-copies`` times, shifted in time, steps and correlation ids renumbered: real events, more
of them) for the memory target.

Targets: events/s per core at least HTA's (ratio >= 1); peak RSS at most 3x the largest trace's
uncompressed size (on the large trace: smaller ones sit under the interpreter's own footprint).

    python bench/importing.py [--rounds 3] [--big-copies 12]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import own_peak_env, own_peak_kb

ROOT = Path(__file__).resolve().parent.parent
HTA = ROOT / "tests" / "data" / "hta"
NCCL = HTA / "nccl_parser_config_nccl_data.json.gz"
SAMPLED = HTA / "trace_filter_sampled"
TARGETS = {"rate": 1.0, "rss": 3.0}
HTA_CODE = """
import sys, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
"""


def big_trace(copies: int, out: Path) -> Path:
    """The NCCL trace's events ``copies`` times over, each copy after the last in time, its
    ProfilerStep numbers and correlation / external ids renumbered; written gzip'd."""
    trace = json.loads(gzip.decompress(NCCL.read_bytes()))
    events = trace["traceEvents"]
    timed = [e for e in events if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    steps = sorted({int(e["name"].split("#")[1]) for e in timed if e["name"].startswith("ProfilerStep#")})
    every: list[dict[str, Any]] = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        for e in events:
            if e.get("ph") == "M":
                continue
            c = dict(e)
            if "ts" in c:
                c["ts"] = c["ts"] + k * span
            args = c.get("args")
            if isinstance(args, dict):
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += k * 10_000_000
                c["args"] = args
            if isinstance(c.get("id"), int):
                c["id"] += k * 10_000_000
            name = c.get("name", "")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * len(steps)}"
            every.append(c)
    trace["traceEvents"] = every
    path = out / "big_rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode(), compresslevel=1))
    return path


def _child(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall s, peak RSS MB) of one child process."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {err[-2000:]}")
    own = own_peak_kb(err)  # wait4's ru_maxrss is floored at this harness's own size
    return wall, (own if own is not None else usage.ru_maxrss) / 1024


def _events(paths: list[Path]) -> tuple[int, int]:
    """(events, uncompressed bytes of the largest file), counted in a child: a child the bench
    starts later is forked from this process, and ``ru_maxrss`` counts the pages it had then."""
    code = ("import gzip, json, sys\n"
            "sizes = [len(gzip.decompress(open(p, 'rb').read())) for p in sys.argv[1:]]\n"
            "events = sum(len(json.loads(gzip.decompress(open(p, 'rb').read()))['traceEvents']) "
            "for p in sys.argv[1:])\n"
            "print(events, max(sizes))")
    done = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True,
                          check=True)
    events, largest = done.stdout.split()
    return int(events), int(largest)


def run(rounds: int, big_copies: int) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="jobprof-bench-import-"))
    try:
        inputs: dict[str, list[Path]] = {"nccl (A100, 1 rank)": [NCCL],
                                         "sampled (2 ranks)": sorted(SAMPLED.glob("*.json.gz"))}
        if big_copies:  # made in a child, for the reason _events gives
            subprocess.run([sys.executable, __file__, "--make-big", str(big_copies), str(scratch)],
                           check=True)
            inputs[f"nccl x{big_copies} (large)"] = [scratch / "big_rank0.json.gz"]
        env = own_peak_env({k: v for k, v in os.environ.items()
                            if not k.startswith(("PROFILING_", "JOBPROF_"))}, scratch / "peak")
        out: dict[str, Any] = {"rounds": rounds, "inputs": {}}
        for name, paths in inputs.items():
            folder = scratch / ("in-" + str(len(out["inputs"])))
            folder.mkdir()
            for p in paths:
                shutil.copy(p, folder)
            events, largest = _events(paths)
            arms: dict[str, list[tuple[float, float]]] = {"jobprof": [], "hta": []}
            if len(paths) > 1:
                arms["jobprof --jobs 2"] = []
            for r in range(rounds):
                for arm in (list(arms) if r % 2 == 0 else list(reversed(arms))):
                    if arm == "hta":
                        arms[arm].append(_child([sys.executable, "-c", HTA_CODE, str(folder)], env))
                        continue
                    dest = scratch / f"out-{name.split()[0]}-{arm.split()[-1]}-{r}"
                    jobs = "2" if arm.endswith("2") else "1"
                    arms[arm].append(_child([sys.executable, "-m", "jobprof.cli.main", "import", str(folder),
                                             "-o", str(dest), "--jobs", jobs], env))
                    shutil.rmtree(dest, ignore_errors=True)
            med = {arm: {"wall_s": statistics.median(w for w, _ in v),
                         "rss_mb": statistics.median(m for _, m in v)} for arm, v in arms.items()}
            for arm in med.values():
                arm["events_per_s"] = events / arm["wall_s"]
            out["inputs"][name] = {"events": events, "largest_mb": largest / 1e6, "median": med,
                                   "raw": {arm: v for arm, v in arms.items()},
                                   "rate_ratio": med["jobprof"]["events_per_s"] / med["hta"]["events_per_s"],
                                   "rss_per_size": med["jobprof"]["rss_mb"] / (largest / 1e6)}
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    table = []
    for name, r in result["inputs"].items():
        m = r["median"]
        ratio = r["rate_ratio"]
        table.append({
            "benchmark": f"import: {name}, events/s jobprof / HTA ({r['events']:,} events, "
                         f"{result['rounds']} rounds)",
            "baseline": f"{m['hta']['events_per_s']:,.0f}/s HTA ({m['hta']['wall_s']:.2f} s)",
            "profiled": f"{m['jobprof']['events_per_s']:,.0f}/s ({m['jobprof']['wall_s']:.2f} s)"
                        + (f"; --jobs 2 {m['jobprof --jobs 2']['wall_s']:.2f} s"
                           if "jobprof --jobs 2" in m else ""),
            "delta / ratio": f"{ratio:.2f}", "spread": "", "target": f">= {TARGETS['rate']}",
            "result": "pass" if ratio >= TARGETS["rate"] else "FAIL"})
        if name.endswith("(large)"):
            per = r["rss_per_size"]
            table.append({
                "benchmark": f"import: {name}, peak RSS / largest trace's uncompressed size",
                "baseline": f"{r['largest_mb']:.0f} MB trace, HTA {m['hta']['rss_mb']:.0f} MB",
                "profiled": f"{m['jobprof']['rss_mb']:.0f} MB", "delta / ratio": f"{per:.2f}", "spread": "",
                "target": f"<= {TARGETS['rss']}", "result": "pass" if per <= TARGETS["rss"] else "FAIL"})
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big-copies", type=int, default=12)
    parser.add_argument("--make-big", nargs=2, metavar=("COPIES", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_big:
        big_trace(int(args.make_big[0]), Path(args.make_big[1]))
        return
    result = run(args.rounds, args.big_copies)
    for row in rows(result):
        print(" | ".join(str(row[k]) for k in ("benchmark", "baseline", "profiled", "delta / ratio", "target",
                                              "result")))


if __name__ == "__main__":
    main()
