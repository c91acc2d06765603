"""hccl: what capturing torch.distributed collectives costs, per DDP step and per collective.

Two benchmarks:

* ``ddp`` (step time): a 2-rank CPU gloo DistributedDataParallel job, started by this file with
  ``torch.multiprocessing.spawn`` (one thread per rank, a few-MB MLP whose gradients fill several
  DDP buckets, a fixed set of batches cycled), run unprofiled and profiled with
  ``{"training_trace": "on", "task_trace": "off", "hccl": "on"}``, interleaved over rounds (the
  order alternates AB, BA, ...).  Rank 0 times every step itself; the first steps are dropped and
  each run gives its median.  The figure is the ratio of the medians over all rounds (profiled /
  unprofiled), with the distribution-free CI of the per-round ratios.  Target: <= 1.02.  Proof of
  profiling: the profiled run wrote ``PROF_*/device_0/timeline/hccl_*.json``; one middle
  iteration's file is read to count the collectives per step (one per DDP bucket).
* ``hccl-cost`` (per collective): one child process, a gloo group of world size 1, K small
  synchronous ``dist.all_reduce(torch.ones(16))`` timed without and with the hccl ``Capture``
  installed, in alternating rounds; the same for ``async_op=True`` + ``wait()``.  The figure is
  the median of the per-pair differences (with - without), in µs per call, with its CI.  The
  hand-over (``take``, on jobprof's sink thread in a real run) is timed apart, per record.

Run as a script, this file is also the DDP job (``job``) and the cost child (``cost``); the
harness calls them in subprocesses so that its own process never holds torch.distributed state.
"""

from __future__ import annotations

import inspect
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, free_port, summary, timed_run, verdict

HERE = Path(__file__).resolve()
TARGET_RATIO = 1.02
WARMUP_STEPS = 10  # gloo's first rounds, DDP's bucket rebuild after step 1, allocator growth
STEPS = 200
WORLD = 2
OPTIONS = {"training_trace": "on", "task_trace": "off", "hccl": "on"}
#: the MLP: 512 -> 768 -> 768 -> 768 -> 10, 1.6 M parameters (6.3 MB of float32 gradients)
WIDTH_IN, WIDTH, CLASSES, BATCH, BATCHES = 512, 768, 10, 32, 8
#: DDP's default (25 MB) would put every gradient into one bucket; 1 MB gives 3 buckets here
#: (a bucket closes at the first parameter that takes it past the cap)
BUCKET_MB = 1
COST_CALLS = 20_000


