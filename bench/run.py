"""jobprof benchmark harness: unprofiled vs profiled, interleaved in the same run.

    python bench/run.py [--quick] [--only NAME[,NAME...]] [--json out.json]

NAME: startup steps tier hotpath dp mstx ddp hccl-cost optier optier-memory optier-vs-torch
memory dynamic steptier mechanisms fusion-op export bigop analysis import (optier-memory and
fusion-op: full runs, or by name)

Prints ratios and deltas with their spread; never asserts absolute times, and exits 0 whatever
the figures are (it measures, CI does not gate on it).  Exit 2 means the harness itself could
not measure (a child run failed, the .pth is not installed, ...).  See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import analysis
import bigop
import ddp
import dp
import dynamic
import export_rate
import fusion_op
import hotpath
import importing
import mechanisms
import memory
import mstx
import optier
import optier_vs_torch
import startup  # bench/ is sys.path[0] when run as a script
import steps
import steptier
from tabulate import tabulate

from common import HarnessError, cpu_snapshot, foreign_share


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "executable": sys.executable,
            "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": _version("torch"), "jobprof": _version("jobprof")}


FOREIGN_WARN = 0.10


@contextmanager
def measured() -> Iterator[dict[str, Any]]:
    """Collects a benchmark's result with its duration and the CPU share of other processes."""
    result: dict[str, Any] = {}
    began, before = time.perf_counter(), cpu_snapshot()
    yield result
    result["elapsed_s"] = time.perf_counter() - began
    result["foreign_cpu_share"] = foreign_share(before, cpu_snapshot())


NAMES = ("startup", "steps", "tier", "hotpath", "dp", "mstx", "ddp", "hccl-cost", "optier", "optier-memory",
         "optier-vs-torch", "memory", "dynamic", "steptier", "mechanisms", "fusion-op", "export", "analysis",
         "bigop", "import")


