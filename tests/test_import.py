"""``jobprof import`` on traces recorded on real GPUs by others (tests/data/README.md).

Each check is against the trace itself, read here independently of jobprof (json, its
``args.correlation`` links, its ProfilerStep spans), or against HTA reading the same files
(test_import_hta.py): never against jobprof's own reading of it.
"""

from __future__ import annotations

import csv
import gzip
import json
import lzma
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, clean_env
from tracecheck import check_host_marks, launch_outcomes, union

DATA = REPO / "tests" / "data"
HTA = DATA / "hta"
NCCL = HTA / "nccl_parser_config_nccl_data.json.gz"
AMD = HTA / "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz"
ALEXNET = HTA / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
CUPTI = HTA / "cupti_profiler_benchmark_result_924719_1679055439_trace.json.gz"
TRITON = HTA / "triton_example_triton_example.json.gz"
H200 = DATA / "cuda_h200_lm_3steps.pt.trace.json.xz"
SAMPLED = HTA / "trace_filter_sampled"
FIXTURES = {"nccl": NCCL, "amd": AMD, "alexnet": ALEXNET, "cupti": CUPTI, "triton": TRITON, "h200": H200}
MODEL = 4294967295
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TASK_TYPES = {"kernel": "CUDA", "gpu_memcpy": "MEMCPY", "gpu_memset": "MEMSET"}


