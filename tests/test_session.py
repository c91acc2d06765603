"""The session's life in real processes: laziness, children, crashes, export, disk errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import clean_env, jobprof_cli, raw_iterations

#: the step trace alone: these tests check the exact file set of the lifecycle
STEP = {"training_trace": "on", "task_trace": "off"}

TRAIN = """
import os, sys, time
import torch
from torch import nn

def train(steps, pause=0.0):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, steps + 1):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        print(f"step {step}", flush=True)
        time.sleep(pause)

if __name__ == "__main__":
    train(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
"""


def exported(device_dir) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for folder in ("timeline", "summary"):
        for path in (device_dir / folder).iterdir():
            name = path.stem.rsplit("_", 3)[0]  # <name>_<dev>_<model>_<iter>
            out.setdefault(f"{folder}/{name}{path.suffix}", []).append(int(path.stem.rsplit("_", 1)[1]))
    return {k: sorted(v) for k, v in out.items()}


def test_a_process_that_never_steps_writes_nothing(runner):
    runner.run("import torch\nx = torch.randn(3) * 2\nprint(x.sum())\n", STEP)
    runner.run("print('no torch here')\n", STEP)
    assert not runner.out.exists()


def test_torch_imported_late_is_still_profiled(runner):
    script = TRAIN.replace("import torch\nfrom torch import nn\n", "").replace(
        "def train(steps, pause=0.0):\n",
        "def train(steps, pause=0.0):\n    import torch\n    from torch import nn\n")
    runner.run("import time\ntime.sleep(0.2)\n" + script, STEP, args=["4"])
    assert exported(runner.device_dir()) == {"summary/step_trace.csv": [1, 2, 3, 4],
                                             "timeline/step_trace.json": [1, 2, 3, 4],
                                             "timeline/msprof.json": [1, 2, 3, 4]}


def test_metadata_files_and_done_companions(runner):
    runner.run(TRAIN, STEP, args=["3"])
    dirs = runner.prof_dirs()
    assert len(dirs) == 1
    import re

    assert re.match(r"^PROF_\d{6}_\d{17}_[A-Z]{16}$", dirs[0].name)
    device = runner.device_dir()
    for name in ("info.json.0", "start_info.0", "end_info.0"):
        body = (device / name).read_bytes()
        assert (device / f"{name}.done").read_text() == f"filesize:{len(body)}\n"
    start = json.loads((device / "start_info.0").read_text())
    end = json.loads((device / "end_info.0").read_text())
    assert int(end["collectionTimeEnd"]) > int(start["collectionTimeBegin"])
    info = json.loads((device / "info.json.0").read_text())
    assert info["pid"] == str(info["pid"]) and info["jobprof"]["iteration_method"] == "optimizer_step"
    assert info["jobprof"]["iterations_written"] == 3 and info["jobprof"]["end_reason"] == "exit"
    assert oct(device.stat().st_mode & 0o777) == "0o750"


DATALOADER = """
import sys
import torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        model = torch.nn.Linear(2, 2)  # a module called inside the worker, at its top level
        with torch.no_grad():
            model(torch.randn(1, 2))
        return torch.tensor([float(i)]), torch.tensor([float(i * i)])

if __name__ == "__main__":
    method = sys.argv[1]
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context=method,
                        persistent_workers=True, pin_memory=False)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_write_nothing(runner, method):
    runner.run(DATALOADER, STEP, args=[method])
    prof = runner.prof_dirs()
    assert len(prof) == 1
    assert sorted(p.name for p in prof[0].iterdir()) == ["device_0"]
    assert exported(prof[0] / "device_0")["summary/step_trace.csv"] == list(range(1, 13))


FORKED_TRAINER = TRAIN + """
    import multiprocessing as mp
    child = mp.get_context("fork").Process(target=train, args=(3,))
    child.start(); child.join()
    assert child.exitcode == 0
"""


