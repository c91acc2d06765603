"""PipeUtilization (msprof's default group): how long each execution unit was busy per task.

On Ascend each column is a hardware cycle count of one pipe (cube ``mac``, ``vec``, ``scalar``,
the data movers ``mte1/2/3``).  Here, per task (CPU operator, or CUDA kernel):

* ``aicore_time(us)``: the task's measured duration.  ``total_cycles``: N/A (no per-operator
  cycle counter is readable from Python here).
* ``mac_time(us)``: the time the task's matmul-family FLOPs (``cube``, from input shapes: exact,
  see :mod:`jobprof.plugin.opmath`) need at the machine's measured peak matmul FLOP/s for its dtype
  (:mod:`jobprof.ops.calibrate`); ``mac_ratio`` = mac_time / aicore_time, which equals achieved
  FLOP/s / peak FLOP/s.  0 for an op with no matmul work; N/A when the FLOPs are unknown or no
  peak was measured for the dtype (a CPU calibration measures float32 only).
* ``vec_time(us)`` / ``vec_ratio``: the same with elementwise FLOPs and the measured vector peak.
* ``mte2_time(us)`` / ``mte2_ratio``: bytes read (logical input sizes) / the measured memory
  bandwidth; ``mte3_*``: bytes written likewise.  The calibration's bandwidth counts a copy's
  read and write together, so mte2 + mte3 of a copy is the time the calibration copy needs for
  it.
* ``memory_bound`` = mte2_ratio / max(mac_ratio, vec_ratio) (the contract's formula); N/A when
  a term is unknown or both compute ratios are 0.
* ``scalar_*``, ``mte1_*`` (L1 -> L0 moves), ``icache_miss_rate``: no analogue measured: N/A.

Ratios are not clamped to 1: an operator faster than the calibration's best shows > 1.

CUDA: the same derivation with the GPU's calibration (UNVERIFIED: no GPU here).  No CUPTI metric
is requested: this is the group every default run gets, and per-kernel CUPTI metrics make Kineto
replay kernels.  The planned mapping, once verified: total_cycles = ``sm__cycles_elapsed.max``,
mac_ratio = ``sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active`` / 100,
vec_ratio = ``sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active`` / 100.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobprof.plugin import NA
from jobprof.plugins.aic_metrics import _group as g

GROUP = "PipeUtilization"
COLUMNS = ("aicore_time(us)", "total_cycles", "vec_time(us)", "vec_ratio", "mac_time(us)", "mac_ratio",
           "scalar_time(us)", "scalar_ratio", "mte1_time(us)", "mte1_ratio", "mte2_time(us)", "mte2_ratio",
           "mte3_time(us)", "mte3_ratio", "icache_miss_rate", "memory_bound")
_DERIVED_CUDA = "CUDA: the same, with the GPU's calibration (unverified)"
SOURCES = {
    "aicore_time(us)": "CPU and CUDA: the task's measured duration (Task Duration)",
    "total_cycles": "N/A: no per-operator cycle counter is readable from Python (CPU); CUDA: planned "
                    "sm__cycles_elapsed.max (CUPTI), not requested until verified on a GPU",
    "vec_time(us)": "CPU: elementwise FLOPs (input shapes) / measured vector peak FLOP/s for the dtype "
                    f"(calibration); 0 without vector work; {_DERIVED_CUDA}",
    "vec_ratio": f"CPU: vec_time / aicore_time (unclamped); {_DERIVED_CUDA}",
    "mac_time(us)": "CPU: matmul-family FLOPs (exact, input shapes and convolution strides) / "
                    f"measured matmul peak FLOP/s for the dtype (calibration); {_DERIVED_CUDA}",
    "mac_ratio": f"CPU: mac_time / aicore_time = achieved / peak FLOP/s (unclamped); {_DERIVED_CUDA}",
    "scalar_time(us)": "N/A: no scalar-unit analogue is measured (CPU and CUDA)",
    "scalar_ratio": "N/A: no scalar-unit analogue is measured (CPU and CUDA)",
    "mte1_time(us)": "N/A: no L1->L0 mover analogue (CPU and CUDA)",
    "mte1_ratio": "N/A: no L1->L0 mover analogue (CPU and CUDA)",
    "mte2_time(us)": "CPU: bytes read (input shapes x dtype sizes) / measured memory bandwidth "
                     f"(calibration copy); {_DERIVED_CUDA}",
    "mte2_ratio": f"CPU: mte2_time / aicore_time; {_DERIVED_CUDA}",
    "mte3_time(us)": "CPU: bytes written (output shapes x dtype sizes) / measured memory bandwidth; "
                     f"{_DERIVED_CUDA}",
    "mte3_ratio": f"CPU: mte3_time / aicore_time; {_DERIVED_CUDA}",
    "icache_miss_rate": "N/A: no per-operator instruction-cache counter is readable (CPU and CUDA)",
    "memory_bound": "mte2_ratio / max(mac_ratio, vec_ratio) (contract formula); N/A when undefined",
}


def _static_cells(w: g.Work) -> tuple[str, ...]:
    """vec/mac/mte2/mte3 times and memory_bound: none depends on the duration (it cancels out of
    mte2_ratio / max(mac_ratio, vec_ratio))."""
    compute = max(w.mac, w.vec) if w.mac is not None and w.vec is not None else None
    return g.us(w.vec), g.us(w.mac), g.us(w.mte2), g.us(w.mte3), g.ratio_cell(w.mte2, compute)


def values(task: Any, machine: Mapping[str, Any]) -> list[str]:
    seconds, w = g.derive(task, machine)
    cells = w.cells.get(GROUP)
    if cells is None:
        cells = w.cells[GROUP] = _static_cells(w)
    vec_us, mac_us, mte2_us, mte3_us, bound = cells
    if not seconds:  # a zero duration: no ratio; and memory_bound is one only when they exist
        bound = NA
    ratio = g.ratio_cell
    return [g.duration_us(task), NA, vec_us, ratio(w.vec, seconds), mac_us, ratio(w.mac, seconds), NA, NA, NA,
            NA, mte2_us, ratio(w.mte2, seconds), mte3_us, ratio(w.mte3, seconds), NA, bound]


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=True)
