"""Run from ``jobprof-autoload.pth`` at interpreter start when PROFILING_MODE is set.

Cheap by design: the .pth line imports this module only when the value is ``true`` or a
look-alike of it (``True``, ``1``, ...), and this module imports nothing beyond ``os``/``sys``
unless the value is exactly ``true``.
"""

from __future__ import annotations

import os
import sys

#: values that look like an attempt to switch profiling on (the .pth line lists them too)
LOOKALIKES = ("true", "1", "yes", "on", "y", "t", "enable", "enabled")
_done = False


def run() -> None:
    """Start profiling for this process if PROFILING_MODE is exactly ``true`` (idempotent)."""
    global _done
    if _done:
        return
    _done = True
    mode = os.environ.get("PROFILING_MODE")
    if mode == "true":
        if sys.argv and os.path.basename(sys.argv[0]) == "jobprof":
            return  # the CLI reads profiles; it is never a profiled job itself
        try:
            from jobprof.runtime.bootstrap import start

            start()
        except Exception as exc:  # the job comes first, whatever went wrong in here
            sys.stderr.write(f"jobprof: profiling disabled: internal error at start-up: {exc!r}\n")
        return
    meant_true = mode is not None and mode.strip().lower() in LOOKALIKES
    if meant_true and "JOBPROF_HINTED" not in os.environ:
        os.environ["JOBPROF_HINTED"] = "1"  # child processes inherit it: one hint per job
        sys.stderr.write(
            f"jobprof: PROFILING_MODE={mode!r} does not enable profiling; "
            "set PROFILING_MODE=true (lower case, exactly) to profile this job\n"
        )