# -- the DDP job (python bench/ddp.py job PORT STEPS TIMINGS) ------------------------------------
def _rank(rank: int, port: int, steps: int, timings: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # two ranks on two cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)  # identical replicas, as DDP's first broadcast would make them anyway
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(WIDTH_IN, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)),
        bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank + 1)
    data = [(torch.randn(BATCH, WIDTH_IN, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
            for _ in range(BATCHES)]
    stamps = [time.perf_counter()]
    for step in range(steps):
        x, y = data[step % BATCHES]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        stamps.append(time.perf_counter())
    if rank == 0:
        Path(timings).write_text(json.dumps([b - a for a, b in itertools.pairwise(stamps)]))
    dist.barrier()
    dist.destroy_process_group()


def job(port: int, steps: int, timings: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(port, steps, timings), nprocs=WORLD, join=True)


# -- the cost child (python bench/ddp.py cost CALLS ROUNDS) -----------------------------------------
def _drain(capture: Any, calls: int) -> list[dict[str, Any]]:
    """Every record of a round: ``take`` over all time, again while completion callbacks that
    wait for the GIL trail behind (5 s at most)."""
    params = inspect.signature(capture.take).parameters
    if len(params) >= 2:  # take(start_ns, end_ns)
        def take() -> list[dict[str, Any]]:
            return capture.take(0, 2**63)
    else:  # take(iteration)
        from jobprof.plugin.values import Iteration

        everything = Iteration(index=1, start_ns=0, end_ns=2**63, method="bench")

        def take() -> list[dict[str, Any]]:
            return capture.take(everything)
    records = take()
    deadline = time.monotonic() + 5
    while len(records) < calls and time.monotonic() < deadline:
        time.sleep(0.001)
        records += take()
    return records


def cost(calls: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from jobprof.plugins.hccl.capture import Capture

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    tensor = torch.ones(16)

    def sync(n: int) -> None:
        for _ in range(n):
            dist.all_reduce(tensor)

    def async_wait(n: int) -> None:
        for _ in range(n):
            dist.all_reduce(tensor, async_op=True).wait()

    warnings: list[str] = []
    out: dict[str, Any] = {"calls": calls, "rounds": rounds}
    for name, body in (("sync", sync), ("async", async_wait)):
        body(500)  # warm: gloo's first calls, lazy dispatcher tables
        arms: dict[str, list[float]] = {"plain": [], "captured": []}
        take_ns, taken = [], []
        for i in range(rounds):
            for arm in (("plain", "captured") if i % 2 == 0 else ("captured", "plain")):
                capture = Capture(torch, warnings.append) if arm == "captured" else None
                if capture is not None:
                    capture.install()
                try:
                    start = time.perf_counter_ns()
                    body(calls)
                    arms[arm].append((time.perf_counter_ns() - start) / calls)
                    if capture is not None:
                        start = time.perf_counter_ns()
                        records = _drain(capture, calls)
                        take_ns.append(time.perf_counter_ns() - start)
                        taken.append(len(records))
                        if capture.errors:
                            raise RuntimeError(f"capture errors: {capture.errors}")
                finally:
                    if capture is not None:
                        capture.uninstall()
        out[name] = {**arms, "taken": taken,
                     "take_ns_per_record": [t / max(n, 1) for t, n in zip(take_ns, taken, strict=True)]}
    out["warnings"] = warnings
    dist.destroy_process_group()
    return out


# -- harness side -------------------------------------------------------------------------------
def _one_job(work: Path, tag: str, env: dict[str, str], steps: int) -> dict[str, Any]:
    timings = work / f"{tag}.json"
    out = timed_run([sys.executable, str(HERE), "job", str(free_port()), str(steps), str(timings)],
                    env, cwd=str(work), timeout=900)
    times = json.loads(timings.read_text())
    if len(times) <= WARMUP_STEPS:
        raise HarnessError(f"only {len(times)} steps recorded; need more than {WARMUP_STEPS}")
    return {"wall_s": out.wall_s, "cpu_s": out.cpu_s, "step_s": times,
            "median_step_s": statistics.median(times[WARMUP_STEPS:]), "stderr": out.stderr.strip()}


def _hccl_proof(output: Path, steps: int) -> dict[str, Any]:
    """What the profiled run wrote: rank 0's hccl files, and the collectives of a middle step."""
    files = sorted(output.glob("PROF_*/device_0/timeline/hccl_*.json"))
    if not files:
        return {"hccl_json": 0}
    middle = [f for f in files if f.stem.endswith(f"_{steps // 2}")] or files[len(files) // 2:]
    events = json.loads(middle[0].read_text())
    ops = [e for e in (events if isinstance(events, list) else events.get("traceEvents", []))
           if e.get("ph") == "X"]
    return {"hccl_json": len(files), "devices": sorted(p.name for p in output.glob("PROF_*/device_*")),
            "middle_file": middle[0].name, "collectives_in_middle_step": len(ops),
            "bytes_in_middle_step": sum(e.get("args", {}).get("size(Byte)", 0) for e in ops)}


def run_steps(rounds: int, steps: int = STEPS, options: dict[str, str] | None = None) -> dict[str, Any]:
    opts = OPTIONS if options is None else options
    baseline_env = clean_env()
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-ddp-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            output = work / f"prof{i}"
            env = clean_env({"PROFILING_MODE": "true",
                             "PROFILING_OPTIONS": json.dumps({"output": str(output), "export": "inline",
                                                              **opts})})
            arms = [("baseline", baseline_env), ("profiled", env)]
            if i % 2:
                arms.reverse()
            pair: dict[str, Any] = {"order": [name for name, _ in arms]}
            for name, arm_env in arms:
                pair[name] = _one_job(work, f"{name}{i}", arm_env, steps)
            files = _hccl_proof(output, steps)
            if not files["hccl_json"] and opts.get("hccl") == "on":
                raise HarnessError(f"profiled DDP run {i} wrote no PROF_*/device_0/timeline/hccl_*.json "
                                   f"under {output}:\n{pair['profiled']['stderr'][-2000:]}")
            pair["files"] = files
            pair["ratio"] = pair["profiled"]["median_step_s"] / pair["baseline"]["median_step_s"]
            pairs.append(pair)
    base = [p["baseline"]["median_step_s"] for p in pairs]
    prof = [p["profiled"]["median_step_s"] for p in pairs]
    return {
        "world": WORLD, "steps": steps, "rounds": rounds, "warmup_steps_dropped": WARMUP_STEPS,
        "options": opts, "bucket_cap_mb": BUCKET_MB,
        "baseline_median_step_ms": summary(base, 1e3), "profiled_median_step_ms": summary(prof, 1e3),
        "ratio_of_medians": statistics.median(prof) / statistics.median(base),
        "pair_ratios": summary([p["ratio"] for p in pairs]),
        "process_wall_ratio": (statistics.median(p["profiled"]["wall_s"] for p in pairs)
                               / statistics.median(p["baseline"]["wall_s"] for p in pairs)),
        "files": [p["files"] for p in pairs],
        "profiled_stderr": sorted({p["profiled"]["stderr"] for p in pairs} - {""}),
        "pairs": pairs,
    }


def run_cost(calls: int = COST_CALLS, rounds: int = 7) -> dict[str, Any]:
    out = timed_run([sys.executable, str(HERE), "cost", str(calls), str(rounds)], clean_env(),
                    timeout=900)
    result = json.loads(out.stdout)
    for name in ("sync", "async"):
        arm = result[name]
        if any(n != calls for n in arm["taken"]):
            raise HarnessError(f"hccl-cost {name}: the capture handed over {arm['taken']} records per "
                               f"round, not {calls}")
        deltas = [c - p for p, c in zip(arm["plain"], arm["captured"], strict=True)]
        arm["plain_us"] = summary(arm["plain"], 1e-3)
        arm["captured_us"] = summary(arm["captured"], 1e-3)
        arm["delta_us"] = summary(deltas, 1e-3)
        arm["take_us_per_record"] = statistics.median(arm["take_ns_per_record"]) / 1e3
    return result


def _label(options: dict[str, str]) -> str:
    if options == OPTIONS:
        return "training_trace + hccl"
    return json.dumps(options, separators=(",", ":"))


def rows_steps(result: dict[str, Any]) -> list[dict[str, Any]]:
    ratio, pr = result["ratio_of_medians"], result["pair_ratios"]
    walls = {arm: statistics.median(p[arm]["wall_s"] for p in result["pairs"])
             for arm in ("baseline", "profiled")}
    return [
        {"benchmark": f"ddp 2-rank gloo, {_label(result['options'])} ({result['rounds']} rounds x "
                      f"{result['steps']} steps, median step)",
         "baseline": f"{result['baseline_median_step_ms']['median']:.2f} ms",
         "profiled": f"{result['profiled_median_step_ms']['median']:.2f} ms",
         "delta / ratio": f"x{ratio:.3f}",
         "spread": f"round ratios: median x{pr['median']:.3f}, CI x{pr['ci_low']:.3f} .. "
                   f"x{pr['ci_high']:.3f} ({pr['ci_coverage']:.0%})",
         "target": f"<= x{TARGET_RATIO:.2f}",
         "result": verdict(ratio, pr["ci_low"], pr["ci_high"], TARGET_RATIO)},
        {"benchmark": "ddp whole process wall time, spawn + 2 ranks (info)",
         "baseline": f"{walls['baseline']:.2f} s", "profiled": f"{walls['profiled']:.2f} s",
         "delta / ratio": f"x{result['process_wall_ratio']:.3f}", "spread": "-", "target": "-",
         "result": "info"},
    ]


def rows_cost(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, label in (("sync", "dist.all_reduce(ones(16))"), ("async", "all_reduce(async_op=True).wait()")):
        arm = result[name]
        d = arm["delta_us"]
        out.append({
            "benchmark": f"hccl capture cost per collective, {label}, gloo world 1",
            "baseline": f"{arm['plain_us']['median']:.1f} us",
            "profiled": f"{arm['captured_us']['median']:.1f} us",
            "delta / ratio": f"{d['median']:+.1f} us",
            "spread": f"CI {d['ci_low']:+.1f} .. {d['ci_high']:+.1f} us ({d['ci_coverage']:.0%}), "
                      f"{result['rounds']} pairs x {result['calls']} calls; take "
                      f"{arm['take_us_per_record']:.1f} us/record",
            "target": "-", "result": "info"})
    return out


def notes(result: dict[str, Any]) -> list[str]:
    out = []
    if "steps" in result:
        files = result["steps"]["files"]
        if files[0]["hccl_json"]:
            out.append(f"ddp: every profiled run wrote hccl files: hccl_*.json per run "
                       f"{[f['hccl_json'] for f in files]}, devices {files[0]['devices']}, collectives "
                       f"in {files[0]['middle_file']}: {files[0]['collectives_in_middle_step']} "
                       f"({files[0]['bytes_in_middle_step'] / 1e6:.2f} MB)")
        ratios = ", ".join(f"x{p['ratio']:.3f}" for p in result["steps"]["pairs"])
        out.append(f"ddp: per-round ratios (profiled / unprofiled median step), in run order: {ratios}")
        out += [f"ddp: profiled stderr: {s[-300:]}" for s in result["steps"]["profiled_stderr"]]
    if "cost" in result and result["cost"].get("warnings"):
        out.append(f"hccl-cost: capture warnings: {result['cost']['warnings']}")
    return out


def main(argv: list[str]) -> int:
    """The children: ``job PORT STEPS TIMINGS`` and ``cost CALLS ROUNDS`` (the harness is
    ``bench/run.py --only ddp`` / ``--only hccl-cost``)."""
    if argv[:1] == ["job"] and len(argv) == 4:
        job(int(argv[1]), int(argv[2]), argv[3])
    elif argv[:1] == ["cost"] and len(argv) == 3:
        print(json.dumps(cost(int(argv[1]), int(argv[2]))))
    else:
        print(main.__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
