"""The job ends when it ends: what its exit does not render, a detached exporter does
(option ``export``: "background", the default; "inline"; "off").  Real jobs of 600 tiny
iterations with the operator tier, whose rendering takes seconds: the job's process returns
while its exporter renders; stopped (SIGSTOP) or killed (SIGKILL) exporters are what the
summary names; ``jobprof export --wait`` finishes what a killed one left, to the same files
a job rendering everything itself writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import clean_env, jobprof_cli

STEPS = 600
JOB = """
import sys, time, torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
print("trained", time.time(), flush=True)
"""
OPTIONS = {"training_trace": "on", "task_trace": "l1"}


def start(tmp: Path, name: str, options: dict,
          hold: bool = False) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the job; returns it and its device folder.  ``hold``: stop (SIGSTOP) the job's
    exporter as soon as its hand-over appears, so the test sees it at work whatever its speed."""
    (tmp / "job.py").write_text(JOB)
    out = tmp / name
    # the exporter at its default priority (the suite's helpers run it at nice 0)
    env = clean_env(PROFILING_MODE="true", PROFILING_OPTIONS=json.dumps({"output": str(out), **options}),
                    JOBPROF_EXPORTER_NICE="")
    job = subprocess.Popen([sys.executable, str(tmp / "job.py"), str(STEPS)], cwd=tmp, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    held = False
    while hold and job.poll() is None:
        found = list(out.glob("PROF_*/device_0/data/exporter.json"))
        if found and found[0].stat().st_size:
            os.kill(json.loads(found[0].read_text())["pid"], signal.SIGSTOP)
            held = True
            break
        time.sleep(0.005)
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr
    assert held or not hold, f"no hand-over seen while the job ran: {stderr}"
    (device,) = out.glob("PROF_*/device_0")
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr), device


def handed(device: Path) -> dict:
    return json.loads((device / "data" / "exporter.json").read_text())


def info(device: Path) -> dict:
    return json.loads((device / "info.json.0").read_text())["jobprof"]


def timelines(device: Path) -> set[str]:
    return {p.name for p in (device / "timeline").glob("*.json")}


def summaries(device: Path) -> set[str]:
    return {p.name for p in (device / "summary").glob("*.csv")}


def wait_gone(pid: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, f"exporter {pid} still running"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def inline(tmp_path_factory) -> Path:
    """The same job rendering everything before it exits: the files every mode must end with."""
    proc, device = start(tmp_path_factory.mktemp("inline"), "prof", {**OPTIONS, "export": "inline"})
    assert not (device / "data" / "exporter.json").exists()
    assert "left to render" not in proc.stderr
    assert info(device)["unrendered"] == []
    return device


def test_the_job_exits_while_its_exporter_renders_the_rest(tmp_path: Path, inline: Path) -> None:
    proc, device = start(tmp_path, "prof", OPTIONS, hold=True)
    job_end = time.time()
    hand = handed(device)
    pid = hand["pid"]
    try:
        # the job said so, once; its process did not wait for the exporter (nor did its pipes)
        lines = [x for x in proc.stderr.splitlines() if "left to render" in x]
        assert len(lines) == 1, proc.stderr
        assert "background exporter" in lines[0] and "jobprof export --wait" in lines[0], lines
        trained = float(proc.stdout.split()[1])
        print(f"exit after the job's end: {job_end - trained:.2f} s")
        first, last = hand["iterations"][0][0], hand["iterations"][-1][1]
        # every iteration is the exporter's: nothing is rendered in the job while it trains,
        # and no operator window after its last step
        assert [first, last] == [1, STEPS] and len(hand["iterations"]) == 1, hand
        assert info(device)["unrendered"] == hand["iterations"]
        # the exporter: detached (its own session), lowest priority, never profiled itself
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[3]) == pid, stat  # its session id
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"PROFILING_MODE" not in environ
        # what the summary says meanwhile: not rendered *yet*, by whom
        text = jobprof_cli("summary", str(device.parent)).stdout
        assert f"background exporter (pid {pid}) is rendering them" in text, text
        assert "jobprof export --wait" in text
    finally:
        os.kill(pid, signal.SIGCONT)
    waited = jobprof_cli("export", "--wait", str(device.parent))
    assert waited.returncode == 0, waited.stderr
    assert not (device / "data" / "exporter.json").exists()
    # every file the inline job wrote, and its bookkeeping
    assert timelines(device) == timelines(inline) and summaries(device) == summaries(inline)
    done = info(device)
    assert done["unrendered"] == [] and done["background_export"]["rendered"] == STEPS - first + 1
    assert done["background_export"]["nice"] == 19
    assert (device / "data" / "facts.0.json").exists()
    assert "rendered" in (device / "data" / "exporter.log").read_text()
    text = jobprof_cli("summary", str(device.parent)).stdout
    assert "not rendered" not in text, text


