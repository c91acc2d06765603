"""No silent loss: faults that cost data must say what they cost, in stderr, info.json and
``jobprof summary``'s Missing list (issue 15, findings 4, 5 and 9).

Every test runs a real profiled program (``PROFILING_MODE=true``) and then checks the files on
disk against what jobprof said: SIGTERM at points spread over the exit-time export, storage
ageing by the limit and by a nearly full disk, a full disk, a ``record_function`` never closed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, Runner, clean_env, free_port, jobprof_cli, raw_iterations, wait_rendered
from jobprof.analysis.selection import ranges
from jobprof.files import handover, rawstore
from jobprof.files.profdir import iteration_files
from jobprof.runtime import sink, storage
from jobprof.runtime.storage import MB, StorageBudget

#: the operator tier (task_trace) makes the exit-time export last long enough to hit
OPERATORS = {"training_trace": "on", "task_trace": "on"}
ITERATIONS = 120

#: after the loop, a daemon thread (alive while atexit handlers run) sends SIGTERM to its own
#: process ``delay`` seconds after the loop ended; ``exit7``: the program's own SIGTERM handler
#: (installed before torch, so jobprof chains it) ends the process with status 7; ``late7``: the
#: same handler installed after torch (it replaces jobprof's; jobprof takes SIGTERM back while it
#: finishes and calls it after)
SELF_KILL = f"""
import os, signal, sys, threading, time
sys.path.insert(0, {str(REPO / "tests")!r})
n, delay, disposition = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if disposition == "exit7":
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(7))
import loops
if disposition == "late7":  # after torch: it replaces jobprof's handler, which never runs
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(7))
loops.optimizer_loop(n)
print(f"loop done {{time.monotonic()}}", flush=True)

