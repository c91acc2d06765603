"""runtime_api on traces recorded on real GPUs (tests/data), and on a real CPU-only job.

The GPU traces go through ``jobprof import`` (which turns runtime_api on where a trace holds
CUDA runtime / driver calls), then every check is against the trace itself, read here with
``json`` independently of jobprof: which ``cuda_runtime`` / ``cuda_driver`` events lie in each
imported iteration (host events by their start inside ``ProfilerStep#N``, else the whole trace),
their counts and durations per API name, their correlation ids, and the synchronising ones.
"""

from __future__ import annotations

import csv
import gzip
import json
import lzma
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Runner, clean_env

DATA = REPO / "tests" / "data"
H200 = DATA / "cuda_h200_lm_3steps.pt.trace.json.xz"
ALEXNET = DATA / "hta" / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
NCCL = DATA / "hta" / "nccl_parser_config_nccl_data.json.gz"
AMD = DATA / "hta" / "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz"
TRACES = {"h200": H200, "alexnet": ALEXNET, "nccl": NCCL, "amd": AMD}
MODEL = 4294967295
API_CATS = {"cuda_runtime": "runtime", "cuda_driver": "driver"}
#: what the test itself takes for synchronising, by name (the plugin's rule is its own code)
SYNC_NAMES = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize"}


def _sync_by_name(name: str) -> bool:
    copy = name.startswith(("cudaMemcpy", "cuMemcpy", "hipMemcpy")) and "Async" not in name
    return name in SYNC_NAMES or copy


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:6] == b"\xfd7zXZ\x00":
        raw = lzma.decompress(raw)
    return json.loads(raw)