def test_a_killed_exporter_loses_nothing(tmp_path: Path, inline: Path) -> None:
    _, device = start(tmp_path, "prof", OPTIONS, hold=True)
    pid = handed(device)["pid"]
    os.kill(pid, signal.SIGCONT)
    time.sleep(0.5)  # some rendered (or none, if it is slow to start: the same loss either way)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    assert (device / "data" / "exporter.json").exists()  # it never finished
    rendered_before = len(timelines(device))
    assert rendered_before < len(timelines(inline))
    text = jobprof_cli("summary", str(device.parent)).stdout
    assert f"background exporter (pid {pid}) stopped before it finished" in text, text
    assert f"run `jobprof export {device.parent}`" in text
    waited = jobprof_cli("export", "--wait", str(device.parent))
    assert waited.returncode == 0, waited.stderr
    assert timelines(device) == timelines(inline) and summaries(device) == summaries(inline)
    assert "not rendered" not in jobprof_cli("summary", str(device.parent)).stdout


def test_export_off_renders_nothing_in_the_job(tmp_path: Path, inline: Path) -> None:
    proc, device = start(tmp_path, "prof", {**OPTIONS, "export": "off"})
    assert not (device / "data" / "exporter.json").exists()
    assert timelines(device) == set() and summaries(device) == set()
    assert f"{STEPS} iteration(s) saved as raw data, not rendered" in proc.stderr, proc.stderr
    assert info(device)["unrendered"] == [[1, STEPS]]
    done = jobprof_cli("export", "--wait", str(device.parent))
    assert done.returncode == 0, done.stderr
    assert timelines(device) == timelines(inline) and summaries(device) == summaries(inline)
    again = jobprof_cli("export", "--wait", str(device.parent))
    assert "every iteration with raw data is rendered" in again.stdout, again.stdout


#: issue 47's case, smaller: an iteration of many tiny operators between two optimizer steps
HUGE = """
import sys, time, torch
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
t = torch.zeros(4)
for step in range(3):
    model(torch.randn(2, 4)).sum().backward()
    if step == 1:
        for _ in range(int(sys.argv[1])):
            t = t + 1
    opt.step()
    opt.zero_grad()
print(float(t[0]), flush=True)
"""


def test_a_huge_iteration_is_left_to_the_exporter_not_rendered_at_exit(tmp_path: Path) -> None:
    """Before (issue 47 item 1): one iteration of 200k operators held the job's exit for over
    a minute, its operator window decoded and rendered in the job's process after its last step.
    Now no window is decoded there after it: the hand-over names every iteration with
    operators, the huge one too, and a window saved at the end is left as Kineto wrote it until
    the exporter compresses it."""
    operators = 30_000  # a window of ~3 MB compressed: over what the job decodes itself
    (tmp_path / "job.py").write_text(HUGE)
    plain = subprocess.run([sys.executable, "job.py", str(operators)], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=300)
    out = tmp_path / "prof"
    env = clean_env(PROFILING_MODE="true", PROFILING_OPTIONS=json.dumps({"output": str(out), **OPTIONS,
                                                                          "task_trace": "on"}),
                    JOBPROF_EXPORTER_NICE="")
    job = subprocess.Popen([sys.executable, "job.py", str(operators)], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    while job.poll() is None and pid is None:  # the exporter stopped as soon as it exists
        found = list(out.glob("PROF_*/device_0/data/exporter.json"))
        if found and found[0].stat().st_size:
            pid = json.loads(found[0].read_text())["pid"]
            os.kill(pid, signal.SIGSTOP)
        time.sleep(0.005)
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode == plain.returncode == 0 and stdout == plain.stdout, stderr
    (device,) = out.glob("PROF_*/device_0")
    hand = handed(device)
    pid = pid or hand["pid"]
    try:
        assert [2, 2] in hand["iterations"] or any(a <= 2 <= b for a, b in hand["iterations"]), hand
        assert hand["iterations"][-1][1] == 3, hand  # the last one's window: read after the last step
        assert not list((device / "timeline").glob("msprof_*_2.json")), "rendered in the job"
        assert info(device)["unrendered"] == hand["iterations"]
    finally:
        os.kill(pid, signal.SIGCONT)
    waited = jobprof_cli("export", "--wait", str(device.parent))
    assert waited.returncode == 0, waited.stderr
    assert info(device)["unrendered"] == []
    assert {f"msprof_0_4294967295_{i}.json" for i in (1, 2, 3)} <= timelines(device), timelines(device)
    with (device / "summary" / "op_summary_0_4294967295_2.csv").open() as rows:
        assert sum(1 for _ in rows) > operators  # every operator of the huge one
    windows = sorted(p.name for p in (device / "data" / "kineto").iterdir())
    assert windows and all(n.endswith(".json.gz") for n in windows), windows  # compressed since
