"""optier-vs-torch: the operator tier against torch.profiler on the same jobs, every target of
the operator-tier issue as a row with pass/FAIL.

Workloads (bench/_optier_job.py ``--model``): the example MLP, a 2-layer transformer LM, a small
conv net, and the MLP as a 2-rank DDP job (gloo, torchrun).  Arms, one process (or one torchrun)
each, order rotated every round so drift spreads over all of them:

* ``base``: unprofiled;
* ``step``: jobprof's step tier (training_trace, dp, msproftx);
* ``l0``: training_trace + task_trace l0 (operators, no shapes);
* ``l1``: training_trace + task_trace l1 (operators with input shapes, dtypes, strides);
* ``torch``: ``torch.profiler`` (CPU, ``record_shapes``), schedule ``active=1``: a Chrome trace
  file per step, the per-step-trace figure of the issue (its cheapest per-iteration form);
* ``torch_whole``: the same profiler as one session over every step past the warm-up (one
  trace, no restart per step): the second reference for per-operator truth, since a session
  restarted every step (``warmup=0``, which torch warns about) skews the operators after it.

Rows (t = the median steady-state step time of an arm in a round; ratios per round, then the
median over rounds):

* overhead ratio ``(t_l1 - t_base) / (t_torch - t_base)`` <= 0.8 and the same for l0 <= 0.3, per
  workload; the step tier's ``t_step / t_base`` <= 1.01;
* the sampled operator tier (``l1_every20``: l1 with ``task_trace_every`` 20): its mean step
  time (amortised over sampled and unsampled steps) / base's <= 1.05;
* jobprof's hand-over on the training thread per iteration (mean of the core's ``profiler``
  stream, the summary's "jobprof hand-over" part) <= 2 ms;
* truth: per operator type with a torch.profiler mean >= 10 us, jobprof's mean within 15%
  (from the l1 and torch runs of the same round; the table lists every such type), against the
  per-step trace and against the one-session trace (each its own row);
* whole-process wall time (the job's exit included; the background exporter that renders after
  it is not: its time is printed beside) of l1 <= torch's; raw data on disk of l1 <= 50% of
  torch's traces for the same iterations;
* exit: from the job's own end (its last line) to its process's end, l1 less the unprofiled
  arm's (the interpreter's own teardown) <= 2 s;
* export: op_summary rows rendered per CPU second by ``jobprof export`` of the l1 profile of the
  LM (every file rendered) >= 100,000.

Every row is printed whatever its outcome; the exit code never depends on them (CI runs a quick
form for the figures).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import HarnessError, clean_env, rotated, summary, timed_run
from common import table_row as _row

ROOT = Path(__file__).resolve().parent.parent
JOB = Path(__file__).resolve().parent / "_optier_job.py"
WORKLOADS = ("mlp", "lm", "conv", "ddp")
ARMS = ("base", "step", "l0", "l1", "l1_every20", "torch", "torch_whole")
#: the sampled operator tier's arm and its N (task_trace_every)
SAMPLED, EVERY = "l1_every20", 20
#: the torch.profiler arms: (name, what it is) for the truth rows
REFERENCES = (("torch", "per-step trace"), ("torch_whole", "one-session trace"))
OPTIONS = {
    # task_trace defaults to on (msprof's default): the step tier says off
    "step": {"training_trace": "on", "dp": "on", "msproftx": "on", "task_trace": "off"},
    "l0": {"training_trace": "on", "task_trace": "l0"},
    "l1": {"training_trace": "on", "task_trace": "on"},
    "l1_every20": {"training_trace": "on", "task_trace": "on", "task_trace_every": 20},
}
WARMUP = 10
TARGETS = {"l1": 0.8, "l0": 0.3, "step": 1.01, "handover_ms": 2.0, "truth": 0.15, "truth_min_us": 10.0,
           "disk": 0.5, "export_rows_per_cpu_s": 100_000, "exit_s": 2.0, "sampled": 1.05}
_PORT = [29600]


def _env(name: str, out: Path) -> tuple[dict[str, str], list[str]]:
    if name == "base":
        return clean_env(), []
    if name == "torch":
        return clean_env({"KINETO_LOG_LEVEL": "6"}), ["--torch-profiler", str(out)]
    if name == "torch_whole":
        return clean_env({"KINETO_LOG_LEVEL": "6"}), ["--torch-profiler", str(out),
                                                     "--torch-whole-after", str(WARMUP)]
    options = json.dumps({"output": str(out), **OPTIONS[name]})
    return clean_env({"PROFILING_MODE": "true", "PROFILING_OPTIONS": options}), []


def _cmd(workload: str, steps: int, timings: Path, extra: list[str]) -> list[str]:
    model = "mlp" if workload == "ddp" else workload
    args = [str(JOB), "--model", model, "--steps", str(steps), "--timings", str(timings), *extra]
    if workload != "ddp":
        return [sys.executable, *args]
    _PORT[0] += 1
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(_PORT[0]), *args]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def background_exporters(out: Path) -> float:
    """Wait for the job's background exporters; their rendering time (s, summed over devices)."""
    from jobprof.files import handover
    from jobprof.files.profdir import device_dirs

    seconds = 0.0
    for prof in out.glob("PROF_*"):
        for device in device_dirs(prof):
            handover.wait(device, timeout=900)
            info = json.loads(next(device.glob("info.json.*[0-9]")).read_text()).get("jobprof", {})
            seconds += (info.get("background_export") or {}).get("seconds", 0.0)
    return seconds


