"""hotpath: what jobprof adds to the training thread per step, timed inside a profiled run.

The A/B step benchmark compares whole runs; on a noisy 2-core VM its spread (±15%) hides a
2% effect.  This one times jobprof's own callbacks on the training thread of one profiled run
of the example (the iteration hand-over and the step detector's forward / backward /
optimizer callbacks) with perf_counter_ns wrappers, and divides their sum per step by the
median step.  It is a lower bound of the overhead: it cannot see the background thread's
share of the GIL and CPU (capped by design at 1% duty for export plus one batched raw write
every 0.1 s), nor the cost of PyTorch's slow path for the two hooked root modules.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, timed_run

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_mlp.py"
WARMUP_STEPS = 10

# Runs inside the profiled child: wrap the callbacks, run the example, print the timings.
_CHILD = r"""
import atexit, json, runpy, sys, threading, time
from jobprof.runtime import session as S, steps as D
timings = {}

def wrap(owner, name, key=None):
    original = owner.__dict__[name]
    key = key or name
    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            timings.setdefault(key, []).append(time.perf_counter_ns() - start)
    setattr(owner, name, timed)

wrap(S.Session, "on_iteration")
for name in ("_optimizer_pre", "_optimizer_post", "on_backward"):
    wrap(D.StepDetector, name)


def own_time(owner, name, key):
    # a plugin's class-level wrapper W around torch's original O: time W, time O inside it (by
    # swapping O in W's closure), keep W - O: what the probe itself costs the calling thread
    outer = owner.__dict__.get(name)
    inner = getattr(outer, "__wrapped__", None)
    cells = [c for c in (outer.__closure__ or ()) if c.cell_contents is inner] if inner else []
    if not cells:
        raise SystemExit(f"hotpath: {owner.__name__}.{name} is not wrapped by a plugin")
    # one slot per open W call (per thread): O's time is added to the innermost open W, so a
    # re-entrant W (a module call inside a module call) subtracts only its own O
    local = threading.local()

    def timed_inner(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return inner(*args, **kwargs)
        finally:
            local.stack[-1] += time.perf_counter_ns() - start

    cells[0].cell_contents = timed_inner

    def timed_outer(*args, **kwargs):
        stack = local.__dict__.setdefault("stack", [])
        stack.append(0)
        start = time.perf_counter_ns()
        try:
            return outer(*args, **kwargs)
        finally:
            elapsed = time.perf_counter_ns() - start
            timings.setdefault(key, []).append(elapsed - stack.pop())

    timed_outer.__wrapped__ = outer
    setattr(owner, name, timed_outer)


import torch  # the session starts here: the detector's and the plugins' wrappers are installed now
# the step detector's wrapper around every module call (its own time, torch's call excluded)
own_time(torch.nn.Module, "__call__", "module __call__")
if "dp" in sys.argv[1] or "msproftx" in sys.argv[1]:
    from torch.utils.data import dataloader as L
    if '"dp"' in sys.argv[1]:
        own_time(L._BaseDataLoaderIter, "__next__", "dp next()")
        own_time(L._MultiProcessingDataLoaderIter, "_process_data", "dp _process_data")
    if '"msproftx"' in sys.argv[1]:
        # msproftx sees record_function blocks through a descriptor on their ``record`` (no
        # wrapper of torch's code): its __set__ (a block opens) and __get__ (it ends) are all
        # jobprof's own
        from jobprof.plugin import blocks as B
        for name in ("__get__", "__set__"):
            wrap(B._RecordSlot, name, "msproftx record_function")
atexit.register(lambda: print("HOTPATH " + json.dumps(timings), file=sys.stderr))
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


OPTIONS = {"training_trace": "on", "task_trace": "off"}
#: timed but not on the training thread's bill: on_iteration runs inside _optimizer_post, the
#: plugins' deferred take() on the sink thread
OFF_THREAD = {"on_iteration", "take"}


def run(steps: int, workers: int = 2, options: dict[str, str] | None = None) -> dict[str, Any]:
    options = options or OPTIONS
    with tempfile.TemporaryDirectory(prefix="jobprof-hotpath-") as tmp:
        work = Path(tmp)
        child, times = work / "child.py", work / "steps.json"
        child.write_text(_CHILD)
        profiling = json.dumps({"output": str(work / "prof"), "export": "inline", **options})
        env = clean_env({"PROFILING_MODE": "true", "PROFILING_OPTIONS": profiling})
        out = timed_run([sys.executable, str(child), profiling, str(EXAMPLE), "--steps", str(steps),
                         "--workers", str(workers), "--timings", str(times)], env, cwd=tmp)
        line = next((ln for ln in out.stderr.splitlines() if ln.startswith("HOTPATH ")), None)
        if line is None or not times.exists():
            raise HarnessError(f"hotpath child did not report: {out.stderr[-2000:]}")
        timings = json.loads(line[len("HOTPATH "):])
        step_s = statistics.median(json.loads(times.read_text())[WARMUP_STEPS:])
    # steady state, like the step median: the first WARMUP_STEPS steps' share of each callback's
    # calls is dropped (they hold one-time costs: the PROF_ folder and metadata at the first
    # iteration, ~10 ms, would otherwise count as 50 us on every one of 200 steps)
    steady = steps - WARMUP_STEPS
    per_step_us = {name: sum(v[len(v) * WARMUP_STEPS // steps:]) / 1000 / steady
                   for name, v in timings.items()}
    # on_iteration runs inside _optimizer_post (the optimizer step ends the iteration)
    total_us = sum(us for name, us in per_step_us.items() if name not in OFF_THREAD)
    return {"options": options, "steps": steps, "median_step_ms": step_s * 1000, "per_step_us": per_step_us,
            "calls": {name: len(v) for name, v in timings.items()},
            "median_call_us": {name: statistics.median(v) / 1000 for name, v in timings.items()},
            "total_us_per_step": total_us, "share_of_step": total_us / (step_s * 1e6)}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    parts = ", ".join(f"{name} {us:.0f} us" for name, us in sorted(result["per_step_us"].items())
                      if name not in OFF_THREAD)
    parts += f" (of which on_iteration {result['per_step_us'].get('on_iteration', 0):.0f} us)"
    share = result["share_of_step"]
    tier = "training_trace" if result.get("options", OPTIONS) == OPTIONS else "step tier"
    return [{"benchmark": f"hotpath: jobprof on the training thread, per step ({tier})",
             "baseline": f"{result['median_step_ms']:.2f} ms",
             "profiled": f"+{result['total_us_per_step']:.0f} us",
             "delta / ratio": f"{share:.2%} of a step", "spread": parts, "target": "<= 2%",
             "result": "pass" if share <= 0.02 else "FAIL"}]