def calls_per_iteration(trace: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """The trace's API events per iteration, as docs/import.md cuts them: host events by their
    start inside the host ``ProfilerStep#N`` (the first of a number), else all as iteration 1."""
    events = trace["traceEvents"]
    steps: dict[int, tuple[float, float]] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"):
            steps.setdefault(int(e["name"].split("#")[1]), (e["ts"], e["ts"] + e["dur"]))
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in API_CATS:
            continue
        if not steps:
            out[1].append(e)
            continue
        for n, (start, end) in steps.items():
            if start <= e["ts"] < end:
                out[n].append(e)
    return out


def run_jobprof(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "jobprof.cli.main", *args], capture_output=True, text=True,
                          env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each trace imported (the real command), its device folder by name."""
    out = {}
    for name, path in TRACES.items():
        folder = tmp_path_factory.mktemp(f"api_{name}")
        run_jobprof("import", str(path), "-o", str(folder), "--jobs", "1")
        [device] = folder.glob("PROF_*/device_0")
        out[name] = device
    return out


def rows(device: Path, iteration: int) -> list[dict[str, str]]:
    path = device / "summary" / f"api_statistic_0_{MODEL}_{iteration}.csv"
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def timeline(device: Path, iteration: int) -> list[dict[str, Any]]:
    return json.loads((device / "timeline" / f"msprof_0_{MODEL}_{iteration}.json").read_text())


@pytest.mark.parametrize("name", list(TRACES))
def test_every_call_is_counted_once(imported: dict[str, Path], name: str) -> None:
    """api_statistic per iteration: one row per (level, API), msprof's header, counts and total,
    min and max time equal to the trace's own events in that iteration (to the ns Kineto keeps)."""
    device = imported[name]
    info = json.loads((device / "info.json.0").read_text())["jobprof"]
    assert info["options"]["runtime_api"] == "on"
    expected = calls_per_iteration(load(TRACES[name]))
    written = {int(p.stem.rsplit("_", 1)[1]) for p in (device / "summary").glob("api_statistic_*.csv")}
    assert written == {n for n, evs in expected.items() if evs}
    for n in written:
        got = rows(device, n)
        assert list(got[0]) == ["Device_id", "Level", "API Name", "Time(us)", "Count", "Avg(us)", "Min(us)",
                                "Max(us)", "Variance"]
        by_api: dict[tuple[str, str], list[float]] = defaultdict(list)
        for e in expected[n]:
            by_api[(API_CATS[e["cat"]], e["name"])].append(e["dur"])
        assert {(r["Level"], r["API Name"]): int(r["Count"]) for r in got} == \
            {k: len(v) for k, v in by_api.items()}
        for r in got:
            durs = by_api[(r["Level"], r["API Name"])]
            assert float(r["Time(us)"]) == pytest.approx(sum(durs), abs=1e-3 * len(durs))
            assert float(r["Min(us)"]) == pytest.approx(min(durs), abs=1e-3)
            assert float(r["Max(us)"]) == pytest.approx(max(durs), abs=1e-3)
            mean = sum(durs) / len(durs)
            assert float(r["Avg(us)"]) == pytest.approx(mean, abs=2e-3)
            variance = sum((d - mean) ** 2 for d in durs) / len(durs)
            assert float(r["Variance"]) == pytest.approx(variance, rel=1e-3, abs=2e-3)
        totals = [float(r["Time(us)"]) for r in got]
        assert totals == sorted(totals, reverse=True)


@pytest.mark.parametrize("name", list(TRACES))
def test_timeline_api_layer_one_event_per_call(imported: dict[str, Path], name: str) -> None:
    """The master timeline's API process holds each call once (by correlation id), on its host
    thread's track, named by the innermost ATen operator around it on that thread (checked
    against the trace's cpu_op spans); the CANN layer no longer draws them; every HostToDevice
    flow starts on an API event."""
    device = imported[name]
    trace = load(TRACES[name])
    ops_by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "::" in e["name"] \
                and not e["name"].startswith(("autograd::", "torch::autograd::")):
            ops_by_thread[e["tid"]].append(e)
    for n, expected in calls_per_iteration(trace).items():
        if not expected:
            continue
        events = timeline(device, n)
        procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        api = [e for e in events if e.get("ph") == "X" and procs[e["pid"]] == "API"]
        assert Counter(e["args"]["Correlation Id"] for e in api) == \
            Counter(e["args"]["correlation"] for e in expected)
        assert not [e for e in events if e.get("ph") == "X" and procs[e["pid"]] == "CANN"
                    and e.get("args", {}).get("Event Type") in API_CATS]
        by_corr = {e["args"]["correlation"]: e for e in expected}
        for e in api:
            source = by_corr[e["args"]["Correlation Id"]]
            assert e["name"] == source["name"] and e["dur"] == pytest.approx(source["dur"], abs=1e-3)
            assert tracks[(e["pid"], e["tid"])].startswith(f"Thread {source['tid']}")
            assert e["args"]["Level"] == API_CATS[source["cat"]]
            around = [op for op in ops_by_thread[source["tid"]]
                      if op["ts"] <= source["ts"] and source["ts"] + source["dur"] <= op["ts"] + op["dur"]]
            innermost = min(around, key=lambda op: op["dur"])["name"] if around else "N/A"
            assert e["args"]["Operator"] == innermost, (e, innermost)
            assert e["args"]["Python frame"] == "N/A"  # no python_function events in these traces
        slices = {(e["pid"], e["tid"], e["ts"]) for e in api}
        starts = [e for e in events if e.get("cat") == "HostToDevice" and e["ph"] == "s"]
        assert starts and all((e["pid"], e["tid"], e["ts"]) in slices for e in starts)


def _sync_calls(trace: dict[str, Any], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The synchronising calls among ``calls``: by name, or a ``cuda_sync`` range of the same
    correlation that is the host waiting (not ``Stream Wait Event``, a device-side wait)."""
    waits = {e["args"]["correlation"] for e in trace["traceEvents"] if e.get("cat") == "cuda_sync"
             and e["args"].get("cuda_sync_kind", e["name"]) != "Stream Wait Event"}
    return [e for e in calls if _sync_by_name(e["name"]) or e["args"]["correlation"] in waits]


@pytest.mark.parametrize("name", list(TRACES))
def test_synchronising_calls_and_blocked_time(imported: dict[str, Path], name: str) -> None:
    """The summary's synchronising-call table and finding: every synchronising call of the trace
    counted, its host time as blocked time, by API; the cuda_sync ranges' kinds named."""
    device = imported[name]
    trace = load(TRACES[name])
    syncs = [e for calls in calls_per_iteration(trace).values() for e in _sync_calls(trace, calls)]
    assert syncs, "every recorded trace here has synchronising calls"
    done = run_jobprof("summary", "--json", str(device.parent))
    summary = json.loads(done.stdout)
    table = summary["sections"]["runtime_api_sync"]
    columns = table["columns"]  # JSON: slugs of the headers, N/A as null
    got_calls: Counter[str] = Counter()
    got_ms: defaultdict[str, float] = defaultdict(float)
    for row in table["rows"]:
        r = dict(zip(columns, row, strict=True))
        got_calls[r["api"]] += r["calls"]
        got_ms[r["api"]] += r["blocked_ms"]
        assert r["python_frame"] is None
    want_calls = Counter(e["name"] for e in syncs)
    assert got_calls == want_calls
    for api in want_calls:
        want = sum(e["dur"] for e in syncs if e["name"] == api) / 1000
        assert got_ms[api] == pytest.approx(want, abs=1e-3 * len(table["rows"]))
    [finding] = [f for f in summary["findings"] if f["key"] == "runtime_api_sync"]
    evidence = finding["evidence"]
    assert evidence["blocked_ns_total"] == pytest.approx(sum(e["dur"] for e in syncs) * 1000, abs=len(syncs))
    if name == "alexnet":  # Kineto's cuda_sync ranges: the device-side proof of the wait, named
        whys = {dict(zip(columns, row, strict=True))["why"] for row in table["rows"]}
        assert any("cuda_sync: Stream Sync" in w for w in whys), whys
        assert any("cuda_sync: Context Sync" in w for w in whys), whys
    if name == "h200":  # loss.item(): the D2H copy's stream synchronisation, by its operator
        ops = {dict(zip(columns, row, strict=True))["operator"] for row in table["rows"]}
        assert "aten::_local_scalar_dense" in ops
    if name == "amd":  # HIP: the synchronous copy behind .to("cpu")
        assert "hipMemcpyWithStream" in want_calls


CPU_JOB = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
"""


def test_cpu_only_job_says_so_once_and_writes_no_file(runner: Runner) -> None:
    """A real CPU-only job with runtime_api (and task_trace) on: no api_statistic file, no API
    layer, one line on stderr, the same in info.json."""
    proc = runner.run(CPU_JOB, {"training_trace": "on", "task_trace": "on", "runtime_api": "on"})
    lines = [ln for ln in proc.stderr.splitlines() if "runtime_api" in ln]
    assert len(lines) == 1 and "CPU only" in lines[0], proc.stderr
    assert "warning" not in lines[0] and "error" not in lines[0]
    device = runner.device_dir()
    assert not list((device / "summary").glob("api_statistic_*"))
    assert list((device / "summary").glob("op_summary_*"))  # the job was profiled
    info = json.loads((device / "info.json.0").read_text())["jobprof"]
    assert lines[0] in info["messages"]
    assert info["runtime_api"] == {"available": False, "reason": "CPU only: no CUDA runtime"}
    for path in (device / "timeline").glob("msprof_0_*.json"):
        events = json.loads(path.read_text())
        assert not [e for e in events if e.get("name") == "process_name" and e["args"]["name"] == "API"]


def test_bad_value_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "jobprof.cli.main", "check", "--options",
                           '{"runtime_api": "maybe"}'], capture_output=True, text=True, env=clean_env(),
                          timeout=60)
    assert done.returncode == 1
    assert "$.runtime_api" in done.stdout + done.stderr


def test_task_trace_off_keeps_the_api_data(tmp_path: Path) -> None:
    """With task_trace off (options as info.json records them), ``jobprof export`` renders
    api_statistic byte for byte as before, and the API layer on its own (no CANN layer)."""
    run_jobprof("import", str(AMD), "-o", str(tmp_path), "--jobs", "1")
    [device] = tmp_path.glob("PROF_*/device_0")
    before = (device / "summary" / f"api_statistic_0_{MODEL}_1.csv").read_bytes()
    path = device / "info.json.0"
    info = json.loads(path.read_text())
    info["jobprof"]["options"]["task_trace"] = "off"
    path.write_text(json.dumps(info))
    for old in [*(device / "summary").iterdir(), *(device / "timeline").iterdir()]:
        old.unlink()
    run_jobprof("export", str(device.parent))
    assert (device / "summary" / f"api_statistic_0_{MODEL}_1.csv").read_bytes() == before
    assert not list((device / "summary").glob("op_summary_*"))
    events = timeline(device, 1)
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    api = [e for e in events if e.get("ph") == "X" and procs[e["pid"]] == "API"]
    assert len(api) == len(calls_per_iteration(load(AMD))[1]) and "CANN" not in procs.values()