def jobprof_facts(out: Path) -> dict[str, Any]:
    """Iterations with operators, the hand-over per iteration (ms, mean: short iterations share
    an operator window, and the one that cuts it pays for all), raw bytes."""
    from jobprof.files import rawstore
    from jobprof.files.profdir import device_dirs
    from jobprof.ops import opcapture

    iterations = with_ops = 0
    handover: list[float] = []
    raw = 0
    for prof in out.glob("PROF_*"):
        for device in device_dirs(prof):
            raw += _size(device / "data")
            for _, streams in rawstore.read(device):
                iterations += 1
                with_ops += bool(streams.get(opcapture.STREAM))
                spans = streams.get(rawstore.PROFILER_STREAM) or []
                it = streams[rawstore.ITERATION_STREAM][0]
                # a span is listed in every iteration it overlaps: count the part inside this one
                lo, hi = it["start_ns"], it["end_ns"]
                handover.append(sum(max(0, min(b, hi) - max(a, lo)) for a, b in spans) / 1e6)
    return {"iterations": iterations, "ops_iterations": with_ops, "raw_bytes": raw,
            "handover_ms": statistics.mean(handover[WARMUP:] or handover or [float("nan")])}


def jobprof_means(out: Path) -> dict[str, float]:
    """Mean duration (us) per operator name over every host operator of every iteration."""
    from jobprof.files import rawstore
    from jobprof.files.profdir import device_dirs
    from jobprof.ops import opcapture

    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for prof in out.glob("PROF_*"):
        for device in device_dirs(prof)[:1]:
            for index, streams in rawstore.read(device):
                if index < WARMUP:
                    continue
                for r in streams.get(opcapture.STREAM) or ():
                    if r.kind == "cpu_op":
                        total[r.name] += r.dur / 1e3
                        count[r.name] += 1
    return {n: total[n] / count[n] for n in total}


