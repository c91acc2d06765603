"""Starts the background exporter a finishing job hands its unrendered iterations to.

The exporter (:mod:`jobprof.cli.exporter`, started by module name: the job imports none of
it) runs detached: a session of its own (the job's Ctrl-C and its process group's SIGTERM
do not reach it), no descriptor of the job's (a pipe reading the job's output ends when the
job does), the environment without ``PROFILING_*`` (it is never profiled itself).  It waits on
its stdin until the hand-over file is written, so it never reads a half-made one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jobprof.files import fsio, handover

MODULE = "jobprof.cli.exporter"


def start(device_dir: Path, iterations: list[list[int]], room: int | None) -> int:
    """Start the exporter for ``device_dir`` and leave the hand-over; returns its pid.
    Raises OSError when it cannot start (the caller says so; the raw data is kept)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFILING_")}
    log = fsio.open_append(device_dir / "data" / handover.LOG_NAME, root=device_dir.parent)
    try:
        proc = subprocess.Popen([sys.executable, "-m", MODULE, str(device_dir)], stdin=subprocess.PIPE,
                                stdout=log, stderr=log, close_fds=True, start_new_session=True,
                                env=env, cwd=device_dir)
    finally:
        os.close(log)
    try:  # its priority from its first instruction: its start-up must not slow the job's exit
        os.setpriority(os.PRIO_PROCESS, proc.pid, handover.nice_level())
    except OSError:
        pass  # it lowers itself too, once started
    try:
        handover.write(device_dir, proc.pid, iterations, room)
    finally:
        assert proc.stdin is not None  # stdin=PIPE
        proc.stdin.close()  # the exporter reads the hand-over from here on
    # it outlives the job and is never waited for: marked as reaped, so Popen's finaliser
    # neither warns (a ResourceWarning on the job's stderr under -X dev) nor polls it
    proc.returncode = 0
    return proc.pid