def jobprof(*args: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "jobprof.cli.main", *args], capture_output=True, text=True,
                          env=clean_env(), cwd=cwd, timeout=300)
    if check:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def load(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    data = lzma.decompress(data) if path.suffix == ".xz" else gzip.decompress(data)
    return json.loads(data)


def prof_of(output: Path) -> Path:
    found = [p for p in output.iterdir() if p.name.startswith("PROF_")]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    """Every fixture imported once (a PROF_ folder each), and the 2-rank set as one."""
    out = {}
    for name, path in [*FIXTURES.items(), ("sampled", SAMPLED)]:
        folder = tmp_path_factory.mktemp(name)
        done = jobprof("import", str(path), "-o", str(folder / "prof"), "--jobs", "2")
        assert "rank" in done.stdout, done.stdout
        out[name] = prof_of(folder / "prof")
    return out


def steps(trace: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """ProfilerStep#N -> [start, end) in ns of the trace's clock (host annotations only)."""
    out: dict[int, tuple[int, int]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op") and \
                str(e.get("name", "")).startswith("ProfilerStep#"):
            out.setdefault(int(e["name"].split("#")[1]), (ns(trace, e["ts"]), ns(trace, e["ts"] + e["dur"])))
    return out


def ns(trace: dict[str, Any], us: float) -> int:
    return trace.get("baseTimeNanoseconds", 0) + round(us * 1000)


def device_events_by_step(trace: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Per step, the kernels / copies / fills launched in it (the trace's own correlation); a
    trace without steps: all of them, as step 1."""
    launches = {e["args"]["correlation"]: ns(trace, e["ts"]) for e in trace["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}
    spans = steps(trace)
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATS:
            continue
        at = launches.get(e["args"].get("correlation"), ns(trace, e["ts"]))
        if not spans:
            out[1].append(e)
            continue
        owner = next((n for n, (s, end) in spans.items() if s <= at < end), None)
        if owner is not None:
            out[owner].append(e)
    return out


def rows(prof: Path, name: str, rank: int, iteration: int, none_ok: bool = False) -> list[dict[str, str]]:
    """A summary CSV's rows; ``none_ok``: [] when the writer wrote no file (nothing to list)."""
    path = prof / f"device_{rank}" / "summary" / f"{name}_{rank}_{MODEL}_{iteration}.csv"
    if none_ok and not path.exists():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def info(prof: Path, rank: int) -> dict[str, Any]:
    return json.loads((prof / f"device_{rank}" / f"info.json.{rank}").read_text())


@pytest.mark.parametrize("name", [n for n in FIXTURES if n != "cupti"])
def test_every_device_event_is_one_task_and_time_sums_exactly(imported, name):
    """Per iteration, the kernels, copies and fills are op_summary's rows, once each, and their
    time per Task Type equals the trace's own durations of those events (to the ns the trace
    holds, printed to 3 decimals of µs)."""
    trace = load(FIXTURES[name])
    prof = imported[name]
    by_step = device_events_by_step(trace)
    assert by_step and sum(map(len, by_step.values())) > 0
    expected_steps = sorted(steps(trace)) or [1]
    assert sorted(info(prof, 0)["jobprof"]["imported"][0]["steps"]) == expected_steps
    for step in expected_steps:
        events = by_step.get(step, [])
        got = rows(prof, "op_summary", 0, step, none_ok=not events)
        assert Counter(r["Op Name"] for r in got) == Counter(e["name"] for e in events), step
        for cat, task_type in TASK_TYPES.items():
            want = sum(round(e["dur"] * 1000) for e in events if e["cat"] == cat)
            have = sum(round(float(r["Task Duration(us)"]) * 1000) for r in got if r["Task Type"] == task_type
                       or (task_type == "CUDA" and r["Task Type"] == "COMMUNICATION"))
            assert abs(have - want) <= len(got), (step, cat, have, want)  # 1 ns per row of rounding at most


def test_nccl_kernels_are_collectives_once_with_record_param_comms_bytes(imported):
    """Every NCCL kernel of a step is one collective in hccl's files; type, group, ranks and
    bytes are record_param_comms' (In/Out msg nelems x the dtype's size)."""
    trace = load(NCCL)
    prof = imported["nccl"]
    by_step = device_events_by_step(trace)
    params = [e["args"] for e in trace["traceEvents"] if e.get("name") == "record_param_comms"]
    width = {"Float": 4, "Long": 8, "Byte": 1}
    sizes = {(p["Collective name"], max(p["In msg nelems"], p["Out msg nelems"]) * width[p["dtype"]])
             for p in params}
    for step, events in by_step.items():
        nccl = [e for e in events if e["name"].startswith("nccl")]
        timeline = json.loads((prof / "device_0" / "timeline" / f"hccl_0_{MODEL}_{step}.json").read_text())
        calls = [e for e in timeline if e.get("ph") == "X"]
        assert len(calls) == len(nccl) > 0, step
        assert sorted(round(e["dur"], 3) for e in calls) == sorted(round(e["dur"], 3) for e in nccl)
        stats = rows(prof, "communication_statistic", 0, step)
        assert sum(int(r["Count"]) for r in stats) == len(nccl)
        for call in calls:
            args = call["args"]
            assert args["group"] == "0" and args["group ranks"] == [0, 1], args
            name = {"all_reduce": "allreduce", "broadcast": "broadcast"}[call["name"]]
            assert (name, args["size(Byte)"]) in sizes, args
    assert info(prof, 0)["jobprof"]["world_size"] == 2 and info(prof, 0)["rank_id"] == 0


def test_attribution_block_dim_and_flows(imported):
    """OP Type is the ATen operator around the launch (the trace's own join), Block Dim the
    grid's product, and each task has its launch -> task flow on the master timeline."""
    trace = load(NCCL)
    prof = imported["nccl"]
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ops_by_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"].startswith("aten::"):
            ops_by_tid[e["tid"]].append(e)
    launched = {e["args"]["correlation"]: e for es in device_events_by_step(trace).values() for e in es}
    expected: Counter[tuple[str, str, str]] = Counter()
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or e["args"]["correlation"] not in launched:
            continue
        kernel = launched[e["args"]["correlation"]]
        around = [o for o in ops_by_tid[e["tid"]]
                  if o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]]
        innermost = min(around, key=lambda o: o["dur"], default=None)
        grid = kernel["args"].get("grid") if kernel["cat"] == "kernel" else None
        block = str(grid[0] * grid[1] * grid[2]) if grid else "N/A"
        op = innermost["name"].removeprefix("aten::") if innermost else "N/A"
        expected[(kernel["name"], op, block)] += 1
    got = Counter((r["Op Name"], r["OP Type"], r["Block Dim"]) for step in (4, 5, 6)
                  for r in rows(prof, "op_summary", 0, step))
    # the trace's own launches outside any ATen operator (a DDP bucket's NCCL call from C++)
    # have no operator to name: jobprof names them by the innermost dispatcher op it sees
    differ = {k: (got[k], expected[k]) for k in set(got) | set(expected) if got[k] != expected[k]}
    assert sum(got.values()) == sum(expected.values())
    assert all(k[1] == "N/A" or k[0].startswith("nccl") for k in differ), differ
    timeline = json.loads((prof / "device_0" / "timeline" / f"msprof_0_{MODEL}_4.json").read_text())
    flows = Counter(e["ph"] for e in timeline if e.get("cat") == "HostToDevice")
    assert flows["s"] == flows["f"] == len(rows(prof, "op_summary", 0, 4))


def test_host_mark_only_on_operators_that_launched_nothing(imported):
    """aicpu's ``[host]``: an operator some call of which launched no device work, checked
    against the trace's own launches inside each call's span on its thread."""
    aicpu = [r for step in (4, 5, 6) for r in rows(imported["nccl"], "aicpu", 0, step)]
    marked, unmarked = check_host_marks(aicpu, launch_outcomes(load(NCCL)))
    assert marked and unmarked


def test_annotations_step_points_and_overlap(imported):
    prof = imported["nccl"]
    trace = load(NCCL)
    timeline = json.loads((prof / "device_0" / "timeline" / f"msprof_0_{MODEL}_5.json").read_text())
    procs = {e["pid"]: e["args"]["name"] for e in timeline if e.get("name") == "process_name"}
    ranges = [e for e in timeline
              if e.get("ph") == "X" and e.get("args", {}).get("Event Type") == "gpu_user_annotation"]
    assert ranges  # the GPU's view of record_function blocks, as ranges beside their stream
    overlap = Counter()
    for e in timeline:
        if e.get("ph") == "X" and procs.get(e["pid"]) == "Overlap Analysis":
            overlap[e["name"]] += round(e["dur"] * 1000)
    assert set(overlap) == {"Computing", "Communication", "Communication(Not Overlapped)", "Free"}
    # busy time = the union of the step's device work, from the trace itself
    busy = union((ns(trace, e["ts"]), ns(trace, e["ts"] + e["dur"])) for e in device_events_by_step(trace)[5])
    assert abs(overlap["Computing"] + overlap["Communication(Not Overlapped)"] - busy) < 1000
    step = rows(prof, "step_trace", 0, 5)[0]
    assert float(step["FP Start(us)"]) < float(step["BP End(us)"]) < float(step["Iteration End(us)"])


@pytest.mark.parametrize("name", ["amd", "alexnet", "triton", "h200", "cupti"])
def test_single_gpu_fixtures(imported, name):
    prof = imported[name]
    meta = info(prof, 0)
    provenance = meta["jobprof"]["imported"][0]
    assert provenance["sha256"] and provenance["source"].endswith(FIXTURES[name].name)
    if name == "amd":
        assert meta["DeviceInfo"][0]["type"] == "ROCm"
        assert any(r["OP Type"] for r in rows(prof, "op_summary", 0, 1))
    if name in ("alexnet", "h200", "cupti"):
        assert meta["jobprof"]["iteration_method"].startswith("whole trace")
    if name == "alexnet":  # cuda_sync: what the device waited in, beside its stream, not a host call
        trace = load(FIXTURES[name])
        syncs = Counter(e["args"]["stream"] for e in trace["traceEvents"] if e.get("cat") == "cuda_sync")
        timeline = json.loads((prof / "device_0" / "timeline" / f"msprof_0_{MODEL}_1.json").read_text())
        procs = {e["pid"]: e["args"]["name"] for e in timeline if e.get("name") == "process_name"}
        tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in timeline if e.get("name") == "thread_name"}
        drawn = Counter(tracks[(e["pid"], e["tid"])] for e in timeline
                        if e.get("ph") == "X" and e.get("args", {}).get("Event Type") == "cuda_sync")
        assert drawn == {f"Stream {s} ranges" if s >= 0 else "Device-wide ranges": n
                         for s, n in syncs.items()}
        assert not [e for e in timeline if e.get("ph") == "X" and procs[e["pid"]] == "CANN"
                    and e["name"].endswith(" Sync")]
    if name == "triton":  # a torch.compile kernel launched through cuLaunchKernel
        (row,) = rows(prof, "op_summary", 0, 1)
        assert row["Op Name"].startswith("triton") and row["Task Type"] == "CUDA"
    if name == "cupti":  # CUPTI profiler ranges, no kernel activity: as a CPU-only job, the host
        # operators are the tasks (docs/import.md), never a made-up device task
        assert {r["Task Type"] for r in rows(prof, "op_summary", 0, 1)} == {"CPU"}


def test_two_ranks_cluster_and_per_rank(imported, tmp_path):
    prof = imported["sampled"]
    assert {info(prof, r)["rank_id"] for r in (0, 1)} == {0, 1}
    summary = json.loads(jobprof("summary", "--json", str(prof)).stdout)
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    # the sampled traces keep no record_param_comms args: the operation is the c10d operator
    # around the launch, the size the nccl: block's input; the group is N/A (128 ranks, none named)
    for rank in (0, 1):
        ops = {r["OP Type"] for r in rows(prof, "communication_statistic", rank, 551)}
        assert ops == {"all_to_all_single", "all_reduce", "all_gather_into_tensor"}, ops
    done = jobprof("export", str(prof), "--per-rank", str(tmp_path / "per"))
    assert "collective call(s)" in done.stdout
    matrix = list((tmp_path / "per").glob("*/analyze/communication.json"))
    assert len(matrix) == 2


def test_every_command_reads_an_import(imported, tmp_path):
    prof = imported["nccl"]
    jobprof("report", str(prof), "-o", str(tmp_path / "r.html"))
    assert "<svg" in (tmp_path / "r.html").read_text()
    jobprof("merge", str(prof), "-o", str(tmp_path / "m.json"))
    jobprof("kineto", str(prof), "-o", str(tmp_path / "k"))
    jobprof("export", str(prof), "--layout", "cann8")
    diff = jobprof("diff", str(imported["nccl"]), str(imported["h200"])).stdout
    assert "NVIDIA A100" in diff and "NVIDIA H200" in diff, diff
    assert "different jobs" in diff and "world size 2 (A) vs N/A (B)" in diff, diff


def test_a_trace_without_steps_says_so(imported):
    text = jobprof("summary", str(imported["alexnet"])).stdout
    assert "whole trace" in text


def test_legacy_categories_and_unknown_ones(tmp_path):
    """Kineto's 2021 names (Operator, Kernel, Runtime, Memcpy, Memset) read as today's; an
    unknown category is kept and counted once."""
    trace = load(TRITON)
    legacy = {"cpu_op": "Operator", "kernel": "Kernel", "cuda_runtime": "Runtime", "cuda_driver": "Runtime"}
    for e in trace["traceEvents"]:
        if e.get("cat") in legacy:
            e["cat"] = legacy[e["cat"]]
    trace["traceEvents"].append({"ph": "X", "cat": "made_up_category", "name": "x", "pid": 1, "tid": 1,
                                 "ts": trace["traceEvents"][-3]["ts"], "dur": 1})
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(trace))
    done = jobprof("import", str(path), "-o", str(tmp_path / "out"))
    assert "made_up_category (1)" in done.stderr
    (row,) = rows(prof_of(tmp_path / "out"), "op_summary", 0, 1)
    assert row["Task Type"] == "CUDA"


def test_files_of_one_rank_are_joined(tmp_path):
    """A schedule's repeats: two files of rank 0 with other steps are one device, both kept."""
    trace = load(AMD)
    first, second = json.loads(json.dumps(trace)), json.loads(json.dumps(trace))
    for e in second["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + 10}"
    for t in (first, second):
        t["distributedInfo"] = {"rank": 0, "world_size": 1}
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text(json.dumps(first))
    (tmp_path / "in" / "b.json").write_text(json.dumps(second))
    jobprof("import", str(tmp_path / "in"), "-o", str(tmp_path / "out"))
    prof = prof_of(tmp_path / "out")
    assert [p.name for p in prof.iterdir() if p.name.startswith("device_")] == ["device_0"]
    files = info(prof, 0)["jobprof"]["imported"]
    assert sorted(files[0]["steps"] + files[1]["steps"]) == [1, 2, 11, 12]


# -- untrusted input ------------------------------------------------------------------------
def _hostile(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Bad files, each with what its message must say."""
    good = gzip.decompress(TRITON.read_bytes())
    trace = json.loads(good)
    folder = tmp_path / "bad"
    folder.mkdir()
    cases: dict[str, tuple[bytes | None, str]] = {
        "truncated.json.gz": (gzip.compress(good)[:-200], "truncated"),
        "corrupt.json.gz": (b"\x1f\x8b\x08\x00" + b"\x00" * 40, "gzip"),
        "notjson.json": (b"hello, not json", "not valid JSON"),
        "array.json": (b"[1, 2, 3]", "a JSON array"),
        "empty.json": (b"", "empty"),
        "noevents.json": (b'{"schemaVersion": 1}', "no traceEvents"),
        "eventsobject.json": (b'{"traceEvents": {"a": 1}}', "not an array"),
        "cutshort.json": (good[: len(good) // 2], "not valid JSON"),
    }
    # NaN is no JSON (Python's json writes it, Kineto does not): the parser's own message
    t = json.loads(good)
    t["traceEvents"][0]["ts"] = float("nan")
    cases["nan.json"] = (json.dumps(t).encode(), "not valid JSON")
    for label, bad in {"negative-dur": -5.0, "huge": 1e300, "text": "12", "negative-ts": -1e16}.items():
        t = json.loads(good)
        key = "dur" if label == "negative-dur" else "ts"
        x = next(i for i, e in enumerate(t["traceEvents"]) if e.get("ph") == "X")
        t["traceEvents"][x][key] = bad
        cases[f"{label}.json"] = (json.dumps(t).encode(), f"event {x} of traceEvents")
    # args 5,000 levels deep (written as text: json itself cannot encode that)
    t = json.loads(good)
    x = next(i for i, e in enumerate(t["traceEvents"]) if e.get("ph") == "X")
    t["traceEvents"][x]["args"] = "DEEP"
    deep = json.dumps(t).encode().replace(b'"DEEP"', b'{"a": ' * 5000 + b"1" + b"}" * 5000)
    cases["deep.json"] = (deep, f"event {x} of traceEvents: args nested too deeply")
    t = json.loads(good)
    t["traceEvents"][x] = 7
    cases["notevent.json"] = (json.dumps(t).encode(), "not an event object")
    out = {}
    for name, (data, says) in cases.items():
        (folder / name).write_bytes(data or b"")
        out[name] = (folder / name, says)
    (folder / "link.json").symlink_to(folder / "notjson.json")
    out["link.json"] = (folder / "link.json", "symbolic link")
    import os

    os.mkfifo(folder / "fifo.json")
    out["fifo.json"] = (folder / "fifo.json", "FIFO")
    del trace
    return out


def test_bad_files_are_named_and_cost_only_themselves(tmp_path):
    cases = _hostile(tmp_path)
    good = tmp_path / "good.json.gz"
    shutil.copy(TRITON, good)
    done = jobprof("import", str(tmp_path / "bad"), str(good), "-o", str(tmp_path / "out"), "--jobs", "2",
                   check=False)
    assert done.returncode == 1, done
    for name, (path, says) in cases.items():
        lines = [line for line in done.stderr.splitlines() if path.name in line and "error" in line]
        assert len(lines) == 1 and says in lines[0], (name, says, done.stderr)
    # the good file is imported; nothing half-written is left beside the profile
    prof = prof_of(tmp_path / "out")
    (device,) = [p for p in prof.iterdir() if p.name.startswith("device_")]  # the bad files' ranks: none
    rank = int(device.name.split("_")[1])
    assert len(rows(prof, "op_summary", rank, 1)) == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [prof.name]


def test_nothing_importable_leaves_nothing(tmp_path):
    (tmp_path / "x.json").write_text("[]")
    done = jobprof("import", str(tmp_path / "x.json"), "-o", str(tmp_path / "out"), check=False)
    assert done.returncode == 1 and "a JSON array" in done.stderr and "nothing imported" in done.stderr
    assert not any((tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else True


def test_collective_names_match_the_hccl_plugin():
    """The import names collectives as the live hccl plugin names the c10d operators."""
    from jobprof.imports.collectives import OPERATIONS
    from jobprof.plugins.hccl.collectives import OPERATORS

    live = {c.name for c in OPERATORS.values()}
    assert set(OPERATIONS.values()) <= live


def test_header_from_head_and_tail_or_the_whole_file(tmp_path, monkeypatch):
    """The top-level keys are read from the file's head and tail; where that is in doubt (a list
    of objects after the events could be taken for their end; keys before the events longer
    than the head), the whole file is parsed: the same header either way."""
    from jobprof.imports import source

    trace = load(TRITON)
    base = trace.pop("baseTimeNanoseconds")
    events = trace.pop("traceEvents")
    # Kineto's order, then the base after a list of objects that ends like the event array
    odd = {**trace, "traceEvents": events, "baseTimeNanoseconds": base, "later": [{"a": 1}, {"b": [2]}]}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(odd))
    header = source.read_header(path)
    assert header.base_ns == base and header.other["traceName"] == trace["traceName"]
    monkeypatch.setattr(source, "HEAD_BYTES", 64)  # the keys before the events exceed the head
    assert source.read_header(path) == header
    with pytest.raises(source.TraceError, match="traceEvents is not an array"):
        (tmp_path / "bad.json").write_text(json.dumps({**trace, "traceEvents": 5}))
        source.read_header(tmp_path / "bad.json")


def test_command_line_mistakes_are_named(tmp_path):
    missing = jobprof("import", str(tmp_path / "nope.json"), "-o", str(tmp_path / "out"), check=False)
    assert missing.returncode == 1 and "nope.json" in missing.stderr and "nothing imported" in missing.stderr
    (tmp_path / "file").write_text("x")
    onto_file = jobprof("import", str(TRITON), "-o", str(tmp_path / "file"), check=False)
    assert onto_file.returncode == 1 and "file" in onto_file.stderr and "Traceback" not in onto_file.stderr
    zero = jobprof("import", str(TRITON), "--jobs", "0", "-o", str(tmp_path / "out"), check=False)
    assert zero.returncode == 2 and "--jobs" in zero.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    none = jobprof("import", str(empty), "-o", str(tmp_path / "out"), check=False)
    assert none.returncode == 1 and "no trace files in it" in none.stderr


TORCH_PROFILER_JOB = """
import sys, torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 64), torch.randn(32, 8)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
             schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
             on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name="trainer",
                                                      use_gzip=True)) as prof:
    for _ in range(8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        prof.step()
"""


@pytest.mark.torch_versions  # the traces every supported torch writes (the version legs)
def test_a_torch_profiler_job_on_this_machine(tmp_path):
    """torch.profiler itself, as users run it: a schedule of two cycles of two active steps,
    tensorboard_trace_handler writing one gzip'd file per cycle (no distributedInfo: one
    process).  Both files are one rank; the steps keep torch's numbers; the operators are the
    trace's."""
    logs = tmp_path / "log"
    subprocess.run([sys.executable, "-c", TORCH_PROFILER_JOB, str(logs)], check=True, env=clean_env(),
                   timeout=300, capture_output=True)
    files = sorted(logs.glob("trainer.*.pt.trace.json.gz"))
    assert len(files) == 2, files
    done = jobprof("import", str(logs), "-o", str(tmp_path / "prof"))
    assert "2 files of worker trainer" in done.stderr, done.stderr
    prof = prof_of(tmp_path / "prof")
    assert [p.name for p in prof.iterdir() if p.name.startswith("device_")] == ["device_0"]
    expected = sorted(n for f in files for n in steps(load(f)))
    assert expected == [2, 3, 6, 7]
    imported = sorted(s for i in info(prof, 0)["jobprof"]["imported"] for s in i["steps"])
    assert imported == expected
    for step in expected:
        trace = load(next(f for f in files if step in steps(load(f))))
        start, end = steps(trace)[step]
        aten = {e["name"].removeprefix("aten::") for e in trace["traceEvents"]
                if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")
                and start <= ns(trace, e["ts"]) < end}
        got = rows(prof, "op_summary", 0, step)
        assert got and {r["OP Type"] for r in got} <= aten and {r["Task Type"] for r in got} == {"CPU"}
        # on a CPU job the task is the top-level operator (linear, around its addmm), with its inputs
        assert ("linear", "32,64;128,64;128") in {(r["OP Type"], r["Input Shapes"]) for r in got}
    # the cycles' gap (the steps the schedule waited and warmed up in) named as such
    summary = jobprof("summary", str(prof)).stdout
    assert "no raw data for iteration(s) 4-5 (not in the imported traces)" in summary
