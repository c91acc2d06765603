"""MemoryAccess: the data volume each task moved, per path (KB = 1024 bytes, 3 decimals).

* ``read_main_memory_datas(KB)`` = bytes read / 1024; ``write_main_memory_datas(KB)`` = bytes
  written / 1024.  On CPU: the logical sizes of the operator's inputs and outputs from the
  recorded shapes and dtypes (:mod:`jobprof.plugin.opmath`; ``dst.copy_(src)`` reads src and writes
  dst), N/A when unknown.  On CUDA (UNVERIFIED: no GPU here): the DRAM bytes CUPTI counted for
  the kernel (``dram__bytes_read.sum`` / ``dram__bytes_write.sum``) when Kineto delivered them,
  else the same logical bytes.
* ``gm_to_l1``, ``l0c_to_l1``, ``l0c_to_gm``, ``gm_to_ub``, ``ub_to_gm``: paths between Ascend's
  on-chip buffers, which have no measured analogue here: N/A.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobprof.plugin import NA
from jobprof.plugins.aic_metrics import _group as g

GROUP = "MemoryAccess"
COLUMNS = ("read_main_memory_datas(KB)", "write_main_memory_datas(KB)", "gm_to_l1_datas(KB)",
           "l0c_to_l1_datas(KB)", "l0c_to_gm_datas(KB)", "gm_to_ub_datas(KB)", "ub_to_gm_datas(KB)")
DRAM_READ, DRAM_WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
#: CUPTI metrics requested on CUDA (UNVERIFIED)
CUPTI = (DRAM_READ, DRAM_WRITE)

_NO_PATH = "N/A: a path between Ascend's on-chip buffers, no measured analogue (CPU and CUDA)"
SOURCES = {
    "read_main_memory_datas(KB)": "CPU: bytes read (logical input sizes from shapes and dtypes) / 1024; "
                                  f"CUDA: CUPTI {DRAM_READ} / 1024 (unverified), else as on CPU",
    "write_main_memory_datas(KB)": "CPU: bytes written (output sizes from shapes and dtypes) / 1024; "
                                   f"CUDA: CUPTI {DRAM_WRITE} / 1024 (unverified), else as on CPU",
    "gm_to_l1_datas(KB)": _NO_PATH,
    "l0c_to_l1_datas(KB)": _NO_PATH,
    "l0c_to_gm_datas(KB)": _NO_PATH,
    "gm_to_ub_datas(KB)": _NO_PATH,
    "ub_to_gm_datas(KB)": _NO_PATH,
}


def _kb(amount: float | None) -> str:
    return NA if amount is None else f"{amount / g.KB:.3f}"


def values(task: Any, machine: Mapping[str, Any]) -> list[str]:
    if task.extra:  # CUDA: the kernel's own DRAM counts, when Kineto delivered them
        cupti = g.counters(task, CUPTI)
        moved = task.bytes_moved
        read = cupti.get(DRAM_READ, moved[0] if moved is not None else None)
        written = cupti.get(DRAM_WRITE, moved[1] if moved is not None else None)
        return [_kb(read), _kb(written), NA, NA, NA, NA, NA]
    _, w = g.derive(task, machine)
    row = w.cells.get(GROUP)
    if row is None:
        row = w.cells[GROUP] = [_kb(w.read), _kb(w.written), NA, NA, NA, NA, NA]
    return list(row)


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=False, cupti=CUPTI)
