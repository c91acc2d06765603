"""The CUDA path on a trace recorded on a real GPU (NVIDIA H200, torch 2.11; tests/data/README.md).

The trace is the file Kineto writes for each of jobprof's operator windows, so it goes through
exactly what a CUDA job's windows go through: stored as a window file, referenced by three
iterations (the three training steps it holds), resolved by ``kinetotrace.Windows`` and
rendered by the real writers (op_summary, task_time, aicpu, the master timeline).  Each check
is against the trace itself, read here independently of jobprof (its ``args.correlation``
links, its ``grid``s, its categories), not against jobprof's own tree.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import lzma
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, loaded_manager
from tracecheck import check_host_marks, launch_outcomes

pytestmark = pytest.mark.torch_versions

TRACE = REPO / "tests" / "data" / "cuda_h200_lm_3steps.pt.trace.json.xz"
MODEL = 4294967295
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
MONOTONIC_AT_BASE = 5_000 * 10**9
OPTIONS = {"output": ".", "training_trace": "on", "task_trace": "on", "aicpu": "on",
           "aic_metrics": "ArithmeticUtilization"}


def _trace() -> dict[str, Any]:
    return json.loads(lzma.decompress(TRACE.read_bytes()))


def _steps(trace: dict[str, Any]) -> list[tuple[int, int]]:
    """The three training steps as [start, end) in wall ns: from the first zero_grad (then the
    previous step's end) to the end of the optimizer step, as jobprof's step detector cuts them."""
    base = trace["baseTimeNanoseconds"]
    ns = lambda us: base + round(us * 1000)  # noqa: E731
    host = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    zero = sorted(ns(e["ts"]) for e in host if e["name"].startswith("Optimizer.zero_grad"))
    ends = sorted(ns(e["ts"] + e["dur"]) for e in host if e["name"].startswith("Optimizer.step"))
    return [(zero[0] if i == 0 else ends[i - 1], end) for i, end in enumerate(ends)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Any]:
    """Every file the writers render for the three iterations, by (writer name, iteration)."""
    from jobprof.files import export, kinetotrace
    from jobprof.plugin.clock import ClockAnchor
    from jobprof.plugin.records import ITERATION_STREAM, OPS_STREAM
    from jobprof.plugin.values import Config, Iteration

    trace = _trace()
    device = tmp_path_factory.mktemp("cuda") / "PROF_000001_20261204000000000_CUDATRACE" / "device_0"
    for folder in ("data/" + kinetotrace.FOLDER, "summary", "timeline"):
        (device / folder).mkdir(parents=True)
    window = kinetotrace.window_name(1)
    data = json.dumps(trace).encode()
    (device / "data" / kinetotrace.FOLDER / window).write_bytes(gzip.compress(data))
    windows = kinetotrace.Windows(device / "data")
    manager = loaded_manager()
    config = Config(OPTIONS)
    # the clocks of a real process: records in monotonic ns (5,000 s after boot when the trace's
    # base was read), the window's offset maps Kineto's wall clock onto it, timelines count from
    # the job's time base (whole seconds), as a session records them
    base = trace["baseTimeNanoseconds"]
    shift = base - MONOTONIC_AT_BASE
    anchor = ClockAnchor(base, MONOTONIC_AT_BASE, MONOTONIC_AT_BASE)
    meta = export.DeviceMeta(0, 803, anchor, config, time_base_ns=base // 10**9 * 10**9)
    meta = export.with_metrics(meta, manager)
    writers = export.writers_for(manager, config)
    problems: list[str] = []
    records = {}
    for index, (start, end) in enumerate(_steps(trace), start=1):
        start, end = start - shift, end - shift
        ref = kinetotrace.reference(window, shift, len(data), index == 1, True)
        ops = windows.resolve([ref], start, end)
        records[index] = ops
        streams = {ITERATION_STREAM: [Iteration(index, start, end, "optimizer_step").to_record()],
                   OPS_STREAM: ops}
        export.render_iteration(device, meta, streams, writers, lambda p, m: problems.append(f"{p}: {m}"))
    # the training_trace writers need their own streams (not in a Kineto trace): they say so
    assert not [p for p in problems if not p.startswith("training_trace")], problems
    return {"device": device, "trace": trace, "records": records}


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def _rows(exported: dict[str, Any], name: str, index: int) -> list[dict[str, str]]:
    return _csv(exported["device"] / "summary" / f"{name}_0_{MODEL}_{index}.csv")


def _launched(trace: dict[str, Any], in_steps: bool = False) -> dict[int, dict[str, Any]]:
    """correlation -> the device event it launched (the trace's own link); ``in_steps``: only
    those launched inside one of the three steps (the trace runs on to the next zero_grad:
    what the loop does after the optimizer step, ``loss.item()``, is the next iteration's)."""
    launched = {e["args"]["correlation"]: e for e in trace["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS}
    if in_steps:
        steps = _steps(trace)
        starts = _launch_ns(trace)
        launched = {c: e for c, e in launched.items() if _step_of(trace, starts[c], steps)}
    return launched


def _launch_ns(trace: dict[str, Any]) -> dict[int, int]:
    """correlation -> when its runtime / driver call started (wall ns)."""
    base = trace["baseTimeNanoseconds"]
    return {e["args"]["correlation"]: base + round(e["ts"] * 1000) for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}


def _step_of(trace: dict[str, Any], ns: int, steps: list[tuple[int, int]]) -> int:
    """The step (1-3) whose span holds ``ns``; 0 for none."""
    return next((i for i, (s, e) in enumerate(steps, 1) if s <= ns < e), 0)


def test_every_device_event_of_each_step_is_one_task(exported):
    """Every kernel, copy and fill launched in a step is a row of that step's op_summary, once
    (a kernel the optimizer step queued runs after the host moved on: it stays with its step)."""
    trace = exported["trace"]
    launches, steps = _launch_ns(trace), _steps(trace)
    by_step = Counter(_step_of(trace, launches[c], steps) for c in _launched(trace))
    for index in (1, 2, 3):
        rows = _rows(exported, "op_summary", index)
        assert len(rows) == by_step[index] > 400, (index, len(rows), by_step[index])
        types = Counter(r["Task Type"] for r in rows)
        assert set(types) <= {"CUDA", "MEMCPY", "MEMSET"} and types["MEMCPY"] and types["MEMSET"], types


def test_kernels_are_attributed_to_the_operator_that_launched_them(exported):
    """The trace's own join: kernel -> correlation -> runtime call -> innermost ATen operator
    enclosing it on its thread; jobprof's OP Type must be that operator's, for every kernel."""
    trace = exported["trace"]
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    launched = _launched(trace, in_steps=True)
    ops_by_tid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"].startswith("aten::"):
            ops_by_tid[e["tid"]].append(e)
    expected: Counter[tuple[str, str]] = Counter()
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        kernel = launched.get(e["args"]["correlation"])
        if kernel is None:
            continue
        around = [o for o in ops_by_tid[e["tid"]]
                  if o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]]
        innermost = min(around, key=lambda o: o["dur"], default=None)
        assert innermost is not None, e  # every launch in this trace is inside an ATen operator
        expected[(kernel["name"], innermost["name"].removeprefix("aten::"))] += 1
    got: Counter[tuple[str, str]] = Counter()
    for index in (1, 2, 3):
        got.update((r["Op Name"], r["OP Type"]) for r in _rows(exported, "op_summary", index))
    assert got == expected
    # the GEMMs: OP Type mm with the operator's input shapes, the kernel's own name in Op Name;
    # cuBLAS also launches split-K reductions and memsets under mm: the call's FLOPs are on its
    # longest kernel (the GEMM), the others' N/A, so cube_fops sums to the operators' FLOPs
    mm = [r for i in (1, 2, 3) for r in _rows(exported, "op_summary", i) if r["OP Type"] == "mm"]
    assert mm and {r["Input Shapes"] for r in mm} >= {"4096,512;512,2048", "512,4096;4096,2048"}
    assert "aten::mm" not in {r["Op Name"] for r in mm}
    carrying = [r for r in mm if r["cube_fops"] != "N/A"]
    assert carrying and all("gemm" in r["Op Name"].lower() for r in carrying), \
        {r["Op Name"] for r in carrying}
    assert {r["Op Name"] for r in mm if r["cube_fops"] == "N/A"} >= {"Memset (Device)"}
    shapes = [r for r in carrying if r["Input Shapes"] == "4096,512;512,2048"]
    assert shapes and all(int(r["cube_fops"]) == 2 * 4096 * 512 * 2048 for r in shapes)
    calls = sum(1 for i in (1, 2, 3) for e in exported["records"][i]
                if e[0] == "aten::mm" and e[8] == [[4096, 512], [512, 2048]])
    assert len(shapes) == calls  # one carrying kernel per call


def test_op_type_is_never_a_fragment_of_a_kernel_signature(exported):
    for index in (1, 2, 3):
        for r in _rows(exported, "op_summary", index):
            assert not any(c in r["OP Type"] for c in "(),<>:") and " " not in r["OP Type"], r["OP Type"]


def test_block_dim_is_the_kernels_grid(exported):
    """Per kernel name, the multiset of Block Dims is the multiset of its launches' grid sizes."""
    expected: Counter[tuple[str, str]] = Counter()
    for e in _launched(exported["trace"], in_steps=True).values():
        x, y, z = e["args"]["grid"] if e["cat"] == "kernel" else (0, 0, 0)
        expected[(e["name"], str(x * y * z) if e["cat"] == "kernel" else "N/A")] += 1
    got = Counter((r["Op Name"], r["Block Dim"]) for i in (1, 2, 3) for r in _rows(exported, "op_summary", i))
    assert got == expected
    assert {b for _, b in got} - {"N/A"} and all(b == "N/A" or int(b) > 0 for _, b in got)


def test_memcpy_and_memset_are_typed_and_attributed(exported):
    rows = [r for i in (1, 2, 3) for r in _rows(exported, "op_summary", i)]
    copies = {(r["Op Name"], r["OP Type"]) for r in rows if r["Task Type"] == "MEMCPY"}
    fills = {(r["Op Name"], r["OP Type"]) for r in rows if r["Task Type"] == "MEMSET"}
    assert all(name.startswith("Memcpy ") for name, _ in copies), copies
    assert ("Memcpy DtoH (Device -> Pinned)", "_local_scalar_dense") in copies  # loss.item()
    assert fills and all(name == "Memset (Device)" for name, _ in fills), fills


def _timeline(exported: dict[str, Any], index: int) -> list[dict[str, Any]]:
    return json.loads((exported["device"] / "timeline" / f"msprof_0_{MODEL}_{index}.json").read_text())


def test_master_timeline_links_each_launch_to_its_kernel(exported):
    """One HostToDevice flow per task: its start on the runtime call's event, its end bound to
    the task's own event (same pid, tid and ts), as a viewer joins them."""
    for index in (1, 2, 3):
        events = _timeline(exported, index)
        slices = {(e["pid"], e["tid"], e["ts"]): e for e in events if e["ph"] == "X"}
        flows: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
        for e in events:
            if e.get("cat") == "HostToDevice":
                flows[e["id"]][e["ph"]] = e
        tasks = len(_rows(exported, "op_summary", index))
        assert len(flows) == tasks
        for pair in flows.values():
            start, end = slices[(pair["s"]["pid"], pair["s"]["tid"], pair["s"]["ts"])], \
                slices[(pair["f"]["pid"], pair["f"]["tid"], pair["f"]["ts"])]
            assert start["name"].startswith(("cuda", "cu")) and start["pid"] != end["pid"], (start, end)


def test_gpu_annotations_are_ranges_beside_their_stream_not_tasks(exported):
    for index in (1, 2, 3):
        events = _timeline(exported, index)
        names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        ranges = [e for e in events
                  if e["ph"] == "X" and e.get("args", {}).get("Event Type") == "gpu_user_annotation"]
        assert ranges and {names[(e["pid"], e["tid"])] for e in ranges} == {"Stream 7 ranges"}
        assert all(e["name"] == "Optimizer.step#AdamW.step" for e in ranges)
        assert not [r for r in _rows(exported, "op_summary", index) if r["Op Name"].startswith("Optimizer")]


def test_host_mark_only_on_operators_that_launched_nothing(exported):
    """aicpu's ``[host]``: a top-level operator under which no device work was launched,
    checked against the trace's launches inside each operator's span on its thread."""
    trace = exported["trace"]
    linked = _launched(trace, in_steps=True)
    # per operator name: whether its calls launched device work (some did / some did not)
    outcomes = launch_outcomes(trace, linked.__contains__)
    rows = [r for i in (1, 2, 3) for r in _rows(exported, "aicpu", i)]
    marked, unmarked = check_host_marks(rows, outcomes)
    assert marked and unmarked
    assert not [r for r in rows
                if r["Node"].startswith(("aten::linear", "aten::mm")) and r["Node"].endswith("[host]")]


def test_the_timelines_open_whole_in_perfettos_trace_processor(exported):
    """Perfetto's own importer (tests/perfetto_check.py): every slice and every flow kept."""
    pytest.importorskip("playwright")
    import perfetto_check

    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no chromium here (.ci/run installs it)")
    path = exported["device"] / "timeline" / f"msprof_0_{MODEL}_2.json"
    [result] = perfetto_check.check([path])
    assert not result.problems, result.problems
    tasks = len(_rows(exported, "op_summary", 2))
    assert result.flows == tasks, (result.flows, tasks)
