"""HTA as the oracle: jobprof's import of each recorded GPU trace against HTA 0.5 reading the
same files (``TraceAnalysis.get_temporal_breakdown`` and ``get_comm_comp_overlap``).

The two tools draw their lines differently; each rule is compared where both measure the same
thing, and the rules are in docs/import.md ("Checked against HTA"):

* iterations: HTA keeps the GPU work launched before the last ProfilerStep starts (it drops the
  last step); jobprof keeps every step.  Compared over the same steps: all but the last.
* rounding: HTA rounds each event to whole µs unless ``HTA_DISABLE_NS_ROUNDING=1``; set here.
* busy time: HTA's compute + non-compute (the union of every GPU event) is the union of msprof's
  Computing and Communication (Overlap Analysis: Computing + Communication(Not Overlapped)).
* compute: HTA's excludes memcpy / memset (msprof's Computing counts every task that is not
  communication): compared with the union of jobprof's CUDA tasks (op_summary Task Type CUDA).
* idle: HTA's is the kernel span (first kernel start to last kernel end over the kept steps)
  minus busy time; jobprof's Free spans each step's host time too: compared inside HTA's span.
* host events with a ``stream`` argument: HTA counts them as GPU kernels (the Triton trace's
  ``cpu_op`` of the compiled kernel, ``args.stream`` 0); jobprof's are the device's own events.
  Where a trace has them, their spans (read from the trace here) are added to jobprof's side.
* overlap: HTA's percentage of communication time overlapped by computation (memory ignored);
  jobprof's ``(Communication - Communication(Not Overlapped)) / Communication`` (memory counts
  as computing): compared as communication time, within 1% of the traced time.

Every figure must agree within 1% of the traced time (HTA's kernel span).
"""

from __future__ import annotations

import csv
import gzip
import json
import lzma
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, clean_env
from tracecheck import union

