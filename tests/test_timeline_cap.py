"""An op-heavy iteration stays bounded: its timelines are capped, announced, recorded, and the
CSVs still hold every task.

A real LBFGS loop (each optimizer step runs its closure up to 20 times: thousands of operators
per iteration, the shape of program that once wrote a 272 MB master timeline for one step) is
profiled with a small ``timeline_max_events``; the same job with the default limit shows the
cap only acts past it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import perfetto_check as perfetto
from conftest import Runner, check_timeline, jobprof_cli, read_csv

MODEL = 4294967295
LIMIT = 1500
STEPS = 3
JOB = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
x, y = torch.randn(32, 8), torch.randn(32, 1)
opt = torch.optim.LBFGS(model.parameters(), max_iter=20, history_size=10)


def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


for step in range(STEPS):
    print("loss", step, float(opt.step(closure)))
""".replace("STEPS", str(STEPS))
OPTIONS = {"training_trace": "on", "task_trace": "l0"}
NOTE = f"master timeline capped at timeline_max_events={LIMIT}"


def _profile(tmp: Path, options: dict) -> tuple[Runner, str]:
    runner = Runner(tmp)
    proc = runner.run(JOB, options, timeout=300)
    return runner, proc.stderr


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runner, str]:
    return _profile(tmp_path_factory.mktemp("capped"), {**OPTIONS, "timeline_max_events": LIMIT})


def _operator_events(events: list[dict]) -> tuple[list[dict], list[dict], int]:
    """(host calls, device tasks, flow ends) of the operator tier in a master timeline."""
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    host = {pid for pid, name in names if name == "CANN"}
    device = {pid for pid, name in names if name == "Ascend Hardware"}
    calls = [e for e in events if e["ph"] == "X" and e["pid"] in host]
    tasks = [e for e in events if e["ph"] == "X" and e["pid"] in device and "Task Id" in e.get("args", {})]
    flows = sum(e["ph"] in ("s", "f") and e["cat"] == "HostToDevice" for e in events)
    return calls, tasks, flows


def test_each_capped_iteration_keeps_the_first_events_and_says_where_it_stops(capped) -> None:
    runner, _ = capped
    device = runner.device_dir()
    for iteration in range(1, STEPS + 1):
        path = device / "timeline" / f"msprof_0_{MODEL}_{iteration}.json"
        events = check_timeline(path)  # schema, whole-ns times, nesting, paired flows
        calls, tasks, flows = _operator_events(events)
        assert len(calls) + len(tasks) + flows <= LIMIT
        markers = [e for e in events if e["name"] == "jobprof: timeline capped"]
        assert len(markers) == 1, markers
        args = markers[0]["args"]
        assert args["timeline_max_events"] == LIMIT and args["kept events"] <= LIMIT < args["events"]
        # the CSVs are whole: every task, of which the timeline holds the first ones in time order
        rows = read_csv(device / "summary" / f"op_summary_0_{MODEL}_{iteration}.csv")
        assert len(rows) > len(tasks) > 0
        assert [t["name"] for t in tasks] == [r["Op Name"] for r in rows[:len(tasks)]]
        assert all(e["ts"] < markers[0]["ts"] for e in calls + tasks)
        task_json = json.loads((device / "timeline" / f"task_time_0_{MODEL}_{iteration}.json").read_text())
        assert sum(e["ph"] == "X" for e in task_json) == min(len(rows), LIMIT)


def test_the_cap_is_said_once_and_recorded_in_info_json(capped) -> None:
    runner, stderr = capped
    lines = [line for line in stderr.splitlines() if NOTE in line]
    assert len(lines) == 1 and lines[0].endswith(f"iteration(s) 1-{STEPS}"), stderr
    info = json.loads((runner.device_dir() / "info.json.0").read_text())
    notes = {n["note"]: n["iterations"] for n in info["jobprof"]["export_notes"]}
    assert [its for note, its in notes.items() if note.startswith(NOTE)] == [list(range(1, STEPS + 1))]


def test_export_renders_the_same_capped_files_and_repeats_the_note(capped, tmp_path: Path) -> None:
    runner, _ = capped
    copy = tmp_path / "prof"
    shutil.copytree(runner.out, copy)
    timelines = sorted((runner.device_dir() / "timeline").glob("msprof_*.json"))
    for path in (copy / runner.device_dir().parent.name / "device_0" / "timeline").glob("*.json"):
        path.unlink()
    done = jobprof_cli("export", str(copy))
    assert done.returncode == 0, done.stderr
    assert f"note: {NOTE}" in done.stdout and done.stdout.rstrip().endswith(f"iteration(s) 1-{STEPS}")
    again = copy / runner.device_dir().parent.name / "device_0" / "timeline"
    for path in timelines:
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name


def test_under_the_default_limit_nothing_is_capped(tmp_path: Path, capped) -> None:
    runner, stderr = _profile(tmp_path, OPTIONS)
    assert "capped" not in stderr
    events = json.loads((runner.device_dir() / "timeline" / f"msprof_0_{MODEL}_2.json").read_text())
    _, tasks, _ = _operator_events(events)
    rows = read_csv(runner.device_dir() / "summary" / f"op_summary_0_{MODEL}_2.csv")
    assert len(tasks) == len(rows) and not any(e["name"] == "jobprof: timeline capped" for e in events)
    info = json.loads((runner.device_dir() / "info.json.0").read_text())
    assert info["jobprof"]["export_notes"] == []


@pytest.mark.slow
@pytest.mark.skipif(not Path(perfetto.CHROMIUM).exists(), reason="no Debian chromium here")
def test_a_capped_timeline_opens_whole_in_perfetto(capped) -> None:
    runner, _ = capped
    path = runner.device_dir() / "timeline" / f"msprof_0_{MODEL}_2.json"
    with perfetto.Checker() as checker:
        result = checker.check_file(path)
    assert result.problems == {}, result.problems
    # every X event a slice, every flow start a flow, and the cut's marker (an instant: Perfetto
    # imports it as a slice of its own) shown too
    assert result.file_counts.get("i") == 1, result.file_counts
    counts = (result.file_counts.get("X", 0) + 1, result.file_counts.get("s", 0))
    assert (result.slices, result.flows) == counts
