"""Keep c10's "Memory block of unknown size" warning, which memory profiling causes, off the job's stderr.

With memory profiling on, torch's CPU allocator looks up the size of every block it frees; a
block allocated while profiling was off (before the capture started: the model, the first
batch) is not known, and c10 prints ``Memory block of unknown size was allocated before the
profiling started, ...`` on stderr at the first such free and at every 1000th after it
(``ProfiledCPUMemoryReporter::Delete``, a counter shared by the process, no switch to turn it
off).  Unprofiled, the job prints no such line.

So at the capture's start, and as it resumes after a pause (``task_trace_every``), jobprof
frees, itself, blocks allocated while profiling was off (:func:`probes`) until the counter
passes a multiple of 1000, with stderr's file descriptor pointed at a memory file for those few
milliseconds (:func:`absorb`): the warning lands there, anything else written meanwhile
(another thread's output) is copied back to the real stderr.  At least 992 unknown frees are
then silent; a sampled stretch of the capture that frees more blocks it did not see allocated
sees the line again, as torch.profiler's users do.  Where ``os.memfd_create`` is missing
nothing is redirected, and the line may show.
"""

from __future__ import annotations

import os
from typing import Any

#: the text of the line c10 prints (``CPUAllocator.cpp``)
MESSAGE = b"Memory block of unknown size was allocated before"
#: c10 prints at every 1000th unknown free: this many frees pass a multiple of it
PROBES = 1000
#: frees between two looks at the memory file (past the warning, at most this many - 1 more
#: frees count toward the next one)
CHECK_EVERY = 8


def probes(torch: Any) -> list[Any]:
    """Small CPU blocks allocated now, while memory profiling is off (before the capture)."""
    return [torch.empty(1, dtype=torch.uint8) for _ in range(PROBES)]


def absorb(blocks: list[Any]) -> list[Any]:
    """Free ``blocks`` one by one (memory profiling now on) until c10 printed its warning,
    which goes to a memory file instead of stderr; returns the blocks left, to be freed once
    profiling is off again (there their free counts for nothing).  Never raises."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is None or not blocks:
        return blocks
    try:
        sink = memfd("jobprof-stderr")
    except OSError:
        return blocks
    saved = -1
    try:
        saved = os.dup(2)
        os.dup2(sink, 2)
        while blocks:
            for _ in range(min(CHECK_EVERY, len(blocks))):
                blocks.pop()  # freed here: an unknown free
            if os.fstat(sink).st_size and MESSAGE in os.pread(sink, 1 << 16, 0):
                break
    except OSError:
        pass
    finally:
        if saved >= 0:
            os.dup2(saved, 2)
            os.close(saved)
        try:
            data = os.pread(sink, max(0, os.fstat(sink).st_size), 0)
            rest = b"".join(line for line in data.splitlines(keepends=True) if MESSAGE not in line)
            if rest:  # what the program (another thread) wrote meanwhile, not lost
                os.write(2, rest)
        except OSError:
            pass
        os.close(sink)
    return blocks