def kill():
    time.sleep(delay)
    print(f"kill {{time.monotonic()}}", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

if delay >= 0:
    threading.Thread(target=kill, daemon=True).start()
"""


def summary_json(prof: Path, *args: str, status: int = 0) -> dict:
    proc = jobprof_cli("summary", "--json", str(prof), *args)
    assert proc.returncode == status, proc.stderr
    return json.loads(proc.stdout)


def info(device: Path) -> dict:
    return json.loads((device / f"info.json.{device.name.split('_')[1]}").read_text())["jobprof"]


def runs(value: list[list[int]]) -> set[int]:
    return {i for first, last in value for i in range(first, last + 1)}


def rendered(device: Path, name: str, folder: str) -> set[int]:
    return {f.iteration for f in iteration_files(device, folder, name)}


class Timed:
    """One run of SELF_KILL: exit status, stderr, and the monotonic times it printed."""

    def __init__(self, runner: Runner, delay: float, disposition: str = "default",
                 iterations: int = ITERATIONS, export: str = "inline") -> None:
        # "inline" by default: these cases are about the exit-time export the job does itself
        script = runner.script(SELF_KILL, "self_kill.py")
        env = clean_env(PROFILING_MODE="true", PROFILING_OPTIONS=json.dumps(
            {"output": str(runner.out), **OPERATORS, "export": export}))
        proc = subprocess.Popen([sys.executable, str(script), str(iterations), str(delay), disposition],
                                cwd=runner.tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        stdout, self.stderr = proc.communicate(timeout=180)
        self.ended = time.monotonic()
        self.rc = proc.returncode
        found = re.findall(r"^loop done (\S+)$|^kill (\S+)$", stdout, re.M)
        self.loop_done = next((float(a) for a, _ in found if a), None)
        self.killed = next((float(b) for _, b in found if b), None)


@pytest.fixture(scope="module")
def export_window(tmp_path_factory: pytest.TempPathFactory) -> float:
    """How long the exit-time export of ITERATIONS operator-tier iterations takes here."""
    run = Timed(Runner(tmp_path_factory.mktemp("window")), -1)
    assert run.rc == 0 and run.loop_done is not None, run.stderr
    return run.ended - run.loop_done


# points spread over the export (share of its measured length); a point past its end is
# allowed to miss (the process is gone, as an unprofiled one would be: exit 0)
POINTS = [(0.0, "default"), (0.1, "default"), (0.3, "default"), (0.55, "default"), (0.8, "default"),
          (0.2, "exit7"), (0.6, "exit7"), (0.15, "late7")]


@pytest.mark.slow
@pytest.mark.parametrize(("share", "disposition"), POINTS)
def test_sigterm_during_the_exit_time_export_names_every_unrendered_iteration(
        runner: Runner, export_window: float, share: float, disposition: str) -> None:
    run = Timed(runner, share * export_window, disposition)
    device = runner.device_dir()
    raw = set(raw_iterations(device))
    if "the exporting thread was waiting for an import that SIGTERM interrupted" in run.stderr:
        # the signal landed inside an import while the exporting thread, holding its lock, was
        # importing too (maybe waiting for that very import): after 1 s jobprof goes on without
        # it, and says so; what it held is lost, nothing before it (CI runs 82 and 83; a known
        # limit, see test_sigterm_inside_an_import_the_sink_thread_waits_for_ends_the_job)
        assert raw == set(range(1, len(raw) + 1)) and run.rc in (-signal.SIGTERM, 7), run.stderr
        assert "iterations after the last one on disk are lost" in run.stderr
        return
    assert raw == set(range(1, ITERATIONS + 1)), \
        f"the raw data must be complete whatever the signal\n{run.stderr}"
    assert (device / "end_info.0").exists(), run.stderr
    job = info(device)
    by_signal = -signal.SIGTERM if disposition == "default" else 7
    if job["end_reason"] == "exit":
        # jobprof was done first: no signal (the process was gone, as an unprofiled one would
        # be), or one during the interpreter's own shutdown, which ends the process as it would
        assert run.rc == (0 if run.killed is None else by_signal), run.stderr
    elif job["end_reason"] == "os._exit(7)":
        # late7 / exit7: the signal came before jobprof's exit began, so the program's own
        # handler ran and ended the process (jobprof finished inside its os._exit)
        assert disposition != "default" and run.killed is not None and run.rc == 7, run.stderr
    else:
        assert run.killed is not None and run.rc == by_signal, run.stderr
        assert job["end_reason"].startswith("SIGTERM"), job["end_reason"]
        # prompt: a scheduler's grace period is short; jobprof renders SIGTERM_RENDER_S more, then stops
        assert run.ended - run.killed < sink.SIGTERM_RENDER_S + 3, run.ended - run.killed
    steps = rendered(device, "step_trace", "summary")
    masters = rendered(device, "msprof", "timeline")
    unrendered = raw - (steps & masters)
    assert runs(job["unrendered"]) == unrendered  # end state written, exact
    exports = [line for line in run.stderr.splitlines() if "jobprof export" in line]
    if unrendered:
        assert len(exports) == 1 and f"run `jobprof export {device.parent}`" in exports[0], run.stderr
        assert f"iterations {', '.join(ranges(unrendered))}" in exports[0]
    else:
        assert exports == [], run.stderr
    missing = summary_json(device.parent)["missing"]
    named = [m for m in missing if "were not rendered" in m]
    if unrendered:
        assert named == [f"rank 0: iteration(s) {', '.join(ranges(unrendered))} have raw data but were "
                         f"not rendered (no timeline file): run `jobprof export {device.parent}`"], missing
    else:
        assert named == [], missing
    if unrendered:  # the command it names renders them all
        assert jobprof_cli("export", str(device.parent)).returncode == 0
        assert rendered(device, "step_trace", "summary") >= raw
        assert not [m for m in summary_json(device.parent)["missing"] if "were not rendered" in m]


@pytest.mark.parametrize("export", ["inline", "background"])
def test_sigterm_soon_after_the_loop_ends_is_said_and_recorded(runner: Runner, export: str) -> None:
    """The issue's case, kept fast: SIGTERM 0.3 s after the loop (operator tier), with enough
    iterations that the export is still running then.  ``background`` (the default): what the
    job did not render, its exporter (which the job's SIGTERM does not reach) renders after it."""
    # inline: 3x ITERATIONS, because with 120 an idle machine once finished the exit-time export
    # within 0.3 s (the signal then came after the end: "exit", rightly); background: the job's
    # exit decodes no operator window (its exporter does), so it is over in a moment: the signal
    # comes as the loop ends
    total, delay = (3 * ITERATIONS, 0.3) if export == "inline" else (5 * ITERATIONS, 0.0)
    run = Timed(runner, delay, export=export, iterations=total)
    device = runner.device_dir()
    job = info(device)
    assert run.killed is not None and run.rc == -signal.SIGTERM, run.stderr
    assert job["end_reason"].startswith("SIGTERM")
    if export == "inline":
        unrendered = set(raw_iterations(device)) - rendered(device, "step_trace", "summary")
        assert runs(job["unrendered"]) == unrendered
        assert bool(unrendered) == ("jobprof export" in run.stderr)
        return
    said = [x for x in run.stderr.splitlines() if "left to render" in x]
    assert len(said) == 1 and "run `jobprof export" not in run.stderr, run.stderr
    wait_rendered(runner.out)
    assert not handover.path(device).exists()
    assert info(device)["background_export"]["rendered"] == int(said[0].split("jobprof: ")[1].split()[0])
    everything = set(range(1, total + 1))
    assert rendered(device, "step_trace", "summary") == set(raw_iterations(device)) == everything
    assert info(device)["unrendered"] == []


@pytest.mark.slow
def test_a_sigkilled_export_is_named_from_the_disk(runner: Runner) -> None:
    """No end state at all (SIGKILL during the export): Missing compares raw data and files."""
    body = SELF_KILL.replace("signal.SIGTERM)\n\nif", "signal.SIGKILL)\n\nif")
    script = runner.script(body, "self_kill.py")
    runner.run(script, OPERATORS, args=[str(ITERATIONS), "0.2", "default"], check=False)
    device = runner.device_dir()
    assert not (device / "end_info.0").exists()
    unrendered = set(raw_iterations(device)) - rendered(device, "msprof", "timeline")
    assert unrendered, "the export was not cut: kill earlier"
    missing = summary_json(device.parent)["missing"]
    assert f"rank 0: iteration(s) {', '.join(ranges(unrendered))} have raw data but were not rendered " \
           f"(no timeline file): run `jobprof export {device.parent}`" in missing, missing
    assert not any("None" in m for m in missing), missing


# -- storage ageing ---------------------------------------------------------------------------

#: a loop whose iterations write ~40 KB each (operator tier); the storage budget is made small
#: through storage_limit by raising the 20 MB reserve it keeps free (the limit's minimum is
#: msprof's 200 MB: too much to write in a test)
AGEING = f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
from jobprof.runtime import storage
storage.RESERVE = 200 * storage.MB - int(sys.argv[2])
import loops
loops.optimizer_loop(int(sys.argv[1]))
"""


def aged_from_disk(device: Path, total: int) -> set[int]:
    return set(range(1, total + 1)) - set(raw_iterations(device))


def check_aged(device: Path, stderr: str, total: int) -> set[int]:
    gone = aged_from_disk(device, total)
    assert gone and min(gone) == 1 and gone == set(range(1, max(gone) + 1)), gone  # oldest first
    warnings = [line for line in stderr.splitlines() if "deleting the oldest profile data" in line]
    assert len(warnings) == 1, stderr  # once, when ageing starts
    job = info(device)
    assert runs(job["aged"]) == gone  # exact
    # what ageing left is whole: every remaining iteration rendered, none aged half-way
    assert set(raw_iterations(device)) == rendered(device, "msprof", "timeline")
    missing = summary_json(device.parent)["missing"]
    assert f"rank 0: iteration(s) {', '.join(ranges(gone))} were deleted by storage ageing " \
           "(storage_limit, or under 20 MB free disk)" in missing, missing
    assert not any("no raw data" in m for m in missing), missing  # not also called "lost"
    return gone


def test_storage_limit_ageing_warns_once_and_records_the_aged_iterations(runner: Runner) -> None:
    total = 300
    proc = runner.run(runner.script(AGEING, "ageing.py"), {**OPERATORS, "storage_limit": "200MB"},
                      args=[str(total), str(2 * MB)])
    device = runner.device_dir()
    check_aged(device, proc.stderr, total)
    assert "reached the storage limit (200 MB" in proc.stderr


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 36 MB tmpfs (root only, as CI runs): free space drops below the 20 MB reserve for real."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=36m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_low_free_disk_ageing_warns_once_and_records_the_aged_iterations(
        runner: Runner, small_disk: Path) -> None:
    total = 500
    runner.out = small_disk / "prof"
    script = runner.script(AGEING.replace("storage.RESERVE = ", "_ = "), "ageing.py")
    # every file rendered by the job itself (the runner's default): its budget ages the oldest
    # to make room (a background exporter instead stops where the room ends, leaving raw data)
    proc = runner.run(script, OPERATORS, args=[str(total), "0"])
    check_aged(runner.device_dir(), proc.stderr, total)
    assert "MB free (under 20 MB)" in proc.stderr


@pytest.mark.slow
def test_a_background_exporter_stops_where_the_disk_room_ends(runner: Runner, small_disk: Path) -> None:
    """The job's exit hands iterations over on a disk with under 20 MB free: the exporter renders
    none past the room (it ages nothing), says so in its log and info.json, and the summary
    names the iterations left as raw data."""
    total = 500
    runner.out = small_disk / "prof"
    script = runner.script(AGEING.replace("storage.RESERVE = ", "_ = "), "ageing.py")
    proc = runner.run(script, {**OPERATORS, "export": "background"}, args=[str(total), "0"])  # waits for it
    device = runner.device_dir()
    assert "left to render" in proc.stderr, proc.stderr
    job = info(device)
    done = job["background_export"]
    left = runs(job["unrendered"])
    assert left and done["rendered"] + len(left) == done["iterations"], (done, job["unrendered"])
    assert left <= set(raw_iterations(device))  # kept as raw data
    assert not left & rendered(device, "msprof", "timeline")
    assert "storage budget" in (device / "data" / "exporter.log").read_text()
    named = [m for m in summary_json(device.parent)["missing"] if "were not rendered" in m]
    assert named and ranges(left)[0] in named[0], named


def test_free_disk_ageing_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The free-disk path alone: plenty of budget, but the disk reports 19 MB free after 250."""
    from test_storage import Device

    said: list[str] = []
    budget = StorageBudget(tmp_path, 1 << 40, max_files=10**9, on_ageing=said.append)
    device = Device(tmp_path, budget)
    free = {"bytes": 1 << 40}
    monkeypatch.setattr(storage, "_free_bytes", lambda path: free["bytes"])
    monkeypatch.setattr(storage, "FREE_CHECK_S", 0)
    for index in range(1, 501):
        if index == 251:
            free["bytes"] = 19 * MB  # stays low: every new segment ages the oldest one
        device.iteration(index, 10)
    assert len(said) == 1 and "the disk has 19 MB free (under 20 MB)" in said[0], said
    assert "starting with iterations 1-100" in said[0]
    # the newest segment always stays; everything older went, merged into one run
    assert budget.aged == [[1, 400]]
    assert device.exported() == list(range(401, 501))
    assert sorted(rawstore.indices(tmp_path)) == list(range(401, 501))


def test_ageing_runs_are_merged_and_exact(tmp_path: Path) -> None:
    """Units age by their first iteration up to the next unit's: runs stay exact when merged."""
    budget = StorageBudget(tmp_path, 1 << 40, max_files=4)
    for unit, name in ((1, "a"), (101, "b"), (150, "c"), (301, "d")):
        path = tmp_path / name
        path.write_text("x")
        budget.account(unit, path, 1)
        budget.enforce()
    assert budget.aged == []
    budget.max_files = 1
    budget.enforce()
    assert budget.aged == [[1, 300]] and budget.alive(301) and not (tmp_path / "c").exists()


# -- a full disk ------------------------------------------------------------------------------

def limited(size: int):
    import resource

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


@pytest.mark.parametrize("size", [8_000, 20_000])
def test_a_full_disk_says_exactly_what_was_saved(runner: Runner, size: int) -> None:
    """A write fails mid-run (here: a raw segment reaches the file size limit): the one message
    names the last saved iteration and what was not saved, as the raw store on disk has it."""
    script = runner.script(SELF_KILL, "job.py")
    env = clean_env(PROFILING_MODE="true",
                    PROFILING_OPTIONS=json.dumps({"output": str(runner.out), "training_trace": "on",
                                                  "task_trace": "off"}))
    proc = subprocess.run([sys.executable, str(script), "300", "-1", "default"], cwd=runner.tmp, env=env,
                          capture_output=True, text=True, preexec_fn=limited(size), timeout=120)
    assert proc.returncode == 0, proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if "collection stopped" in ln]
    assert "last iterations were not saved" not in line
    saved = rawstore.indices(runner.device_dir())
    assert f"raw data saved for {len(saved)} iteration(s) ({', '.join(ranges(saved))}; " \
           f"last saved: {max(saved)})" in line, line
    lost = re.search(r"not saved: iteration\(s\) ([\d, -]+)", line)
    if lost:
        named = {n for part in lost.group(1).split(", ")
                 for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}
        assert named and not named & saved, line


def test_a_render_failure_with_all_raw_lines_saved_does_not_say_they_were_lost(tmp_path: Path) -> None:
    """The sink's message after an OSError while rendering (the disk refused the rendered file,
    not the raw line): every raw line is there, and the message says so."""
    from jobprof.files import export
    from jobprof.plugin.clock import ClockAnchor

    for sub in ("data", "timeline", "summary"):
        (tmp_path / "device_0" / sub).mkdir(parents=True)
    device = tmp_path / "device_0"
    meta = export.DeviceMeta(0, os.getpid(), ClockAnchor.now(), None)

    (device / "summary").rmdir()
    (device / "summary").write_text("")  # every rendered file's write fails (ENOTDIR)

    from jobprof.plugin.values import WriterSpec

    said: list[str] = []
    budget = StorageBudget(device, 1 << 40, max_files=10**9)
    out = sink.Sink(device, meta, [("x", WriterSpec("x", "csv", lambda ctx: "a,b\n", "x"))], budget,
                    lambda plugin, message: None, said.append)
    for index in range(1, 6):
        start = index * 1_000_000
        out.submit(index, {"iteration": [{"index": index, "start_ns": start, "end_ns": start + 10,
                                           "method": "explicit"}]}, frozenset({"x"}))
    out.close()
    assert rawstore.indices(device) == {1, 2, 3, 4, 5}
    assert len(said) == 1 and "raw data saved for 5 iteration(s) (1-5; last saved: 5)" in said[0], said
    assert "not saved" not in said[0] and "iteration(s) 1-5 not rendered" in said[0], said


IMPORT_DEADLOCK = """
import os, signal, sys, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from jobprof.files import export
from jobprof.plugin.clock import ClockAnchor
from jobprof.runtime import sink
from jobprof.runtime.storage import StorageBudget

device = Path(sys.argv[1], "device_0")
for sub in ("data", "timeline", "summary"):
    (device / sub).mkdir(parents=True)
out = sink.Sink(device, export.DeviceMeta(0, os.getpid(), ClockAnchor.now(), None), [],
                StorageBudget(device, 1 << 40, max_files=10**9), lambda p, m: None, print)

def flush_raw():  # the sink thread's work, under its lock: an import the main thread is inside
    import slowmod

out._flush_raw = flush_raw

def handler(signum, frame):  # what the session's SIGTERM path does with the sink
    began = time.monotonic()
    out.lock_wait_s = 1.0
    out.settle()
    out.close()
    print("ended", out.stuck, round(time.monotonic() - began, 1), flush=True)
    print("at", out.stuck_at, flush=True)
    os._exit(0)

signal.signal(signal.SIGTERM, handler)
import slowmod
"""

SLOWMOD = """
import os, signal, time, __main__
__main__.out._wake.set()  # the sink thread takes its lock and imports this module: it waits
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside this import
time.sleep(30)
"""


def test_sigterm_inside_an_import_the_sink_thread_waits_for_ends_the_job(tmp_path: Path) -> None:
    """CI run 61's hang: SIGTERM's handler ran while the main thread was inside an import
    (torch's atexit importing tabulate) and waited for the sink's lock, held by the sink thread
    while it waited for an import only the main thread could finish.  Reproduced with a real
    import-lock wait: the handler gives up after lock_wait_s, says so (stuck), and returns."""
    (tmp_path / "slowmod.py").write_text(SLOWMOD)
    script = tmp_path / "job.py"
    script.write_text(IMPORT_DEADLOCK)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=clean_env())
    assert done.returncode == 0, done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("ended")]
    _, stuck, seconds = line.split()
    assert stuck == "True" and 1.0 <= float(seconds) < 3, line
    # the message names where the exporting thread was importing: the import in flush_raw
    [at] = [ln for ln in done.stdout.splitlines() if ln.startswith("at ")]
    line_no = IMPORT_DEADLOCK.splitlines().index("    import slowmod") + 1
    assert at == f"at {script}:{line_no} in flush_raw", done.stdout


