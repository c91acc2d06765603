"""fusion_op: what the plugin costs on a compiled job, and what ``kernels`` (Inductor's
``cpp.enable_kernel_profile``: a different compile) costs on top.

Workload: bench/_compiled_job.py (a torch.compile'd 2-layer transformer LM, fixed shapes).  Arms,
one process each, order rotated every round, each with its own Inductor cache folder (warm after
the first round):

* ``base``: unprofiled;
* ``off``: training_trace + task_trace on, ``fusion_op: off``;
* ``on``: the same with ``fusion_op: on`` (the default);
* ``kernels``: ``fusion_op: kernels``.

Rows (t = median steady-state step time of an arm in a round, the first WARMUP steps left out;
ratios per round, then the median over rounds): ``t_on / t_off`` <= 1.02 (the plugin itself: a
wrapper at compile time, a parse on the sink thread, the per-task join at export);
``t_kernels / t_on`` (information: the price of timing every C++ kernel); ``t_off / t_base``
(information: the operator tier on a compiled job).  Printed whatever the outcome.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import clean_env, timed_run
from common import table_row as _row

JOB = Path(__file__).resolve().parent / "_compiled_job.py"
ARMS = ("base", "off", "on", "kernels")
WARMUP = 10
TARGET_ON = 1.02
_TIER = {"training_trace": "on", "task_trace": "on"}
OPTIONS = {"off": {**_TIER, "fusion_op": "off"}, "on": {**_TIER, "fusion_op": "on"},
           "kernels": {**_TIER, "fusion_op": "kernels"}}


def run(rounds: int, steps: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="jobprof-bench-fusion-"))
    medians: dict[str, list[float]] = {arm: [] for arm in ARMS}
    losses: dict[str, set[str]] = {arm: set() for arm in ARMS}
    try:
        for r in range(rounds):
            for k in range(len(ARMS)):
                arm = ARMS[(r + k) % len(ARMS)]
                timings = work / f"{arm}{r}.json"
                env = {"TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{arm}")}
                if arm != "base":
                    env["PROFILING_MODE"] = "true"
                    env["PROFILING_OPTIONS"] = json.dumps({"output": str(work / f"prof-{arm}{r}"),
                                                           "export": "inline", **OPTIONS[arm]})
                done = timed_run([sys.executable, str(JOB), "--steps", str(steps), "--timings", str(timings)],
                                 clean_env(env), cwd=str(work))
                times = json.loads(timings.read_text())[WARMUP:]
                medians[arm].append(statistics.median(times) * 1000)
                losses[arm].update(x for x in done.stdout.splitlines() if x.startswith("final loss"))
                shutil.rmtree(work / f"prof-{arm}{r}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(medians[a], medians[b], strict=True))

    return {"rounds": rounds, "steps": steps, "median_step_ms": medians,
            "on_vs_off": ratio("on", "off"), "kernels_vs_on": ratio("kernels", "on"),
            "off_vs_base": ratio("off", "base"),
            "same_loss": len(set().union(*losses.values())) == 1}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    m = {arm: statistics.median(v) for arm, v in result["median_step_ms"].items()}
    shape = f"({result['rounds']} rounds x {result['steps']} steps, compiled LM)"
    on = result["on_vs_off"]
    return [
        _row(f"fusion_op: step time, fusion_op on / off {shape}", f"{m['off']:.2f} ms off",
             f"{m['on']:.2f} ms", f"x{on:.3f}", f"<= x{TARGET_ON}", on <= TARGET_ON),
        _row("fusion_op: step time, kernels (enable_kernel_profile) / on", f"{m['on']:.2f} ms on",
             f"{m['kernels']:.2f} ms", f"x{result['kernels_vs_on']:.3f}", "-", None),
        _row("fusion_op: step time, operator tier (fusion_op off) / unprofiled", f"{m['base']:.2f} ms base",
             f"{m['off']:.2f} ms", f"x{result['off_vs_base']:.3f}", "-", None),
        _row("fusion_op: final loss identical in every arm", "base", "all arms",
             "same" if result["same_loss"] else "DIFFERENT", "same", result["same_loss"]),
    ]
