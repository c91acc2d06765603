"""Run from ``jobprof-autoload.pth`` at interpreter start when PROFILING_MODE is set.

Cheap by design: the .pth line imports this module only when the value is ``true``,
``dynamic`` or a look-alike of them (``True``, ``1``, ...), and this module imports nothing
beyond ``os``/``sys`` unless the value is exactly ``true`` or ``dynamic``.
"""

from __future__ import annotations

import os
import sys

#: values that look like an attempt to switch profiling on (the .pth line lists them too)
LOOKALIKES = ("true", "1", "yes", "on", "y", "t", "enable", "enabled")
#: what the .pth line imports this module for: the look-alikes and dynamic mode's value
IMPORTED_FOR = (*LOOKALIKES, "dynamic")
_done = False


def run() -> None:
    """Start profiling for this process if PROFILING_MODE is exactly ``true`` or ``dynamic``
    (idempotent)."""
    global _done
    if _done:
        return
    _done = True
    mode = os.environ.get("PROFILING_MODE")
    if mode in ("true", "dynamic"):
        if sys.argv and os.path.basename(sys.argv[0]) == "jobprof":
            return  # the CLI reads profiles; it is never a profiled job itself
        try:
            import time

            started_ns = time.monotonic_ns()  # jobprof's start-up: info.json bootstrap_ms
            from jobprof.runtime.bootstrap import start

            start(dynamic=mode == "dynamic", started_ns=started_ns)
        except Exception as exc:  # the job comes first, whatever went wrong in here
            sys.stderr.write(f"jobprof: profiling disabled: internal error at start-up: {exc!r}\n")
        return
    meant = mode.strip().lower() if mode is not None else ""
    if meant in IMPORTED_FOR and "JOBPROF_HINTED" not in os.environ:
        os.environ["JOBPROF_HINTED"] = "1"  # child processes inherit it: one hint per job
        wanted = "dynamic" if meant == "dynamic" else "true"
        sys.stderr.write(
            f"jobprof: PROFILING_MODE={mode!r} does not enable profiling; "
            f"set PROFILING_MODE={wanted} (lower case, exactly) to profile this job\n"
        )