def _names(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(NAMES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown benchmark(s): {', '.join(unknown) or '(none)'}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (CI)")
    parser.add_argument("--only", type=_names, metavar="NAME[,NAME...]",
                        help=f"run these benchmarks ({', '.join(NAMES)}; optier-memory and fusion-op: "
                        "full runs only, or by name)")
    parser.add_argument("--json", metavar="FILE", help="write the raw numbers as JSON here")
    parser.add_argument("--startup-repeats", type=int,
                        help="starts per case (default 40, quick 20, at least 20)")
    parser.add_argument("--step-repeats", type=int, help="run pairs (default 7, quick 3)")
    parser.add_argument("--steps", type=int, default=steps.STEPS, help="steps per example run")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the example")
    parser.add_argument("--steps-options", type=json.loads, metavar="JSON",
                        help="PROFILING_OPTIONS of the profiled arm, without output (to locate "
                        f"an overhead; default {json.dumps(steps.OPTIONS)})")
    parser.add_argument("--ddp-repeats", type=int, help="ddp rounds of 2 arms (default 7, quick 3)")
    parser.add_argument("--ddp-steps", type=int, help=f"steps per ddp run (default {ddp.STEPS}, quick 80)")
    parser.add_argument("--ddp-options", type=json.loads, metavar="JSON",
                        help="PROFILING_OPTIONS of the ddp profiled arm, without output (to locate an "
                        f"overhead; default {json.dumps(ddp.OPTIONS)})")
    parser.add_argument("--hccl-calls", type=int, help="hccl-cost: collectives per round and arm "
                        f"(default {ddp.COST_CALLS}, quick 5000)")
    parser.add_argument("--hccl-rounds", type=int, help="hccl-cost: pairs of rounds (default 7, quick 3)")
    parser.add_argument("--optier-repeats", type=int, help="optier rounds of 4 arms (default 7, quick 2)")
    parser.add_argument("--optier-steps", type=int, help=f"steps per optier run (default {optier.STEPS}, "
                        "quick 50)")
    parser.add_argument("--ovt-rounds", type=int, help="optier-vs-torch rounds of 7 arms per workload "
                                                       "(default 3, quick 1)")
    parser.add_argument("--fusion-rounds", type=int, help="fusion-op rounds of 4 arms (default 3, quick 1)")
    parser.add_argument("--fusion-steps", type=int, help="fusion-op steps per run (default 60, quick 30)")
    parser.add_argument("--memory-rounds", type=int, help="memory rounds of 7 arms (default 3, quick 1)")
    parser.add_argument("--memory-steps", type=int, help="memory steps per run (default 60, quick 30)")
    parser.add_argument("--dynamic-rounds", type=int, help="dynamic rounds of 5 arms (default 3, quick 1)")
    parser.add_argument("--steptier-rounds", type=int, help="steptier rounds of its arms on the transformer "
                                                            "(default 6, quick 2)")
    parser.add_argument("--steptier-steps", type=int, default=150,
                        help="steptier steps per run (default 150)")
    parser.add_argument("--ovt-steps", type=int, help="optier-vs-torch steps per run (default 60, quick 30)")
    parser.add_argument("--optier-metrics", action="store_true",
                        help="optier: also jobprof with aic_metrics PipeUtilization vs torch.profiler "
                        "with_flops (needs a plugin answering that group)")
    parser.add_argument("--export-iterations", type=int,
                        help="iterations of the profile export re-renders (default 100, quick 20; "
                        "quick leaves out the aic_metrics case)")
    parser.add_argument("--bigop-rounds", type=int, help="bigop rounds of 4 arms (default 3, quick 1)")
    parser.add_argument("--bigop-operators", type=int, default=200_000,
                        help="bigop: operators in the big iteration (default 200000)")
    parser.add_argument("--import-rounds", type=int, help="import: rounds of its arms (default 3, quick 1)")
    parser.add_argument("--import-copies", type=int,
                        help="import: the large trace is the NCCL trace's steps this many times (default 12, "
                             "quick 0: none)")
    parser.add_argument("--analysis-cache", metavar="DIR",
                        help="analysis: keep the generated profile here and reuse it (default: a temp dir)")
    parser.add_argument("--analysis-repeats", type=int,
                        help="analysis: runs per command (default 3, quick 1)")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {"machine": machine(), "mode": "quick" if args.quick else "full"}
    table: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        if args.only is None or "startup" in args.only:
            n = args.startup_repeats or (20 if args.quick else 40)
            with measured() as result:
                result.update(startup.run(max(n, 20)))  # fewer than 20: no median worth having
            report["startup"] = result
            table += startup.rows(result)
            notes += [f"startup: verified: {c}" for c in result["checks"]]
        if args.only is None or "steps" in args.only:
            n = max(args.step_repeats or (3 if args.quick else 7), 2)  # a spread needs two
            with measured() as result:
                result.update(steps.run(n, steps=args.steps, workers=args.workers,
                                        options=args.steps_options))
            report["steps"] = result
            table += steps.rows(result)
            notes.append(f"steps: every profiled run profiled ({args.steps} steps each): raw "
                         f"iterations per run {result['raw_iterations_per_run']}, step_trace "
                         f"csv {result['step_trace_csv_per_run']}, "
                         f"json {result['step_trace_json_per_run']}")
            notes += [f"steps: profiled stderr: {s}" for s in result["profiled_stderr"]]
        if args.only is None or "tier" in args.only:  # the step tier a user leaves on for a whole run
            n = max(args.step_repeats or (3 if args.quick else 7), 2)
            with measured() as result:
                result.update(steps.run(n, steps=args.steps, workers=args.workers,
                                        options=steps.TIER_OPTIONS))
            report["tier"] = result
            table += steps.rows(result)
            notes += [f"tier: profiled stderr: {s}" for s in result["profiled_stderr"]]
        if args.only is None or "dp" in args.only:
            with measured() as result:
                result.update(dp.run(3 if args.quick else 7))
            report["dp"] = result
            table += dp.rows(result)
        if args.only is None or "mstx" in args.only:
            with measured() as result:
                result.update(mstx.run(calls=5_000 if args.quick else 20_000, rounds=2 if args.quick else 3))
            report["mstx"] = result
            table += mstx.rows(result)
        if args.only is None or "ddp" in args.only:
            n = max(args.ddp_repeats or (3 if args.quick else 7), 2)
            with measured() as result:
                result.update(ddp.run_steps(n, steps=args.ddp_steps or (80 if args.quick else ddp.STEPS),
                                            options=args.ddp_options))
            report["ddp"] = result
            table += ddp.rows_steps(result)
            notes += ddp.notes({"steps": result})
        if args.only is None or "hccl-cost" in args.only:
            with measured() as result:
                result.update(ddp.run_cost(args.hccl_calls or (5_000 if args.quick else ddp.COST_CALLS),
                                           max(args.hccl_rounds or (3 if args.quick else 7), 2)))
            report["hccl-cost"] = result
            table += ddp.rows_cost(result)
            notes += ddp.notes({"cost": result})
        if args.only is None or "hotpath" in args.only:
            with measured() as result:
                result.update(hotpath.run(args.steps, workers=args.workers))
            report["hotpath"] = result
            table += hotpath.rows(result)
            with measured() as result:
                result.update(hotpath.run(args.steps, workers=args.workers, options=steps.TIER_OPTIONS))
            report["hotpath_tier"] = result
            table += hotpath.rows(result)
        if args.only is None or "optier" in args.only:
            n = max(args.optier_repeats or (2 if args.quick else 7), 2)
            with measured() as result:
                result.update(optier.run(n, steps=args.optier_steps or (50 if args.quick else optier.STEPS),
                                         with_metrics=args.optier_metrics))
            report["optier"] = result
            table += optier.rows(result)
            notes += optier.notes(result)
        if args.only is None or "optier-vs-torch" in args.only:
            with measured() as result:
                quick = args.quick
                result.update(optier_vs_torch.run(args.ovt_rounds or (1 if quick else 3),
                                                  args.ovt_steps or (30 if quick else 60),
                                                  ("lm",) if quick else optier_vs_torch.WORKLOADS))
            report["optier-vs-torch"] = result
            table += optier_vs_torch.rows(result)
            notes += optier_vs_torch.notes(result)
        if args.only is None or "memory" in args.only:
            with measured() as result:
                result.update(memory.run(args.memory_rounds or (1 if args.quick else 3),
                                         args.memory_steps or (30 if args.quick else 60),
                                         ("lm",) if args.quick else memory.WORKLOADS))
            report["memory"] = result
            table += memory.rows(result)
        if args.only is None or "dynamic" in args.only:
            with measured() as result:
                result.update(dynamic.run(args.dynamic_rounds or (1 if args.quick else 3), args.steps))
            report["dynamic"] = result
            table += dynamic.rows(result)
            notes += [f"dynamic: stderr: {s}" for s in result["stderr"]]
        if args.only is None or "steptier" in args.only:
            with measured() as result:
                result.update(steptier.run(args.steptier_rounds or (2 if args.quick else 6),
                                           args.steptier_steps))
            report["steptier"] = result
            table += steptier.rows(result)
            notes += [f"steptier: stderr: {s}" for s in result["stderr"]]
        if args.only is None or "mechanisms" in args.only:
            with measured() as result:
                result.update(mechanisms.run(reps=5 if args.quick else 15))
            report["mechanisms"] = result
            table += mechanisms.rows(result)
        # 4 arms each compiling cold (2.5 minutes even quick): full runs only, or by name
        if (args.only is None and not args.quick) or "fusion-op" in (args.only or ()):
            with measured() as result:
                result.update(fusion_op.run(args.fusion_rounds or (1 if args.quick else 3),
                                            args.fusion_steps or (30 if args.quick else 60)))
            report["fusion-op"] = result
            table += fusion_op.rows(result)
        if (args.only is None and not args.quick) or "optier-memory" in (args.only or ()):  # heavy: minutes
            with measured() as result:
                result.update(optier.run_memory())
            report["optier-memory"] = result
            table += optier.memory_rows(result)
        if args.only is None or "export" in args.only:
            with measured() as result:
                result.update(export_rate.run(args.export_iterations or (20 if args.quick else 100),
                                              passes=2 if args.quick else 3, with_metrics=not args.quick))
            report["export"] = result
            table += export_rate.rows(result)
            notes += export_rate.notes(result)
        if args.only is None or "bigop" in args.only:
            with measured() as result:
                result.update(bigop.run(args.bigop_rounds or (1 if args.quick else 3), args.bigop_operators))
            report["bigop"] = result
            table += bigop.rows(result)
        if args.only is None or "import" in args.only:
            with measured() as result:
                result.update(importing.run(args.import_rounds or (1 if args.quick else 3),
                                            args.import_copies if args.import_copies is not None
                                            else (0 if args.quick else 12)))
            report["import"] = result
            table += importing.rows(result)
        if args.only is None or "analysis" in args.only:
            with measured() as result:
                its, ranks = ((analysis.QUICK_ITERATIONS, analysis.QUICK_RANKS) if args.quick
                              else (analysis.ITERATIONS, analysis.RANKS))
                repeats = max(args.analysis_repeats or (1 if args.quick else 3), 1)
                result.update(analysis.run(its, ranks, repeats,
                                           Path(args.analysis_cache) if args.analysis_cache else None))
            report["analysis"] = result
            table += analysis.rows(result)
            notes += analysis.notes(result)
    except (HarnessError, RuntimeError) as exc:
        print(f"bench: harness failure: {exc}", file=sys.stderr)
        return 2
    for name in ("startup", "steps", "tier", "dp", "mstx", "ddp", "hccl-cost", "hotpath", "hotpath_tier",
                 "optier", "optier-memory", "memory", "steptier", "mechanisms", "fusion-op", "export",
                 "bigop", "analysis"):
        share = report.get(name, {}).get("foreign_cpu_share")
        if share is not None:
            # interleaving cancels slow drift, not a machine kept busy by other work
            warn = "WARNING: " if share > FOREIGN_WARN else ""
            notes.append(f"{warn}{name}: other processes used {share:.0%} of the machine's CPU "
                         f"time meanwhile{'; treat its figures as rough' if warn else ''}")

    took = [f"{name} {report[name]['elapsed_s']:.0f} s" for name in report
            if isinstance(report[name], dict) and "elapsed_s" in report[name]]
    notes.append("time per benchmark: " + ", ".join(took))
    if args.quick and args.only is None:
        notes.append("fusion-op and optier-memory: full runs only (bench/run.py without --quick)")
    print(tabulate(table, headers="keys", tablefmt="github"))
    for note in notes:
        print(f"- {note}")
    print("- figures are medians of interleaved A/B runs on this machine; "
          "pass/FAIL compares them with the targets and never changes the exit code")
    if args.json:
        report["table"] = table
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
        print(f"- raw numbers: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