#: records every real import (a module not yet in sys.modules: the import system's locks taken)
#: made on jobprof's exporting thread, from the job's first line to its last
SINK_IMPORTS = """
import os, sys, threading
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

def audit(event, args):
    if event == "import" and threading.current_thread().name == "jobprof-sink":
        os.write(log, f"{args[0]}\\n".encode())

sys.addaudithook(audit)
import torch, torch.distributed as dist
from torch import nn

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.randn(64, 16), batch_size=8)
for batch in loader:
    with torch.autograd.profiler.record_function("forward"):
        loss = model(batch).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("export", ["inline", "background"])
def test_the_exporting_thread_imports_nothing(runner: Runner, tmp_path: Path, export: str) -> None:
    """Every module jobprof's exporting thread needs is imported on the job's thread (at start-up
    or the first forward), never on that thread: a SIGTERM that interrupts the main thread inside
    an import at exit, while that thread (holding the sink's lock) imports, deadlocks the two (CI
    runs 61 and 83, py-spy); the 1 s rescue then loses the raw data that thread held."""
    log = tmp_path / "imports.txt"
    options = {"training_trace": "on", "task_trace": "on", "msproftx": "on", "aicpu": "on", "hccl": "on",
               "aic_metrics": "PipeUtilization", "task_memory": "on", "l2": "on", "runtime_api": "on",
               "host_sys_usage": "cpu,mem", "export": export}
    proc = runner.run(SINK_IMPORTS, options, args=[str(log), str(free_port())])
    assert proc.returncode == 0, proc.stderr
    device = runner.device_dir()
    assert rendered(device, "msprof", "timeline") >= set(range(1, 8)), proc.stderr
    assert rendered(device, "hccl", "timeline") and rendered(device, "dp", "summary"), proc.stderr
    imported = log.read_text().split() if log.exists() else []
    assert imported == [], f"imported on the exporting thread: {imported}"


# -- smaller ------------------------------------------------------------------------------------

UNCLOSED = """
import torch
from torch import nn

