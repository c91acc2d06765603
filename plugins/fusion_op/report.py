"""The "Compiled graphs" section of ``jobprof summary`` and the report: per torch.compile
graph, its kernels, the time its tasks took and what its top kernels fused, with Dynamo's
graph breaks and recompiles.

Times come from the rendered op_summary files (rows whose Model ID is the graph's), the last
:data:`SAMPLE` iterations of each device: a few CSV reads however long the run.  Without
``fusion_op: kernels`` a CPU graph's C++ kernels are not timed one by one, so its time is that
of its extern calls (``mm``, ``addmm``, ...); the section says so.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, CompiledGraphRecord, Finding, Section
from jobprof.plugins.fusion_op.records import CompileCountersRecord

if TYPE_CHECKING:
    from jobprof.plugin import Profile

SAMPLE = 50
TOP_KERNELS = 3
PHASES = {"fwd": 0, "bwd": 1, "inf": 2}


def _task_times(profile: Profile, device: int, ids: set[int]) -> tuple[
        dict[int, dict[str, list[float]]], dict[int, list[float]], int]:
    """From the last op_summary files: {model id: {kernel name: [µs per file]}}, {model id:
    [its total µs per file it ran in]}, and how many files were read."""
    times: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    totals: dict[int, list[float]] = defaultdict(list)
    files = profile.summary_files(device, "op_summary")[-SAMPLE:]
    read = 0
    for path in files:
        per: dict[tuple[int, str], float] = defaultdict(float)
        try:
            with profile.open_text(path) as handle:
                for row in csv.DictReader(handle):
                    try:
                        model = int(row["Model ID"])
                    except (KeyError, TypeError, ValueError):
                        continue
                    if model in ids:
                        per[model, row.get("Op Name", "?")] += float(row.get("Task Duration(us)") or 0)
        except (OSError, ValueError):
            continue
        read += 1
        per_model: dict[int, float] = defaultdict(float)
        for (model, name), us in per.items():
            times[model][name].append(us)
            per_model[model] += us
        for model, us in per_model.items():
            totals[model].append(us)
    return times, totals, read


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    """This device's compiled graphs, in the section's order: ``graphs``, per graph its id,
    name, phase, the iteration it was compiled in, how many generated kernels and extern calls
    it has, ``per_iter`` (the median µs its tasks took per op_summary file read, None with no
    file read) and ``top``, its top kernels with what they fused; ``iteration_us``, the median
    iteration of the last :data:`SAMPLE`; ``timed_kernels``, whether a generated kernel was
    timed; ``counters``, torch.compile's last counts (None without any).  None without a graph."""
    graphs: dict[int, CompiledGraphRecord] = {}
    last: CompileCountersRecord | None = None
    for _, _, graph in profile.typed(CompiledGraphRecord, device):
        graphs.setdefault(graph.model_id, graph)
    for _, _, counts in profile.typed(CompileCountersRecord, device):
        last = counts
    if not graphs:
        return None
    iterations = [it.end_ns - it.start_ns for it in profile.iterations(device)][-SAMPLE:]
    iteration_us = statistics.median(iterations) / 1000 if iterations else 0.0
    times, totals_of, files = _task_times(profile, device, set(graphs))
    timed_kernels = False
    rows = []
    for graph in sorted(graphs.values(), key=lambda g: (g.first_iteration, g.compile_id,
                                                        PHASES.get(g.phase, 9))):
        by_kernel = times.get(graph.model_id, {})
        generated = [k for k in graph.kernels if k.kind != "extern"]
        # median over the files read of the graph's task time in each (0 where it did not run)
        totals = totals_of.get(graph.model_id, [])
        per_iter = statistics.median(totals + [0.0] * (files - len(totals))) if files else None
        ranked = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))
        ops = {k.name: k.original_ops for k in graph.kernels}
        if any(name in ops and name.startswith(("cpp_", "triton_")) for name, _ in ranked):
            timed_kernels = True
        top = [f"{name} ({'+'.join(op.rpartition('::')[2] for op in ops.get(name, ())) or '?'})"
               for name, _ in ranked if name in ops][:TOP_KERNELS] or \
              [f"{k.name} ({'+'.join(op.rpartition('::')[2] for op in k.original_ops) or '?'})"
               for k in generated[:TOP_KERNELS]]
        rows.append({"model_id": graph.model_id, "model_name": graph.model_name, "phase": graph.phase,
                     "first_iteration": graph.first_iteration, "kernels": len(generated),
                     "extern": len(graph.kernels) - len(generated), "per_iter": per_iter, "top": top})
    return {"graphs": rows, "iteration_us": iteration_us, "timed_kernels": timed_kernels,
            "counters": None if last is None else last.to_raw()}


def compiled_sections(profile: Profile) -> list[Section]:
    rows, notes, findings = [], [], []
    timed_kernels = False
    for device in profile.devices:
        facts = profile.facts("fusion_op", device, rank_facts)
        if not facts:
            continue
        iteration_us = facts["iteration_us"]
        timed_kernels = timed_kernels or facts["timed_kernels"]
        for graph in facts["graphs"]:
            per_iter = graph["per_iter"]
            rows.append([device, graph["model_id"], graph["model_name"], graph["phase"],
                         graph["first_iteration"], graph["kernels"], graph["extern"],
                         NA if per_iter is None else f"{per_iter / 1000:.3f}",
                         NA if per_iter is None or not iteration_us
                         else f"{100 * per_iter / iteration_us:.1f}",
                         "; ".join(graph["top"]) or NA])
        last = facts["counters"]
        if last is not None:
            breaks, recompiles = last["graph_breaks"], last["recompiles"]
            who = f"rank {profile.rank(device)}: " if len(profile.devices) > 1 else ""
            graphs_n, breaks_n, recompiles_n = (NA if v is None else v for v in
                                                (last["unique_graphs"], breaks, recompiles))
            notes.append(f"{who}torch.compile counted {graphs_n} graph(s), {breaks_n} graph break(s), "
                         f"{recompiles_n} recompile(s)")
            if breaks or recompiles:
                findings.append(Finding(
                    "compile_breaks",
                    f"{who}torch.compile broke the graph {breaks or 0} time(s) and recompiled "
                    f"{recompiles or 0} time(s): each break runs eager Python between graphs, each "
                    "recompile a new compile (TORCH_LOGS=graph_breaks,recompiles says why)",
                    {"rank": profile.rank(device), "graph_breaks": breaks, "recompiles": recompiles},
                    weight=1))
    if not rows:
        return []
    if not timed_kernels:
        notes.append("C++ kernels are not timed one by one (fusion_op 'kernels' times them, with a "
                     "different compile): a CPU graph's time here is that of its extern calls")
    return [Section("Compiled graphs (torch.compile)",
                    ["device", "model id", "model name", "phase", "compiled in iteration", "kernels",
                     "extern calls", "task ms / iter", "% of iteration", "top kernels (what they fused)"],
                    rows, notes, key="compiled_graphs", findings=findings)]