def torch_means(out: Path) -> tuple[dict[str, float], int]:
    """Mean duration (us) per cpu_op name over the traces past the warm-up, and their bytes."""
    traces = sorted(p for p in out.rglob("trace_*.json"))
    first_rank = [p for p in traces if p.parent == traces[0].parent] if traces else []
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    # a per-step trace per step (the warm-up's left out); a one-session trace holds only the
    # steps past the warm-up already
    for path in first_rank[WARMUP:] if len(first_rank) > 1 else first_rank:
        for e in json.loads(path.read_text()).get("traceEvents", []):
            if e.get("cat") == "cpu_op" and "dur" in e:
                total[e["name"]] += float(e["dur"])
                count[e["name"]] += 1
    return {n: total[n] / count[n] for n in total}, sum(p.stat().st_size for p in traces)


def _one(work: Path, workload: str, arm: str, tag: str, steps: int) -> dict[str, Any]:
    out = work / tag
    env, extra = _env(arm, out)
    timings = work / f"{tag}.json"
    ran = timed_run(_cmd(workload, steps, timings, extra), env, cwd=str(work), timeout=900)
    ended = time.time()
    path = timings.with_name(timings.name + ".rank0") if workload == "ddp" else timings
    times = json.loads(path.read_text())
    if len(times) != steps:
        raise HarnessError(f"{workload}/{arm}: {len(times)} step times, {steps} expected")
    result: dict[str, Any] = {"step_s": statistics.median(times[WARMUP:]), "wall_s": ran.wall_s,
                              "mean_step_s": statistics.mean(times[WARMUP:]),
                              "cpu_s": ran.cpu_s,
                              "exit_s": ended - float(path.with_name(path.name + ".end").read_text())}
    if arm in OPTIONS:
        result["exporter_s"] = background_exporters(out)
        facts = jobprof_facts(out)
        ranks = 2 if workload == "ddp" else 1
        with_ops = steps * ranks / (EVERY if arm == SAMPLED else 1)
        if facts["iterations"] < 0.9 * steps * ranks or (arm != "step" and facts["ops_iterations"]
                                                         < 0.9 * with_ops):
            raise HarnessError(f"{workload}/{arm} did not profile as asked: {facts}\n{ran.stderr[-2000:]}")
        result.update(facts)
        if arm == "l1":
            result["means"] = jobprof_means(out)
    elif arm in ("torch", "torch_whole"):
        means, size = torch_means(out)
        if not means:
            raise HarnessError(f"{workload}/torch wrote no trace\n{ran.stderr[-2000:]}")
        result.update(means=means, raw_bytes=size)
    if workload == "lm" and arm == "l1" and not (work / "lm_l1_profile").exists():
        shutil.copytree(out, work / "lm_l1_profile")  # the export-rate row renders it again
    shutil.rmtree(out, ignore_errors=True)
    return result


def export_rate(profile: Path) -> dict[str, Any]:
    """``jobprof export`` of a kept l1 profile: op_summary rows per CPU second."""
    prof = next(profile.glob("PROF_*"))
    ran = timed_run([sys.executable, "-m", "jobprof.cli.main", "export", str(prof)], clean_env(), timeout=900)
    rows = 0
    for csv in prof.glob("device_*/summary/op_summary_*.csv"):
        with open(csv, "rb") as f:
            rows += max(sum(1 for _ in f) - 1, 0)
    return {"rows": rows, "cpu_s": ran.cpu_s, "wall_s": ran.wall_s,
            "rows_per_cpu_s": rows / ran.cpu_s if ran.cpu_s else float("nan")}


def run(rounds: int, steps: int, workloads: tuple[str, ...] = WORKLOADS) -> dict[str, Any]:
    data: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-ovt-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            for w in workloads:
                order = rotated(ARMS, i)
                data[w].append({arm: _one(work, w, arm, f"{w}_{arm}{i}", steps) for arm in order})
        exported = export_rate(work / "lm_l1_profile") if "lm" in workloads else None
    return {"rounds": rounds, "steps": steps, "warmup": WARMUP, "workloads": list(workloads),
            "data": data, "export": exported}


