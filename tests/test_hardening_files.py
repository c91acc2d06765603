"""Issue 15, findings 1, 2, 7 and 9 (files): every file jobprof writes goes through jobprof.files.fsio.

Each test is an attack that succeeded before: ``-o`` onto a FIFO, a link, a device node, a
folder, a socket; symlinks planted inside a PROF_ folder (temp-file names, device/summary/
timeline/data folders, the cann8 stage, the kineto output); a hostile ``JOBPROF_JOB_DIR``;
umask 000; ``"output": "~/x"``; three jobs started at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import Runner, clean_env, jobprof_cli
from jobprof.analysis import cann8
from jobprof.files import fsio, rawstore

JOB = """
import torch
from torch import nn
torch.manual_seed(0)
m = nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
"""
OPTIONS = {"training_trace": "on", "task_trace": "on", "kineto_trace": "on"}
VICTIM_TEXT = "root:$6$secret:19000:0:99999:7:::\n"


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small real profile (3 iterations, kineto files too); tests copy it before attacking."""
    runner = Runner(tmp_path_factory.mktemp("hardening_files"))
    runner.run(JOB, OPTIONS)
    [prof] = runner.prof_dirs()
    return prof


def copy_of(profile: Path, tmp_path: Path) -> Path:
    target = tmp_path / "out" / profile.name
    shutil.copytree(profile, target, symlinks=True)
    return target


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "shadow"
    path.write_text(VICTIM_TEXT)
    return path


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


# --- finding 1: a command's -o never replaces what is not a regular file --------------------

def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "named pipe (FIFO)"


def _symlink(path: Path) -> str:
    path.symlink_to(victim(path.parent))
    return "symbolic link"


def _device(path: Path) -> str:
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root (CI runs as root)")
    os.mknod(path, 0o600 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)  # a /dev/null of our own
    return "character device"


def _directory(path: Path) -> str:
    path.mkdir()
    return "directory"


def _socket(path: Path) -> str:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return "socket"


TARGETS = {"fifo": _fifo, "symlink": _symlink, "device": _device, "directory": _directory,
           "socket": _socket}


def _fingerprint(path: Path) -> tuple:
    st = path.lstat()
    inside = path.parent.joinpath("shadow").read_text() if path.is_symlink() else None
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, inside


@pytest.mark.parametrize("command", ["report", "merge"])
@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_output_onto_a_special_file_is_refused(profile: Path, tmp_path: Path, command: str,
                                               kind: str) -> None:
    target = tmp_path / ("out.html" if command == "report" else "out.json")
    what = TARGETS[kind](target)
    before = _fingerprint(target)
    proc = jobprof_cli(command, str(profile), "-o", str(target))
    no_traceback(proc)
    assert proc.returncode in (1, 2), proc.stdout + proc.stderr
    assert str(target) in proc.stderr and what in proc.stderr, proc.stderr
    assert _fingerprint(target) == before  # still the FIFO / link / device / folder, victim intact
    assert not list(tmp_path.glob(".out.*.tmp"))


