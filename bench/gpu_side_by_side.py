"""gpu-side-by-side: jobprof against torch.profiler on a CUDA transformer LM, one table.

    python bench/gpu_side_by_side.py [--rounds 3] [--steps 50] [--budget-s 200] [--json out.json]
    python bench/gpu_side_by_side.py --device cpu --quick      # dry run anywhere (tiny model)

Job: bench/_cuda_lm_job.py (4-layer transformer LM, d=512, batch 16 x 256, AdamW, fp32; each
step ends with ``torch.cuda.synchronize()``).  Arms, each its own process, order rotated every
round so GPU clock and cache drift spread over all of them:

* ``base``: unprofiled;
* ``step``: jobprof's step tier (training_trace, dp, msproftx; task_trace off);
* ``l1``: jobprof's operator tier (training_trace, task_trace on = l1, aicpu);
* ``torch``: torch.profiler (CPU + CUDA, record_shapes), a Chrome trace per step, its
  ``prof.step()`` inside the timed step.

Per arm: the median step time past the warm-up (median of the rounds' medians), overhead vs
base, that overhead as a share of torch.profiler's (``(t - t_base) / (t_torch - t_base)``, per
round, then the median), the whole process's wall seconds (start-up and jobprof's exit-time
export included), and what it wrote (step_trace / op_summary files per iteration, or trace files).

``--budget-s``: no new round starts once the rounds so far say it would end past the budget, and
no run starts or outlives it, so the table comes out inside a fixed time (tests/gpu/check.sh
gives it ~3 minutes).  A failed run is reported in its row and the other arms go on.  Exit 0
whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, timed_run

JOB = Path(__file__).resolve().parent / "_cuda_lm_job.py"
ARMS = ("base", "step", "l1", "torch")
OPTIONS = {
    # task_trace defaults to on (msprof's default): the step tier says off
    "step": {"training_trace": "on", "dp": "on", "msproftx": "on", "task_trace": "off"},
    "l1": {"training_trace": "on", "task_trace": "on", "aicpu": "on"},
}
DESCRIBE = {"base": "unprofiled", "step": "jobprof step tier (training_trace, dp, msproftx)",
            "l1": "jobprof operator tier (training_trace, task_trace l1, aicpu)",
            "torch": "torch.profiler ({}, record_shapes), a trace per step"}


def _env(arm: str, out: Path) -> tuple[dict[str, str], list[str]]:
    if arm == "base":
        return clean_env(), []
    if arm == "torch":
        return clean_env({"KINETO_LOG_LEVEL": "6"}), ["--torch-profiler", str(out)]
    options = json.dumps({"output": str(out), "export": "inline", **OPTIONS[arm]})
    return clean_env({"PROFILING_MODE": "true", "PROFILING_OPTIONS": options}), []


def _count(out: Path, pattern: str) -> int:
    return sum(1 for _ in out.glob(pattern)) if out.exists() else 0


def _written(arm: str, out: Path) -> dict[str, int]:
    """What the arm left on disk: jobprof's per-iteration files, or torch.profiler's traces."""
    if arm == "torch":
        return {"traces": _count(out, "trace_*.json")}
    if arm in OPTIONS:
        summary = "PROF_*/device_*/summary"
        return {"step_trace": _count(out, f"{summary}/step_trace_*.csv"),
                "op_summary": _count(out, f"{summary}/op_summary_*.csv")}
    return {}


def one(work: Path, arm: str, tag: str, args: argparse.Namespace, timeout: float) -> dict[str, Any]:
    """One process of one arm: its step times, wall time and files, or its error."""
    out = work / tag
    env, extra = _env(arm, out)
    timings = work / f"{tag}.json"
    cmd = [sys.executable, str(JOB), "--device", args.device, "--steps", str(args.steps),
           "--timings", str(timings), *(["--quick"] if args.quick else []), *extra]
    try:
        ran = timed_run(cmd, env, cwd=str(work), timeout=timeout)
        times = json.loads(timings.read_text())
        if len(times) != args.steps:
            raise HarnessError(f"{len(times)} step times, {args.steps} expected")
    except Exception as exc:  # a failed or hung arm is a row of the table, not the end of it
        return {"error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
    finally:
        written = _written(arm, out)
        shutil.rmtree(out, ignore_errors=True)  # a per-step CUDA trace set is hundreds of MB
    return {"step_s": statistics.median(times[args.warmup:]), "wall_s": ran.wall_s, "written": written,
            # jobprof's own lines (warnings, notes) and the job's last line, for the logs
            "jobprof_lines": [x for x in ran.stderr.splitlines() if x.startswith("jobprof:")][:20],
            "job_line": (ran.stdout.strip().splitlines() or [""])[-1]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.perf_counter()
    rounds: list[dict[str, dict[str, Any]]] = []
    note = ""

    def result() -> dict[str, Any]:
        out = {"device": args.device, "quick": args.quick, "steps": args.steps, "warmup": args.warmup,
               "rounds": rounds, "note": note, "seconds": time.perf_counter() - began}
        out["rows"] = rows(out)
        return out

    def left() -> float:
        return args.budget_s - (time.perf_counter() - began)

    with tempfile.TemporaryDirectory(prefix="jobprof-gpu-sbs-") as tmp:
        for i in range(args.rounds):
            longest = max((r["_s"] for r in rounds), default=0.0)
            if rounds and longest > left():
                note = f"stopped after {len(rounds)} of {args.rounds} rounds: the next would pass --budget-s"
                break
            start = time.perf_counter()
            order = ARMS[i % len(ARMS):] + ARMS[:i % len(ARMS)]
            this: dict[str, Any] = {}
            for arm in order:
                # a hung run may take what is left of the budget, at most --run-timeout-s
                timeout = min(args.run_timeout_s, left())
                this[arm] = one(Path(tmp), arm, f"{arm}{i}", args, timeout) if timeout >= 10 else \
                    {"error": "not run: --budget-s spent"}
            this["_s"] = time.perf_counter() - start
            rounds.append(this)
            print(f"gpu-side-by-side: round {i + 1} in {this['_s']:.0f} s: "
                  + ", ".join(f"{a} {r['step_s'] * 1e3:.2f} ms" if "step_s" in r else f"{a} FAILED"
                              for a, r in this.items() if a != "_s"), file=sys.stderr, flush=True)
            if args.json:  # the rounds so far, should the caller's own time limit stop this one
                Path(args.json).write_text(json.dumps(result(), indent=1, default=str))
    return result()


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm (the table's figures), from the rounds where the arms it needs ran."""
    rounds = result["rounds"]
    ok = [{a: r[a] for a in ARMS if "step_s" in r.get(a, {})} for r in rounds]
    out = []
    for arm in ARMS:
        mine = [r[arm] for r in ok if arm in r]
        errors = [r[arm]["error"] for r in rounds if "error" in r.get(arm, {})]
        step = _median([m["step_s"] * 1e3 for m in mine])
        vs_base = _median([r[arm]["step_s"] / r["base"]["step_s"] for r in ok if arm in r and "base" in r])
        shares = [(r[arm]["step_s"] - r["base"]["step_s"]) / (r["torch"]["step_s"] - r["base"]["step_s"])
                  for r in ok if {arm, "base", "torch"} <= r.keys()
                  and r["torch"]["step_s"] > r["base"]["step_s"]]
        written: dict[str, list[int]] = {}
        for m in mine:
            for k, v in m["written"].items():
                written.setdefault(k, []).append(v)
        out.append({
            "arm": arm, "what": DESCRIBE[arm].format("CPU+CUDA" if result["device"] == "cuda" else "CPU"),
            "runs": f"{len(mine)}/{len(rounds)}",
            "step_ms": step, "vs_base": vs_base,
            "share_of_torch": _median(shares) if arm not in ("base", "torch") else None,
            "wall_s": _median([m["wall_s"] for m in mine]),
            "written": {k: min(v) for k, v in written.items()},  # the worst run's count
            "error": errors[0].splitlines()[-1][:300] if errors else "",
        })
    return out


