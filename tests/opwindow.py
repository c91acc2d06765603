"""Operators recorded for real in this process, read back the one way jobprof reads them.

``record(torch, work, folder)`` runs ``work()`` under the core's operator capture
(:class:`jobprof.ops.opcapture.OpCapture`), lets Kineto write the window as jobprof's session
does, and returns the ``ops`` records of the operators that started during ``work`` as
:class:`jobprof.files.kinetotrace.Windows` resolves them for the exporter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def record(torch: Any, work: Callable[[], Any], folder: Path,
           shapes: bool = True) -> tuple[list[list], int, int]:
    """(records, start ns, end ns) of ``work``; fails on any warning of the capture."""
    from jobprof.files import fsio, kinetotrace
    from jobprof.ops.opcapture import Detail, OpCapture

    warnings: list[str] = []
    capture = OpCapture(torch, Detail(shapes=shapes), warnings.append)
    device = folder / "PROF_test" / "device_0"
    fsio.make_dirs(device / "data", root=folder)
    capture.scratch = lambda: kinetotrace.scratch_file(device)  # as the session sets it
    capture.start()
    begin = time.monotonic_ns()
    work()
    end = time.monotonic_ns()
    capture.cut(end)
    refs = capture.take_windows(begin, end + 1, lambda result, n: kinetotrace.save_window(result, n, device),
                                lambda name: kinetotrace.forget_window(name, device))
    capture.stop()
    assert not warnings, warnings
    raw = [kinetotrace.reference(r.name, r.offset_ns, r.size, r.first, r.shapes, r.clip_ns) for r in refs]
    return kinetotrace.Windows(device / "data").resolve(raw, begin, end + 1), begin, end