def _ratio(rounds: list[dict[str, Any]], arm: str) -> list[float]:
    return [(r[arm]["step_s"] - r["base"]["step_s"]) / (r["torch"]["step_s"] - r["base"]["step_s"])
            for r in rounds]


def truth(rounds: list[dict[str, Any]], reference: str = "torch") -> list[tuple[str, float, float, float]]:
    """(op type, jobprof mean us, torch mean us, ratio) for every type the ``reference`` arm
    measured >= 10 us on average; means over the rounds."""
    jp: dict[str, list[float]] = defaultdict(list)
    tp: dict[str, list[float]] = defaultdict(list)
    for r in rounds:
        for n, v in r["l1"]["means"].items():
            jp[n].append(v)
        for n, v in r[reference]["means"].items():
            tp[n].append(v)
    out = []
    for name, values in tp.items():
        t = statistics.mean(values)
        if t >= TARGETS["truth_min_us"] and name in jp:
            j = statistics.mean(jp[name])
            out.append((name, j, t, j / t))
    return sorted(out, key=lambda row: -row[2])


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    n = f"{result['rounds']} rounds x {result['steps']} steps"
    for w, rounds in result["data"].items():
        ms = {a: statistics.median(r[a]["step_s"] for r in rounds) * 1e3 for a in ARMS}
        for arm in ("l1", "l0"):
            rel = summary(_ratio(rounds, arm)) if len(rounds) > 1 else None
            value = statistics.median(_ratio(rounds, arm))
            out.append(_row(f"optier-vs-torch {w}: {arm} overhead / torch.profiler's (per-step trace) ({n})",
                            f"{ms['base']:.2f} ms base, {ms['torch']:.2f} torch", f"{ms[arm]:.2f} ms",
                            f"{value:.3f}", f"<= {TARGETS[arm]}", value <= TARGETS[arm],
                            f"{rel['min']:.3f} .. {rel['max']:.3f}" if rel else ""))
        whole = statistics.median((r["l1"]["step_s"] - r["base"]["step_s"])
                                  / (r["torch_whole"]["step_s"] - r["base"]["step_s"]) for r in rounds)
        out.append(_row(f"optier-vs-torch {w}: l1 overhead / torch.profiler's as one session (no trace "
                        "per step)", f"{ms['base']:.2f} ms base, {ms['torch_whole']:.2f} torch",
                        f"{ms['l1']:.2f} ms", f"{whole:.3f}", "-", None))
        step = statistics.median(r["step"]["step_s"] / r["base"]["step_s"] for r in rounds)
        out.append(_row(f"optier-vs-torch {w}: step tier / base", f"{ms['base']:.2f} ms",
                        f"{ms['step']:.2f} ms", f"x{step:.3f}", f"<= x{TARGETS['step']}",
                        step <= TARGETS["step"]))
        sampled = statistics.median(r[SAMPLED]["mean_step_s"] / r["base"]["mean_step_s"] for r in rounds)
        out.append(_row(f"optier-vs-torch {w}: sampled operator tier (l1 on 1 iteration in {EVERY}), "
                        "amortised: mean step / base's",
                        f"{statistics.median(r['base']['mean_step_s'] for r in rounds) * 1e3:.2f} ms",
                        f"{statistics.median(r[SAMPLED]['mean_step_s'] for r in rounds) * 1e3:.2f} ms",
                        f"x{sampled:.3f}", f"<= x{TARGETS['sampled']}", sampled <= TARGETS["sampled"]))
        for arm in ("l0", "l1"):
            hand = statistics.median(r[arm]["handover_ms"] for r in rounds)
            out.append(_row(f"optier-vs-torch {w}: {arm} hand-over on the training thread per iteration",
                            "-", f"{hand:.2f} ms", f"{hand:.2f} ms", f"<= {TARGETS['handover_ms']} ms",
                            hand <= TARGETS["handover_ms"]))
        wall_l1 = statistics.median(r["l1"]["wall_s"] for r in rounds)
        wall_t = statistics.median(r["torch"]["wall_s"] for r in rounds)
        behind = statistics.median(r["l1"].get("exporter_s", 0.0) for r in rounds)
        out.append(_row(f"optier-vs-torch {w}: whole-process wall, l1 vs torch.profiler "
                        f"(the job's exit included; its background exporter then rendered {behind:.1f} s)",
                        f"{wall_t:.1f} s torch", f"{wall_l1:.1f} s", f"x{wall_l1 / wall_t:.2f}", "<= x1.00",
                        wall_l1 <= wall_t))
        exit_base = statistics.median(r["base"]["exit_s"] for r in rounds)
        exit_l1 = statistics.median(r["l1"]["exit_s"] - r["base"]["exit_s"] for r in rounds)
        out.append(_row(f"optier-vs-torch {w}: exit, l1: the job's end to its process's end, less the "
                        "unprofiled arm's", f"{exit_base:.2f} s unprofiled",
                        f"{exit_base + exit_l1:.2f} s", f"+{exit_l1:.2f} s", f"<= +{TARGETS['exit_s']:g} s",
                        exit_l1 <= TARGETS["exit_s"]))
        disk_l1 = statistics.median(r["l1"]["raw_bytes"] for r in rounds)
        disk_t = statistics.median(r["torch"]["raw_bytes"] for r in rounds)
        out.append(_row(f"optier-vs-torch {w}: raw data on disk, l1 vs torch.profiler's traces",
                        f"{disk_t / 1e6:.1f} MB torch", f"{disk_l1 / 1e6:.1f} MB", f"x{disk_l1 / disk_t:.2f}",
                        f"<= x{TARGETS['disk']}", disk_l1 <= TARGETS["disk"] * disk_t))
        for reference, what in REFERENCES:
            table = truth(rounds, reference)
            bad = [t for t in table if abs(t[3] - 1) > TARGETS["truth"]]
            worst = max(table, key=lambda t: abs(t[3] - 1)) if table else None
            out.append(_row(f"optier-vs-torch {w}: op types (torch {what} mean >= 10 us) whose jobprof "
                            "mean is within 15%",
                            f"{len(table)} types", f"{len(table) - len(bad)} within",
                            f"worst {worst[0]} x{worst[3]:.2f}" if worst else "-", "all", not bad))
    exported = result.get("export")
    if exported:
        rate = exported["rows_per_cpu_s"]
        out.append(_row("optier-vs-torch lm: jobprof export of the l1 profile, op_summary rows per "
                        "CPU second",
                        f"{exported['rows']} rows", f"{exported['cpu_s']:.1f} CPU s", f"{rate:,.0f} rows/s",
                        f">= {TARGETS['export_rows_per_cpu_s']:,}", rate >= TARGETS["export_rows_per_cpu_s"]))
    return out


def notes(result: dict[str, Any]) -> list[str]:
    lines = []
    for w, rounds in result["data"].items():
        whole = {name: (t, ratio) for name, _, t, ratio in truth(rounds, "torch_whole")}
        lines.append(f"optier-vs-torch {w}: per-op accuracy (op type, jobprof mean us, torch.profiler "
                     "per-step trace mean us, ratio, one-session trace mean us, ratio):")
        lines += [f"  {name:<40} {j:>10.1f} {t:>10.1f} {ratio:>7.2f}"
                  + (" {:>10.1f} {:>7.2f}".format(*whole[name]) if name in whole else "")
                  for name, j, t, ratio in truth(rounds)]
    return lines


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--json")
    args = parser.parse_args()
    began = time.perf_counter()
    result = run(args.rounds, args.steps, tuple(args.workloads.split(",")))
    from tabulate import tabulate

    print(tabulate(rows(result), headers="keys", tablefmt="github"))
    print("\n".join(notes(result)))
    print(f"optier-vs-torch: {time.perf_counter() - began:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