def fmt(row: dict[str, Any], steps: int) -> dict[str, str]:
    """A row as text for the table (shared with tests/gpu/table.py)."""
    def num(v: float | None, f: str) -> str:
        return "-" if v is None else format(v, f)

    # jobprof's files are per iteration (of --steps); torch.profiler's per exported window
    files = ", ".join(f"{k} {v}" + (f"/{steps}" if k != "traces" else "")
                      for k, v in row["written"].items()) or "-"
    return {"arm": row["arm"], "what": row["what"], "runs ok": row["runs"],
            "median step ms": num(row["step_ms"], ".2f"),
            "vs unprofiled": "-" if row["vs_base"] is None else f"x{row['vs_base']:.3f}",
            "overhead / torch.profiler's": num(row["share_of_torch"], ".3f"),
            "process wall s": num(row["wall_s"], ".1f"), "files written": files,
            "error": row["error"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 rounds x 12 steps")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int, help="steps left out of each run's median")
    parser.add_argument("--budget-s", type=float, default=200.0, help="no run starts past this")
    parser.add_argument("--run-timeout-s", type=float, default=120.0, help="one process at most")
    parser.add_argument("--json", help="write the rounds and the rows here")
    args = parser.parse_args()
    defaults = (2, 12, 4) if args.quick else (3, 50, 10)
    args.rounds = args.rounds or defaults[0]
    args.steps = args.steps or defaults[1]
    args.warmup = defaults[2] if args.warmup is None else args.warmup
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    result = run(args)
    from tabulate import tabulate

    print(tabulate([fmt(r, args.steps) for r in result["rows"]], headers="keys", tablefmt="github"))
    if result["note"]:
        print(f"gpu-side-by-side: {result['note']}")
    print(f"gpu-side-by-side: {len(result['rounds'])} rounds x {args.steps} steps ({args.warmup} warm-up "
          f"left out), {args.device}{' quick' if args.quick else ''}, {result['seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