def test_forked_child_is_not_a_second_session(runner):
    # the parent trains 2 steps, then forks a child that trains 3: only the parent's 2 appear
    runner.run(FORKED_TRAINER.replace("train(int(sys.argv[1]) if len(sys.argv) > 1 else 5)", "train(2)"),
               STEP)
    prof = runner.prof_dirs()[0]
    assert [p.name for p in prof.iterdir()] == ["device_0"]
    assert exported(prof / "device_0")["summary/step_trace.csv"] == [1, 2]


LAUNCHER = """
import os, subprocess, sys
children = [subprocess.Popen([sys.executable, "job.py", "3"], env={**os.environ, "LOCAL_RANK": str(r)})
            for r in (0, 1)]
sys.exit(max(c.wait() for c in children))
"""


def test_child_processes_share_one_prof_dir(runner):
    runner.script(TRAIN, "job.py")
    runner.run(runner.script(LAUNCHER, "launch.py"), STEP)
    prof = runner.prof_dirs()
    assert len(prof) == 1  # the launcher never stepped and created nothing of its own
    assert sorted(p.name for p in prof[0].iterdir()) == ["device_0", "device_1"]
    for device in (0, 1):
        assert exported(prof[0] / f"device_{device}")["summary/step_trace.csv"] == [1, 2, 3]
        assert (prof[0] / f"device_{device}" / f"info.json.{device}").exists()


def test_same_local_rank_twice_gets_distinct_device_dirs(runner):
    runner.script(TRAIN, "job.py")
    runner.run(runner.script(LAUNCHER.replace('str(r)', '"0"'), "launch.py"), STEP)
    devices = sorted(p.name for p in runner.prof_dirs()[0].iterdir())
    assert devices == ["device_0", "device_1"]  # no two processes ever share a folder
    pids = {json.loads((runner.prof_dirs()[0] / d / f"info.json.{d[-1]}").read_text())["pid"]
            for d in devices}
    assert len(pids) == 2