DATA = REPO / "tests" / "data"
HTA = DATA / "hta"
CASES = {
    "nccl": [HTA / "nccl_parser_config_nccl_data.json.gz"],
    "sampled-2-ranks": sorted((HTA / "trace_filter_sampled").glob("*.json.gz")),
    "amd": [HTA / "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz"],
    "alexnet": [HTA / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"],
    "triton": [HTA / "triton_example_triton_example.json.gz"],
    "h200": [DATA / "cuda_h200_lm_3steps.pt.trace.json.xz"],
}
MODEL = 4294967295
TOLERANCE = 0.01

hta = pytest.importorskip("hta.trace_analysis")


def _run_hta(folder: Path) -> dict[int, dict[str, float]]:
    """HTA's figures per rank, in µs (a subprocess: HTA_DISABLE_NS_ROUNDING is read at import)."""
    code = """
import json, sys, warnings
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
tb = a.get_temporal_breakdown(visualize=False)
ov = a.get_comm_comp_overlap(visualize=False)
out = {}
for _, r in tb.iterrows():
    out[int(r["rank"])] = {"idle": float(r["idle_time(us)"]), "compute": float(r["compute_time(us)"]),
                           "non_compute": float(r["non_compute_time(us)"]),
                           "span": float(r["kernel_time(us)"])}
for _, r in ov.iterrows():
    out[int(r["rank"])]["overlap_pct"] = float(r["comp_comm_overlap_pctg"])
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                          timeout=300, env=clean_env(HTA_DISABLE_NS_ROUNDING="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def _host_streams(path: Path) -> list[tuple[float, float]]:
    """The spans (epoch µs) of host events carrying a ``stream`` argument, which HTA counts as
    GPU kernels (trace_filter.py: any row with stream >= 0 and a correlation)."""
    data = path.read_bytes()
    trace = json.loads(lzma.decompress(data) if path.suffix == ".xz" else gzip.decompress(data))
    base = trace.get("baseTimeNanoseconds", 0) / 1000
    return [(base + e["ts"], base + e["ts"] + e["dur"]) for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "cpu_op"
            and isinstance((e.get("args") or {}).get("stream"), int) and e["args"]["stream"] >= 0]


def _jobprof(prof: Path, rank: int, steps: list[int],
             hta_extra: list[tuple[float, float]]) -> dict[str, float]:
    """jobprof's figures for ``steps`` of ``rank``, in µs, from the files it wrote;
    ``hta_extra``: spans HTA counts as kernels that are host events (see the module doc)."""
    device = prof / f"device_{rank}"
    overlap: dict[str, float] = defaultdict(float)
    compute: list[tuple[float, float]] = []
    tasks: list[tuple[float, float]] = []
    for step in steps:
        events = json.loads((device / "timeline" / f"msprof_{rank}_{MODEL}_{step}.json").read_text())
        pid = next(e["pid"] for e in events if e.get("name") == "process_name"
                   and e["args"]["name"] == "Overlap Analysis")
        for e in events:
            if e.get("ph") == "X" and e["pid"] == pid:
                overlap[e["name"]] += e["dur"]
        path = device / "summary" / f"op_summary_{rank}_{MODEL}_{step}.csv"
        with path.open() as handle:
            for row in csv.DictReader(handle):
                start = float(row["Task Start Time(us)"])
                span = (start, start + float(row["Task Duration(us)"]))
                tasks.append(span)
                if row["Task Type"] == "CUDA":
                    compute.append(span)
    busy = overlap["Computing"] + overlap["Communication(Not Overlapped)"]
    if hta_extra:
        busy = union(tasks + hta_extra)
        compute += hta_extra
        tasks += hta_extra
    span = max(e for _, e in tasks) - min(s for s, _ in tasks)
    communication = overlap["Communication"]
    return {"busy": busy, "compute": union(compute), "span": span, "idle": span - busy,
            "communication": communication,
            "overlapped": communication - overlap["Communication(Not Overlapped)"]}


@pytest.mark.parametrize("case", list(CASES))
def test_breakdown_and_overlap_agree_with_hta(case, tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for path in CASES[case]:  # HTA reads *.json and *.json.gz
        if path.suffix == ".xz":
            (folder / path.name.removesuffix(".xz")).write_bytes(lzma.decompress(path.read_bytes()))
        else:
            shutil.copy(path, folder)
    theirs = _run_hta(folder)
    done = subprocess.run([sys.executable, "-m", "jobprof.cli.main", "import", str(folder), "-o",
                           str(tmp_path / "p")],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    prof = next((tmp_path / "p").iterdir())
    table = []
    for rank, h in sorted(theirs.items()):
        info: dict[str, Any] = json.loads((prof / f"device_{rank}" / f"info.json.{rank}").read_text())
        steps = sorted(s for i in info["jobprof"]["imported"] for s in i["steps"])
        kept = steps[:-1] if len(steps) > 1 else steps  # HTA drops the last ProfilerStep
        ours = _jobprof(prof, rank, kept, [s for p in CASES[case] for s in _host_streams(p)])
        limit = TOLERANCE * h["span"]
        h_busy = h["compute"] + h["non_compute"]
        rows = {"busy (compute + non-compute)": (ours["busy"], h_busy),
                "compute (CUDA kernels)": (ours["compute"], h["compute"]),
                "kernel span": (ours["span"], h["span"]),
                "idle inside the span": (ours["idle"], h["idle"])}
        if not (h.get("overlap_pct") != h.get("overlap_pct") or "overlap_pct" not in h):  # NaN: no NCCL
            rows["communication overlapped by compute"] = (ours["overlapped"],
                                                           ours["communication"] * h["overlap_pct"] / 100)
        for what, (a, b) in rows.items():
            table.append((case, rank, what, round(a, 1), round(b, 1), round(100 * abs(a - b) / h["span"], 3)))
            assert abs(a - b) <= limit, (case, rank, what, a, b, limit)
    # the comparison table, printed for the closing note (pytest -s)
    for row in table:
        print("HTA", *row)


def test_hta_fails_where_jobprof_says_why(tmp_path):
    """The CUPTI-ranges trace has no kernel activity: HTA's breakdown raises (IndexError), jobprof
    imports its host operators and ranges and lists no device task."""
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copy(HTA / "cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz", folder)
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, "-c", "import sys, warnings; warnings.simplefilter('ignore');"
                        "from hta.trace_analysis import TraceAnalysis;"
                        "TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)",
                        str(folder)],
                       check=True, capture_output=True, env=clean_env(), timeout=300)
    done = subprocess.run([sys.executable, "-m", "jobprof.cli.main", "import", str(folder), "-o",
                           str(tmp_path / "p")],
                          capture_output=True, text=True, env={**os.environ, **clean_env()}, timeout=300)
    assert done.returncode == 0 and "no device work" in done.stdout, done