def test_merge_default_output_planted_link_is_refused(profile: Path, tmp_path: Path) -> None:
    """The default output (merged.json in the current folder) is a planted link: refused."""
    prof = copy_of(profile, tmp_path)
    shadow = victim(tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    (here / "merged.json").symlink_to(shadow)
    proc = jobprof_cli("merge", str(prof), cwd=here)
    no_traceback(proc)
    assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
    assert shadow.read_text() == VICTIM_TEXT and (here / "merged.json").is_symlink()
    assert not (prof / "merged.json").exists()  # never into the profile


@pytest.mark.parametrize("command", ["report", "merge"])
def test_output_dash_is_stdout(profile: Path, tmp_path: Path, command: str) -> None:
    proc = jobprof_cli(command, str(profile), "-o", "-", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    if command == "report":
        assert proc.stdout.startswith("<!DOCTYPE html>") and proc.stdout.rstrip().endswith("</html>")
    else:
        assert json.loads(proc.stdout)["traceEvents"]
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("command", ["report", "merge"])
def test_output_regular_file_is_replaced_atomically(profile: Path, tmp_path: Path, command: str) -> None:
    target = tmp_path / "old.json"
    target.write_text("old")
    proc = jobprof_cli(command, str(profile), "-o", str(target))
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() != "old" and stat.S_ISREG(target.lstat().st_mode)


def test_merge_makes_a_missing_output_folder(profile: Path, tmp_path: Path) -> None:
    target = tmp_path / "new" / "sub" / "m.json"
    proc = jobprof_cli("merge", str(profile), "-o", str(target))
    assert proc.returncode == 0 and json.loads(target.read_text())["traceEvents"], proc.stderr
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) & ~0o750 == 0


@pytest.mark.parametrize("command", ["report", "merge"])
@pytest.mark.parametrize("where", ["/proc/jobprof-out.json", "/proc/jobprof-missing/out.json"])
def test_output_where_nothing_can_be_written(profile: Path, command: str, where: str) -> None:
    proc = jobprof_cli(command, str(profile), "-o", where)
    no_traceback(proc)
    assert proc.returncode in (1, 2) and "jobprof: error:" in proc.stderr, proc.stderr
    assert "/proc/jobprof-" in proc.stderr


def test_kineto_output_link_is_refused(profile: Path, tmp_path: Path) -> None:
    prof = copy_of(profile, tmp_path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    here = tmp_path / "here"
    (here / "kineto").mkdir(parents=True)
    (here / "kineto" / "iteration_1").symlink_to(foreign)  # the default output's first folder
    proc = jobprof_cli("kineto", str(prof), cwd=here)
    no_traceback(proc)
    assert proc.returncode == 1 and "iteration_1 is a symbolic link" in proc.stderr, proc.stderr
    assert not list(foreign.iterdir())
    linked = tmp_path / "linked"
    linked.symlink_to(foreign)
    proc = jobprof_cli("kineto", str(prof), "-o", str(linked))
    assert proc.returncode == 1 and "is a symbolic link" in proc.stderr, proc.stderr
    assert not list(foreign.iterdir())


# --- finding 2: nothing planted inside a PROF_ folder is followed ---------------------------

@pytest.mark.parametrize("name", ["step_trace_0_1_1.csv", "merged.json.gz"])
def test_planted_temp_file_link_is_never_followed(tmp_path: Path, name: str) -> None:
    shadow = victim(tmp_path)
    folder = tmp_path / "summary"
    folder.mkdir()
    planted = folder / f".{name}.{os.getpid()}.tmp"  # the name StreamedFile tried first
    planted.symlink_to(shadow)
    fsio.atomic_write(folder / name, "Iteration ID,FP Start\n1,2\n")
    assert shadow.read_text() == VICTIM_TEXT
    assert planted.is_symlink()
    assert (folder / name).read_bytes() == b"Iteration ID,FP Start\n1,2\n"
    with fsio.StreamedFile(folder / name) as out:  # the streamed (and .gz) form too
        out.handle.write("x")
        out.finish()
    assert shadow.read_text() == VICTIM_TEXT


def _rendered(device: Path) -> list[Path]:
    return [p for sub in ("timeline", "summary") for p in (device / sub).glob("*")]


@pytest.mark.parametrize("linked", ["device_0", "device_0/summary", "device_0/timeline"])
def test_export_refuses_symlinked_folders(profile: Path, tmp_path: Path, linked: str) -> None:
    prof = copy_of(profile, tmp_path)
    # a second, honest device: export must go on with it
    shutil.copytree(prof / "device_0", prof / "device_1")
    for meta in (prof / "device_1").glob("*.0*"):
        meta.rename(meta.with_name(meta.name.replace(".0", ".1", 1)))
    for device in ("device_0", "device_1"):
        for path in _rendered(prof / device):
            path.unlink()
    foreign = tmp_path / "foreign"
    shutil.move(prof / linked, foreign)
    (prof / linked).symlink_to(foreign)
    before = sorted(p.relative_to(foreign) for p in foreign.rglob("*"))
    proc = jobprof_cli("export", str(prof))
    no_traceback(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{prof / linked} is a symbolic link" in proc.stderr, proc.stderr
    assert sorted(p.relative_to(foreign) for p in foreign.rglob("*")) == before  # nothing written there
    assert len(_rendered(prof / "device_1")) >= 6  # the other device was exported


def test_cann8_stage_name_planted_link(profile: Path, tmp_path: Path) -> None:
    prof = copy_of(profile, tmp_path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (prof / f".{cann8.FOLDER}.{os.getpid()}.tmp").symlink_to(foreign)  # the old stage name
    result = cann8.assemble(prof)
    assert result.files and not list(foreign.iterdir())
    assert not (prof / cann8.FOLDER).is_symlink()


@pytest.mark.parametrize("plant", ["data", "segment", "fifo"])
def test_raw_writer_refuses_planted_links(tmp_path: Path, plant: str) -> None:
    shadow = victim(tmp_path)
    device = tmp_path / "PROF_000001_20260101000000000_ABCDEFGHIJKLMNOP" / "device_0"
    device.mkdir(parents=True)
    if plant == "data":
        (tmp_path / "elsewhere").mkdir()
        (device / "data").symlink_to(tmp_path / "elsewhere")
    else:
        (device / "data").mkdir()
        segment = device / "data" / "raw.000000001.jsonl"
        segment.symlink_to(shadow) if plant == "segment" else os.mkfifo(segment)
    writer = rawstore.RawWriter(device)
    with pytest.raises(fsio.UnsafePath, match=r"is a (symbolic link|named pipe)"):
        writer.append(1, {"iteration": [{}]})
    assert shadow.read_text() == VICTIM_TEXT
    assert not (tmp_path / "elsewhere").exists() or not list((tmp_path / "elsewhere").iterdir())


@pytest.mark.parametrize("plant", ["data", "kineto"])
def test_scratch_files_never_go_through_a_planted_link(tmp_path: Path, plant: str) -> None:
    """The operator tier's scratch file (made at each iteration end on the training thread):
    its folders made when missing, a planted link at either level refused, nothing written
    through it."""
    from jobprof.files import kinetotrace

    device = tmp_path / "PROF_000001_20260101000000000_ABCDEFGHIJKLMNOP" / "device_0"
    device.mkdir(parents=True)
    first, second = kinetotrace.scratch_file(device), kinetotrace.scratch_file(device)
    assert first != second and first.parent == device / "data" / kinetotrace.FOLDER
    assert first.stat().st_size == 0 and oct(first.stat().st_mode & 0o777) == oct(fsio.FILE_MODE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = device / "data" if plant == "data" else device / "data" / kinetotrace.FOLDER
    moved.rename(tmp_path / "moved")
    moved.symlink_to(elsewhere)
    with pytest.raises(fsio.UnsafePath, match="is a symbolic link"):
        kinetotrace.scratch_file(device)
    assert not list(elsewhere.iterdir())


SWAP_SUMMARY = """
import os, time
from pathlib import Path
import torch
from torch import nn
m = nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(8):
    opt.zero_grad()
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    if step == 1:  # after the first iteration the folders exist: plant the link
        summary = Path(os.environ["JOBPROF_JOB_DIR"]) / "device_0" / "summary"
        summary.rename(summary.with_name("moved"))
        summary.symlink_to(os.environ["FOREIGN"])
print("job done")
"""


@pytest.mark.slow  # a profiled run (or four)
def test_in_process_export_stops_at_a_planted_link(runner: Runner, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    proc = runner.run(SWAP_SUMMARY, OPTIONS, env={"FOREIGN": str(foreign)})
    assert "job done" in proc.stdout
    assert "collection stopped" in proc.stderr and "summary is a symbolic link" in proc.stderr, proc.stderr
    assert not list(foreign.iterdir())


# --- finding 7: JOBPROF_JOB_DIR ---------------------------------------------------------------

@pytest.mark.slow  # a profiled run (or four)
@pytest.mark.parametrize("case", ["dotdot", "symlink", "not_prof"])
def test_hostile_job_dir_is_ignored(runner: Runner, tmp_path: Path, case: str) -> None:
    runner.out.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    if case == "dotdot":
        named = runner.out / ".."
    elif case == "symlink":
        named = runner.out / "PROF_000001_20260101000000000_ABCDEFGHIJKLMNOP"
        named.symlink_to(foreign)
    else:
        named = runner.out / "evil"
    proc = runner.run(JOB, OPTIONS, env={"JOBPROF_JOB_DIR": str(named)})
    assert proc.stderr.count("JOBPROF_JOB_DIR") == 1 and "ignored" in proc.stderr, proc.stderr
    assert not list(foreign.iterdir())
    assert not (tmp_path / "device_0").exists() and not (runner.out / "evil").exists()
    real = [p for p in runner.prof_dirs() if not p.is_symlink()]
    assert len(real) == 1 and (real[0] / "device_0" / "end_info.0").exists()


@pytest.mark.slow  # a profiled run (or four)
def test_valid_job_dir_is_honoured(runner: Runner) -> None:
    named = runner.out / "PROF_000007_20260101000000000_ABCDEFGHIJKLMNOP"
    proc = runner.run(JOB, OPTIONS, env={"JOBPROF_JOB_DIR": str(named)})
    assert "JOBPROF_JOB_DIR" not in proc.stderr
    assert (named / "device_0" / "end_info.0").exists()


# --- finding 9: modes, ~, the index -----------------------------------------------------------

@pytest.mark.slow  # a profiled run (or four)
def test_umask_000_never_widens_modes(profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper"
    script = tmp_path / "job.py"
    script.write_text("import os\nos.umask(0)\n" + textwrap.dedent(JOB))
    env = clean_env(PROFILING_MODE="true", PROFILING_OPTIONS=json.dumps({"output": str(out), **OPTIONS}))
    subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, check=True, timeout=120,
                   capture_output=True)
    [prof] = out.glob("PROF_*")
    exe = str(Path(sys.executable).with_name("jobprof"))
    here = out / "here"  # merge and kineto write into the current folder by default
    here.mkdir(mode=0o750)
    for args in (["export", str(prof), "--layout", "cann8"], ["merge", str(prof)],
                 ["kineto", str(prof)], ["report", str(prof), "-o", str(prof / "r" / "report.html")]):
        if args[0] == "report":
            (prof / "r").mkdir(mode=0o750)
        subprocess.run([exe, *args], env=clean_env(), check=True, timeout=120, capture_output=True, umask=0,
                       cwd=here)
    assert (here / "merged.json").is_file() and (here / "kineto").is_dir()
    checked = 0
    for path in [tmp_path / "new", out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        limit = 0o750 if path.is_dir() else 0o640
        assert mode & ~limit == 0, f"{path}: {oct(mode)} is wider than {oct(limit)}"
        checked += 1
    assert checked > 40


@pytest.mark.slow  # a profiled run (or four)
def test_home_in_output_is_expanded(runner: Runner, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    runner.run(JOB, {**OPTIONS, "output": "~/x"}, env={"HOME": str(home)})
    assert list((home / "x").glob("PROF_*/device_0/end_info.0"))
    assert not (runner.tmp / "~").exists()


@pytest.mark.slow  # a profiled run (or four)
def test_three_jobs_started_together_get_three_indices(runner: Runner) -> None:
    script = runner.script(JOB)
    env = clean_env(PROFILING_MODE="true", PROFILING_OPTIONS=json.dumps({"output": str(runner.out)}))
    procs = [subprocess.Popen([sys.executable, str(script)], env=env, cwd=runner.tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(3)]
    for proc in procs:
        assert proc.wait(timeout=180) == 0, proc.stderr.read()
        proc.stderr.close()
    indices = sorted(int(p.name.split("_")[1]) for p in runner.prof_dirs())
    assert indices == [1, 2, 3]
    # and a fourth, later job counts on
    runner.run(JOB, {})
    assert sorted(int(p.name.split("_")[1]) for p in runner.prof_dirs()) == [1, 2, 3, 4]


_RACE = """
import sys
from pathlib import Path
from jobprof.files import fsio
base, start = Path(sys.argv[1]), float(sys.argv[2])
import time
while time.time() < start:
    pass
for i in range(300):
    fsio.make_dirs(base / f"job{i}" / "prof" / "PROF_x")
"""


def test_processes_making_one_folder_together_never_fail(tmp_path: Path) -> None:
    # the ranks of a job create the output folder at the same moment (their first iteration):
    # a folder another process made between our look and our mkdir is a folder, not an attack
    import time

    start = str(time.time() + 1.5)
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(tmp_path), start], stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(errors)
    assert len(list(tmp_path.glob("job*/prof/PROF_x"))) == 300


#: files of a profile replaced by a FIFO: metadata, the facts cache, a raw segment, a Kineto
#: window, a per-iteration CSV and timeline (issue 29, item 4: each made every command block)
FIFO_FILES = ["device_0/info.json.0", "device_0/data/facts.0.json", "device_0/data/raw.000000001.jsonl",
              "device_0/data/kineto/window.00000001.json.gz",
              "device_0/summary/op_summary_0_4294967295_1.csv",
              "device_0/timeline/kineto_0_4294967295_1.json"]
#: the files an export renders again
RENDERED = ("device_0/summary/", "device_0/timeline/", "device_0/data/facts.")
#: the exports last: they render the per-iteration files again (a FIFO there is replaced by the
#: file rendered from the raw data, never opened)
FIFO_COMMANDS = [["summary"], ["report", "-o", "-"], ["merge", "-o", "-"], ["kineto"], ["diff"],
                 ["export", "--layout", "cann8"], ["export"]]


@pytest.mark.parametrize("name", FIFO_FILES)
def test_a_fifo_in_a_profile_is_named_and_skipped_by_every_command(profile: Path, tmp_path: Path,
                                                                   name: str) -> None:
    prof = copy_of(profile, tmp_path)
    fifo = prof / name
    assert fifo.is_file(), sorted(str(p.relative_to(prof)) for p in prof.rglob("*"))
    fifo.unlink()
    os.mkfifo(fifo)
    # a command that opened the FIFO would block (no writer): jobprof_cli gives each 120 s
    named, replaced = [], False
    for command in FIFO_COMMANDS:
        args = [str(prof)] if command[0] == "diff" else command[1:]  # diff: the profile with itself
        proc = jobprof_cli(command[0], str(prof), *args, cwd=tmp_path)  # kineto's default: ./kineto
        no_traceback(proc)
        # never written through; `export` may put its own regenerated file in its place
        replaced = replaced or (command[0] == "export" and not stat.S_ISFIFO(fifo.lstat().st_mode))
        if replaced:
            break
        assert stat.S_ISFIFO(fifo.lstat().st_mode), command
        if fifo.name in proc.stderr:
            assert "named pipe (FIFO), not a regular file" in proc.stderr, (command, proc.stderr)
            named.append(command[0])
        else:  # a command that does not read this file works as before
            assert proc.returncode == 0, (command, proc.stderr)
    # read before it was rendered again: named; a file no command reads (a CSV the facts file
    # already summarised) is at least never opened
    assert named or replaced, f"no command named {name}"
    assert not replaced or name.startswith(RENDERED), name


def test_summary_of_a_profile_without_iterations_says_why_on_stderr(profile: Path, tmp_path: Path) -> None:
    prof = copy_of(profile, tmp_path)
    for raw in prof.glob("device_0/data/raw.*.jsonl"):
        raw.unlink()
    proc = jobprof_cli("summary", str(prof))
    no_traceback(proc)
    # before: exit 1 with nothing on stderr (issue 29, item 10)
    assert proc.returncode == 1 and "jobprof: no iteration in" in proc.stderr, proc.stderr
    assert "no iteration was recorded" in proc.stdout, proc.stdout


# --- item 5: thousands of empty device folders -----------------------------------------------

EMPTY_DEVICES = 3000


@pytest.mark.parametrize("command", ["summary", "report", "merge", "export", "diff"])
def test_thousands_of_empty_device_folders_cost_little_and_are_said_once(
        profile: Path, tmp_path: Path, command: str) -> None:
    """Before (issue 29 item 5): every worker task loaded the entry points and listed every
    folder, so N folders cost O(N^2) (1,000: 6 s, 10,000: > 150 s), and each empty folder got
    its own lines (20,000 of them from export).  The bound is ~30x what it takes now."""
    prof = copy_of(profile, tmp_path)
    for device in range(1, EMPTY_DEVICES + 1):
        (prof / f"device_{device}").mkdir()
    args = {"summary": ["summary", str(prof)],
            "report": ["report", str(prof), "-o", str(tmp_path / "r.html")],
            "merge": ["merge", str(prof), "-o", str(tmp_path / "m")], "export": ["export", str(prof)],
            "diff": ["diff", str(prof), str(prof)]}[command]
    proc = jobprof_cli(*args, timeout=60)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stderr.splitlines()) <= 3, proc.stderr[:2000]
    if command == "summary":
        said = [ln for ln in proc.stdout.splitlines() if "no iteration was recorded" in ln]
        assert said == [f"  - ranks 1-{EMPTY_DEVICES}: no iteration was recorded"], said
        assert len(proc.stdout.splitlines()) < 100, proc.stdout[-3000:]
    if command in ("merge", "export"):
        assert f"1-{EMPTY_DEVICES}" in proc.stderr, proc.stderr


def test_a_worker_reducing_one_device_lists_no_folder_and_loads_plugins_once(
        profile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobprof.analysis import facts
    from jobprof.analysis import profile as profile_module
    from jobprof.engine.manager import PluginManager

    prof = copy_of(profile, tmp_path)
    for device in range(1, 41):
        (prof / f"device_{device}").mkdir()
    listed, loaded = [], []
    real_list, real_load = profile_module.device_dirs, PluginManager.load_entry_points
    monkeypatch.setattr(profile_module, "device_dirs", lambda *a: listed.append(a) or real_list(*a))
    monkeypatch.setattr(PluginManager, "load_entry_points",
                        lambda self, *a, **k: loaded.append(a) or real_load(self, *a, **k))
    monkeypatch.setattr(facts, "_WORKER_MANAGERS", {})
    reduced = [facts._task(str(prof), device, None, "", False) for device in range(41)]
    assert [f["device"] for f in reduced] == list(range(41))
    assert reduced[0]["entry"]["iterations"]["count"] == 3, list(reduced[0])
    assert listed == [] and len(loaded) == 1, (len(listed), len(loaded))


def test_duplicated_raw_lines_are_counted_once_and_said(profile: Path, tmp_path: Path) -> None:
    """A raw segment whose lines were copied (appended to itself, a restore run twice): before
    (issue 29 item 10) the summary counted "iterations 6, range 1-3" without a word."""
    prof = copy_of(profile, tmp_path)
    [segment] = prof.glob("device_0/data/raw.*.jsonl")
    segment.write_bytes(segment.read_bytes() * 2)
    (prof / "device_0" / "data" / "facts.0.json").unlink(missing_ok=True)
    proc = jobprof_cli("summary", "--json", str(prof))
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    [rank] = json.loads(proc.stdout)["ranks"]
    assert rank["iterations"] == {"count": 3, "first": 1, "last": 3, "gaps": []}, rank
    said = [ln for ln in proc.stderr.splitlines() if "iterations already read" in ln]
    assert len(said) == 1 and "3 line(s) left out" in said[0], proc.stderr


# --- item 10: summary's workers end with it ----------------------------------------------------

def _many_real_devices(profile: Path, tmp_path: Path, count: int) -> Path:
    prof = copy_of(profile, tmp_path)
    (prof / "device_0" / "data" / "facts.0.json").unlink(missing_ok=True)
    for device in range(1, count):
        target = prof / f"device_{device}"
        shutil.copytree(prof / "device_0", target)
        for path in list(target.iterdir()):
            if path.is_file() and (".0." in path.name or path.name.endswith(".0")):
                path.rename(target / path.name.replace(".0", f".{device}", 1))
    return prof


def _children(pid: int) -> set[int]:
    found = set()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat_file.parent.name))
    return found


@pytest.fixture(scope="module")
def many_devices(profile: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 ranks, shared by the tests that only read them (`summary` changes nothing)."""
    return _many_real_devices(profile, tmp_path_factory.mktemp("many_devices"), 400)


def _tiny_pipe() -> tuple[int, int, int]:
    """A pipe at its smallest (a page): a command writing more than that to it blocks until the
    test reads, so it cannot finish before the test lets it.  Its read end, write end and size."""
    read, write = os.pipe()
    return read, write, fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)


def _unread(fd: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])


def _status(pid: int, field: str) -> str:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith(f"{field}:")), "")


def _pool_workers(pid: int) -> set[int]:
    """The command's pool workers (its other child, multiprocessing's resource tracker, is not one)."""
    found = set()
    for child in _children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(child)
        except OSError:
            continue
    return found


def _starting(worker: int) -> bool:
    """A worker that does not ignore SIGINT yet: its initializer has not run (it is starting)."""
    ignored = _status(worker, "SigIgn")
    return bool(ignored) and not int(ignored, 16) & (1 << (signal.SIGINT - 1))


def _reducing(worker: int, prof: Path) -> bool:
    """A worker with a file of the profile open: it is reducing a rank."""
    try:
        fds = os.listdir(f"/proc/{worker}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{worker}/fd/{fd}").startswith(f"{prof}/"):
                return True
        except OSError:
            continue
    return False


def _alive(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


#: Python's import-time line of a module of jobprof's commands: main() is importing them
_COMMAND_IMPORT = re.compile(r"^import time:.*\|\s*jobprof\.(?!cli$|cli\.main$)[\w.]+$", re.MULTILINE)
#: the modules of the commands (jobprof.cli.main.commands())
_COMMAND_MODULES = ("check", "control", "diff", "export", "importer", "kineto", "merge", "plugins", "report",
                    "summary")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(prof: Path, phase: str, sig: int = signal.SIGINT,
               group: bool = False) -> tuple[int, str, set[int]]:
    """Run `jobprof summary --json --jobs 2` on ``prof``, send ``sig`` once it is seen in ``phase``
    (to its process group with ``group``: a terminal's Ctrl-C), and return its exit status,
    stderr and the workers it had.  Its stdout and stderr are pipes the test reads only after the
    signal, stdout at its smallest (a page): the JSON of 400 ranks (about 1 MB) cannot all be
    written before, so the command cannot have finished before the signal, whatever the
    machine's speed.

    - importing: Python's import-time lines on (PYTHONPROFILEIMPORTTIME) and stderr at its
      smallest: the test reads it until the first of jobprof's modules the commands import (not
      ``jobprof``, ``jobprof.cli``, ``jobprof.cli.main``), then reads no more: the imports left
      write more lines than the pipe holds, so the command cannot get past them;
    - reading: stderr at its smallest too, and the first of the 400 warnings about the ranks'
      facts files (the caller made them FIFOs; about 90 kB in all) is in it, and no child
      process exists: the command reads the profile, no worker exists, and none can before the
      test reads stderr;
    - starting workers: a worker exists that does not ignore SIGINT yet (it is importing, its
      initializer has not run);
    - reducing: a worker has a file of the profile open;
    - writing: the JSON has begun (stdout holds some), the workers are gone.
    """
    exe = Path(sys.executable).with_name("jobprof")
    out_r, out_w, out_size = _tiny_pipe()
    assert out_size <= 1 << 16, out_size  # a page, 64 KiB at most: far less than the JSON
    err_r, err_w = _tiny_pipe()[:2] if phase in ("importing", "reading") else os.pipe()
    env = clean_env(PYTHONPROFILEIMPORTTIME="1") if phase == "importing" else clean_env()
    # SIGINT at its default in the command, as a terminal's command has it: a test run started in
    # the background by a non-interactive shell (`cmd &`) ignores SIGINT, and a child inherits that
    proc = subprocess.Popen([str(exe), "summary", "--json", "--jobs", "2", str(prof)], env=env,
                            stdout=out_w, stderr=err_w, start_new_session=group,
                            preexec_fn=_default_sigint)
    os.close(out_w)
    os.close(err_w)
    seen: set[int] = set()
    early = b""  # what the test read of stderr before the signal
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"summary ended before the phase {phase!r} was seen"
            assert time.monotonic() < deadline, f"the phase {phase!r} was never seen"
            workers = _pool_workers(proc.pid)
            seen |= workers
            if phase == "importing" and _unread(err_r):
                early += os.read(err_r, 1 << 16)
                whole = early[:early.rfind(b"\n") + 1]  # not a line cut by the read
                if _COMMAND_IMPORT.search(whole.decode(errors="replace")):
                    break
                continue
            if phase == "reading" and _unread(err_r) and not _children(proc.pid):
                break
            if phase == "starting workers" and any(_starting(w) for w in workers):
                break
            if phase == "reducing" and any(_reducing(w, prof) for w in workers):
                break
            if phase == "writing" and _unread(out_r) and seen and not _alive(workers):
                break
            time.sleep(0.002)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        streams: dict[int, bytes] = {}
        readers = [threading.Thread(target=lambda fd=fd: streams.__setitem__(fd, _read_all(fd)))
                   for fd in (out_r, err_r)]
        for reader in readers:
            reader.start()
        while proc.poll() is None and time.monotonic() < deadline + 30:
            seen |= _pool_workers(proc.pid)
            time.sleep(0.01)
        proc.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(out_r)
        os.close(err_r)
    deadline = time.monotonic() + 10
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(seen), f"workers still running after the command ended: {_alive(seen)}"
    return proc.returncode, (early + streams.get(err_r, b"")).decode(errors="replace"), seen


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _interrupted(code: int, err: str, said: str = "jobprof summary: interrupted") -> None:
    """Exit status 130, ``said`` as stderr's last line (Python's import-time lines aside), no
    traceback."""
    lines = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert code == 130, (code, err[-3000:])
    assert lines and lines[-1] == said, err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_summary_ends_its_workers(many_devices: Path, sig: int) -> None:
    """Before (issue 29 item 10): Ctrl-C did not stop `summary` on a large folder, and after a
    SIGTERM its workers ran on with PPID 1.  Issue 47 item 4: this test slept 1 s after the
    workers appeared and could signal a command whose output was already written (exiting 0);
    now the signal goes while a worker reduces a rank, and the output cannot be whole by then."""
    code, err, workers = _interrupt(many_devices, "reducing", sig)
    assert len(workers) == 2, workers
    if sig == signal.SIGINT:
        _interrupted(code, err)
    else:
        assert code == -signal.SIGTERM, (code, err[-3000:])


@pytest.mark.parametrize(("phase", "group"), [("importing", False), ("reading", False),
                                              ("starting workers", False), ("starting workers", True),
                                              ("reducing", True), ("writing", False)])
def test_ctrl_c_ends_summary_in_every_phase(many_devices: Path, tmp_path: Path, phase: str,
                                            group: bool) -> None:
    """Issue 47 item 4: Ctrl-C ends `summary --jobs 2` with 130, one "interrupted" line and no
    worker left, in each phase the test can see from outside (:func:`_interrupt`).  ``group``:
    sent to the command's process group, as a terminal sends it (its workers get it too).
    Before: during the commands' imports (about half a second) it was a KeyboardInterrupt
    traceback and a death by SIGINT; a worker that got it while starting printed a traceback,
    and so did one spawned as the command was interrupted; an interrupted pool could leave an
    ``OSError: [Errno 9] Bad file descriptor`` traceback from CPython's exit hook."""
    prof = many_devices
    if phase == "reading":  # a warning for each rank before any worker, and a rank each to reduce
        prof = tmp_path / many_devices.name  # linked, not copied: the FIFOs are new names
        shutil.copytree(many_devices, prof, symlinks=True, copy_function=os.link)
        for device in range(400):
            facts_file = prof / f"device_{device}" / "data" / f"facts.{device}.json"
            assert not facts_file.exists()
            os.mkfifo(facts_file)
    code, err, workers = _interrupt(prof, phase, group=group)
    if phase == "importing":  # before the arguments were read: no command named yet
        _interrupted(code, err, "jobprof: interrupted")
        imported = {m for m in _COMMAND_MODULES if re.search(rf"\| +jobprof\.cli\.{m}$", err, re.MULTILINE)}
        assert set(_COMMAND_MODULES) - imported, "the commands were all imported before the signal"
    else:
        _interrupted(code, err)
    if phase in ("importing", "reading"):
        assert not workers, workers