def _start(runner, body: str, args: list[str]) -> subprocess.Popen:
    script = runner.script(body)
    env = clean_env(PROFILING_MODE="true",
                    PROFILING_OPTIONS=json.dumps({"output": str(runner.out), "training_trace": "on",
                                               "task_trace": "off"}))
    return subprocess.Popen([sys.executable, str(script), *args], cwd=runner.tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_step(proc: subprocess.Popen, step: int) -> None:
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if line.strip() == f"step {step}":
            return
        assert time.monotonic() < deadline
    raise AssertionError(f"process ended before step {step}: {proc.stderr.read()}")


def test_sigterm_exports_every_finished_iteration(runner):
    proc = _start(runner, TRAIN, ["1000", "0.02"])
    _wait_for_step(proc, 6)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    assert proc.returncode == -signal.SIGTERM  # the job still dies of SIGTERM, as it would
    device = runner.device_dir()
    raw = raw_iterations(device)
    assert len(raw) >= 6 and raw == list(range(1, len(raw) + 1))
    assert exported(device) == {"summary/step_trace.csv": raw, "timeline/step_trace.json": raw,
                               "timeline/msprof.json": raw}
    info = json.loads((device / "info.json.0").read_text())
    assert info["jobprof"]["end_reason"] == "SIGTERM"


def test_uncaught_exception_keeps_exit_code_and_exports(runner):
    body = TRAIN.replace('train(int(sys.argv[1]) if len(sys.argv) > 1 else 5)',
                         'train(4)\n    raise RuntimeError("boom")')
    proc = runner.run(body, STEP, check=False)
    assert proc.returncode == 1 and "RuntimeError: boom" in proc.stderr
    assert exported(runner.device_dir())["summary/step_trace.csv"] == [1, 2, 3, 4]


def test_sigkill_leaves_raw_data_that_export_renders(runner):
    proc = _start(runner, TRAIN, ["1000", "0.05"])
    _wait_for_step(proc, 8)
    time.sleep(0.3)  # let the writer thread catch up with the finished iterations
    proc.kill()
    proc.wait(30)
    device = runner.device_dir()
    assert not (device / "end_info.0").exists()
    raw = raw_iterations(device)
    assert raw[:8] == list(range(1, 9))
    for folder in ("timeline", "summary"):  # wipe what the job exported before it died
        for path in (device / folder).iterdir():
            path.unlink()
    first = jobprof_cli("export", str(runner.prof_dirs()[0]))
    assert first.returncode == 0, first.stderr
    assert "did not finish" in first.stdout
    assert exported(device) == {"summary/step_trace.csv": raw, "timeline/step_trace.json": raw,
                               "timeline/msprof.json": raw}
    snapshot = {p.name: p.read_bytes() for p in (device / "summary").iterdir()}
    second = jobprof_cli("export", str(runner.out))  # idempotent; also accepts the output folder
    assert second.returncode == 0
    assert {p.name: p.read_bytes() for p in (device / "summary").iterdir()} == snapshot


def test_offline_export_reproduces_in_process_files(runner):
    runner.run(TRAIN, STEP, args=["3"])
    device = runner.device_dir()
    before = {p.relative_to(device): p.read_bytes() for f in ("timeline", "summary")
              for p in (device / f).iterdir()}
    assert jobprof_cli("export", str(runner.prof_dirs()[0])).returncode == 0
    after = {p.relative_to(device): p.read_bytes() for f in ("timeline", "summary")
             for p in (device / f).iterdir()}
    assert after == before


def test_output_removed_mid_run_stops_collection_once(runner):
    body = TRAIN.replace('train(int(sys.argv[1]) if len(sys.argv) > 1 else 5)', '''
    import shutil
    train(3, 0.1)
    shutil.rmtree(os.environ["JOBPROF_JOB_DIR"])
    open(os.environ["JOBPROF_JOB_DIR"], "w").close()  # a file where the folder was
    train(5)
    print("job finished", flush=True)''')
    proc = runner.run(body, STEP)
    assert "job finished" in proc.stdout
    assert proc.stderr.count("collection stopped") == 1, proc.stderr


def test_file_size_limit_stops_collection_and_job_continues(runner):
    import resource

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    script = runner.script(TRAIN)
    env = clean_env(PROFILING_MODE="true",
                    PROFILING_OPTIONS=json.dumps({"output": str(runner.out), "training_trace": "on",
                                               "task_trace": "off"}))
    proc = subprocess.run([sys.executable, str(script), "5"], cwd=runner.tmp, env=env,
                          capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert proc.returncode == 0 and "step 5" in proc.stdout
    assert proc.stderr.count("jobprof: error: collection stopped") == 1, proc.stderr
    assert "File too large" in proc.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_profiling_mode_off_installs_nothing(runner):
    body = "import sys, torch\nprint('jobprof' in sys.modules, 'jobprof.runtime.session' in sys.modules)\n"
    proc = runner.run(body, STEP, mode="false")
    assert proc.stdout.split() == ["False", "False"]
    proc = runner.run(body, STEP, mode=None)
    assert proc.stdout.split() == ["False", "False"]


def test_profiling_on_imports_nothing_heavy_before_the_program_does(runner):
    body = ("import sys\n"
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
            "print('jobprof.runtime.session' in sys.modules)\n")
    proc = runner.run(body, STEP)
    assert proc.stdout.split("\n")[:2] == ["[]", "True"]  # the session waits for torch


def test_pth_line_and_autoload_agree_on_lookalikes():
    import site
    from pathlib import Path

    from jobprof._autoload import IMPORTED_FOR

    [pth] = [p for d in site.getsitepackages() if (p := Path(d, "jobprof-autoload.pth")).exists()]
    line = pth.read_text()
    assert all(f"'{value}'" in line for value in IMPORTED_FOR)


@pytest.mark.parametrize("mode", ["false", "0", "off", "disabled", ""])
def test_off_values_import_nothing(runner, mode):
    body = "import sys\nprint('jobprof' in sys.modules)\n"
    assert runner.run(body, STEP, mode=mode).stdout.strip() == "False"