model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 5):
    if step == 2:
        torch.autograd.profiler.record_function("never closed").__enter__()
    with torch.autograd.profiler.record_function("closed"):
        model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_record_function_never_closed_is_named_at_exit(runner: Runner) -> None:
    proc = runner.run(UNCLOSED, {"training_trace": "on", "task_trace": "off", "msproftx": "on"})
    [line] = [ln for ln in proc.stderr.splitlines() if "still open at exit" in ln]
    assert "1 record_function block (never exited) still open at exit, not written to msprof_tx" in line
    assert "'never closed' (domain record_function, thread " in line and "'closed'" not in line
    assert line in info(runner.device_dir())["messages"]


def test_unfinished_rank_with_nothing_selected_says_so_honestly(runner: Runner) -> None:
    runner.run(UNCLOSED, {"training_trace": "on", "task_trace": "off"})
    device = runner.device_dir()
    (device / "end_info.0").unlink()  # as if killed
    model = summary_json(device.parent, "--iterations", "50-", status=1)  # nothing selected: 1
    notes = model["missing"] + [f["text"] for f in model["findings"]]
    assert not any("None" in n for n in notes), notes
    assert "rank 0: no end_info (the job did not finish); no iteration's raw data is in the selection" \
        in model["missing"], model["missing"]
    whole = summary_json(device.parent)["missing"]
    assert "rank 0: no end_info (the job did not finish); its raw data ends at iteration 4" in whole, whole
    # a raw line with a huge index (a valid int64): gaps and Missing are named from the run ends,
    # never expanded one number at a time (under a 4 GB address-space cap, as a check)
    segment = rawstore.segments(device)[-1]
    last = segment.read_bytes().splitlines()[-1]
    far = 2**62
    with open(segment, "ab") as handle:
        handle.write(re.sub(rb'^\{"index":\d+', b'{"index":%d' % far, last) + b"\n")
    proc = subprocess.run([str(Path(sys.executable).with_name("jobprof")), "summary", "--json",
                           str(device.parent)], env=clean_env(), capture_output=True, text=True,
                          timeout=120, preexec_fn=address_space(4 << 30))
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = json.loads(proc.stdout)
    assert model["ranks"][0]["iterations"]["gaps"] == [f"5-{far - 1}"]
    assert f"rank 0: no raw data for iteration(s) 5-{far - 1} (aged out by storage_limit, or lost in " \
           "a crash)" in model["missing"], model["missing"]
    assert any(f"iteration(s) {far} have raw data but were not rendered" in m for m in model["missing"])


