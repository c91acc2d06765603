"""Memory: the bandwidth each task achieved to and from memory.

* ``main_mem_read_bw(GB/s)`` = bytes read / task duration; ``main_mem_write_bw(GB/s)`` = bytes
  written / duration (GB = 10^9 bytes, 3 decimals).  On CPU the bytes are the logical sizes of
  the operator's inputs and outputs (:mod:`jobprof.plugin.opmath`): the traffic the algorithm needs if
  every byte came from and went to DRAM -- an upper bound on real DRAM traffic when caches hit.
  N/A when the op's bytes are unknown.
* CUDA (UNVERIFIED: no GPU here): the DRAM bytes CUPTI counted for the kernel
  (``dram__bytes_read.sum`` / ``dram__bytes_write.sum``) when Kineto delivered them, else the
  same logical bytes as on CPU; ``l2_read_bw`` / ``l2_write_bw`` from the L2 sectors CUPTI counted
  (``lts__t_sectors_op_read.sum`` / ``lts__t_sectors_op_write.sum``, 32 bytes each);
  ``total_cycles`` = ``sm__cycles_elapsed.max``.
* ``aicore_time(us)``: the task's duration.  ``ub_*`` (Ascend's unified buffer) and ``l1_*``:
  no analogue measured: N/A; on CPU ``l2_*`` and ``total_cycles`` too (no per-operator cache or
  cycle counter readable from Python).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobprof.plugin import NA
from jobprof.plugins.aic_metrics import _group as g

GROUP = "Memory"
COLUMNS = ("aicore_time(us)", "total_cycles", "ub_read_bw(GB/s)", "ub_write_bw(GB/s)", "l1_read_bw(GB/s)",
           "l1_write_bw(GB/s)", "l2_read_bw(GB/s)", "l2_write_bw(GB/s)", "main_mem_read_bw(GB/s)",
           "main_mem_write_bw(GB/s)")
CYCLES = "sm__cycles_elapsed.max"
DRAM_READ, DRAM_WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
L2_READ, L2_WRITE = "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum"
SECTOR_BYTES = 32
#: CUPTI metrics requested on CUDA (UNVERIFIED)
CUPTI = (CYCLES, DRAM_READ, DRAM_WRITE, L2_READ, L2_WRITE)

_NO_UB = "N/A: Ascend's unified buffer has no measured analogue (CPU and CUDA)"
_NO_L1 = "N/A: no per-operator L1 traffic counter readable (CPU); not mapped on CUDA"
SOURCES = {
    "aicore_time(us)": "CPU and CUDA: the task's measured duration (Task Duration)",
    "total_cycles": f"CPU: N/A (no per-operator cycle counter readable from Python); CUDA: CUPTI {CYCLES} "
                    "(unverified)",
    "ub_read_bw(GB/s)": _NO_UB,
    "ub_write_bw(GB/s)": _NO_UB,
    "l1_read_bw(GB/s)": _NO_L1,
    "l1_write_bw(GB/s)": _NO_L1,
    "l2_read_bw(GB/s)": f"CPU: N/A (LLC counters cannot be read per operator here); CUDA: CUPTI {L2_READ} x "
                        "32 B / duration (unverified)",
    "l2_write_bw(GB/s)": f"CPU: N/A (LLC counters cannot be read per operator here); CUDA: CUPTI {L2_WRITE} "
                         "x 32 B / duration (unverified)",
    "main_mem_read_bw(GB/s)": "CPU: bytes read (logical input sizes from shapes; an upper bound on DRAM "
                              f"traffic when caches hit) / duration; CUDA: CUPTI {DRAM_READ} / duration "
                              "(unverified), else as on CPU",
    "main_mem_write_bw(GB/s)": "CPU: bytes written (output sizes from shapes) / duration; CUDA: CUPTI "
                               f"{DRAM_WRITE} / duration (unverified), else as on CPU",
}


def _bw(amount: float | None, seconds: float | None) -> str:
    if amount is None or not seconds:
        return NA
    return f"{amount / seconds / g.GB:.3f}"


def values(task: Any, machine: Mapping[str, Any]) -> list[str]:
    seconds, w = g.derive(task, machine)
    read: float | None = w.read
    written: float | None = w.written
    cycles = l2_read = l2_write = None
    if task.extra:  # CUDA: the kernel's own counts, when Kineto delivered them
        cupti = g.counters(task, CUPTI)
        read, written = cupti.get(DRAM_READ, read), cupti.get(DRAM_WRITE, written)
        cycles, l2_read, l2_write = cupti.get(CYCLES), cupti.get(L2_READ), cupti.get(L2_WRITE)
    return [g.duration_us(task), g.integer(cycles), NA, NA, NA, NA,
            _bw(None if l2_read is None else l2_read * SECTOR_BYTES, seconds),
            _bw(None if l2_write is None else l2_write * SECTOR_BYTES, seconds),
            _bw(read, seconds), _bw(written, seconds)]


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=False, cupti=CUPTI)
