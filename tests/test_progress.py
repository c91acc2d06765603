"""Progress bars: ``jobprof export`` and ``summary`` draw one on a terminal and print nothing extra
into a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from conftest import REPO, Runner, clean_env, jobprof_cli

LOOP = REPO / "tests" / "loops.py"


def _through_terminal(*args: str) -> tuple[int, str]:
    """Run ``jobprof`` with stdout and stderr on a pseudo-terminal; returns (exit code, output)."""
    exe = str(Path(sys.executable).with_name("jobprof"))
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdio is the terminal's slave end
        os.execve(exe, [exe, *args], clean_env())
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


def test_export_shows_a_bar_on_a_terminal_and_nothing_in_a_pipe(runner: Runner) -> None:
    runner.run(LOOP, {"training_trace": "on", "task_trace": "off"}, args=["optimizer_loop", "12"])
    [prof] = runner.prof_dirs()
    piped = jobprof_cli("export", str(prof))
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""
    assert "12 iteration(s)" in piped.stdout and "\r" not in piped.stdout

    code, shown = _through_terminal("export", str(prof))
    assert code == 0, shown
    # tqdm's bar: the device label, done over the total of stored iterations, the rate's unit
    # (a fast export may redraw only the first frame before the bar is erased)
    assert "\rdevice_0:" in shown and "/12 [" in shown and "iteration/s" in shown, shown
    assert "12 iteration(s)" in shown

    # summary (and report, diff: the same callback) counts the iterations it reads per rank, over
    # the selected ones as its total; a window, since the whole run is read from the facts file the
    # job wrote (nothing to count)
    piped = jobprof_cli("summary", str(prof), "--iterations", "3-12")
    assert piped.returncode == 0 and piped.stderr == "" and "\r" not in piped.stdout
    code, shown = _through_terminal("summary", str(prof), "--iterations", "3-12")
    assert code == 0 and "\rrank 0:" in shown and "/10 [" in shown and "iteration/s" in shown, shown
    assert "Iteration time (ms)" in shown


def test_progress_wraps_an_iterable_silently_off_a_terminal() -> None:
    code = ("from jobprof.cli.progress import progress\n"
            "print(sum(progress(range(5), desc='x')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "10\n", "")