def address_space(size: int):
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    return limit


FULL_DISK_JOB = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(60):
    model(torch.randn(16, 64)).sum().backward(); opt.step(); opt.zero_grad()
print("done")
"""


@pytest.mark.parametrize("size", ["300k", "700k", "2m"])
def test_a_full_disk_with_operators_keeps_what_it_says_and_ends_finished(
        runner: Runner, tmp_path: Path, size: str) -> None:
    """A tiny tmpfs fills while the operator tier runs (issue 29 item 8): before, the closing
    line counted iterations whose operator windows were never stored, and without room for
    end_info the summary called a job that exited 0 "killed?"."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        runner.out = mount / "prof"
        proc = runner.run(FULL_DISK_JOB, OPERATORS)
        assert proc.stdout == "done\n"
        [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("jobprof: error")]
        device = runner.device_dir()
        saved = rawstore.indices(device)
        assert (f"raw data saved for {len(saved)} iteration(s)" if saved
                else "no iteration's raw data was saved") in line, line
        # every iteration said to be saved has its operators: each window it names is on disk
        lines = {}
        for segment in rawstore.segments(device):
            for text in segment.read_text().splitlines():
                try:  # a write cut by the full disk leaves a partial last line (readers skip it)
                    line = json.loads(text)
                except ValueError:
                    continue
                lines[line["index"]] = line["streams"]
        for index in saved:
            refs = lines[index].get("ops") or []
            assert refs, f"iteration {index}: no operator data"
            for ref in refs:
                assert (device / "data" / "kineto" / ref["kineto"]).is_file(), (index, ref)
        assert (device / "end_info.0").is_file()  # the room kept for it
        assert not (device / "data" / sink.RESERVE_NAME).exists()
        info = json.loads((device / "info.json.0").read_text())
        assert info["jobprof"]["end_reason"] == "exit"
        summary = jobprof_cli("summary", "--json", str(runner.out))
        if not saved:
            assert summary.returncode == 1 and "jobprof: no iteration in" in summary.stderr
            return
        assert summary.returncode == 0, summary.stderr
        [rank] = json.loads(summary.stdout)["ranks"]
        assert rank["finished"] and rank["iterations"]["count"] == len(saved), rank
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
