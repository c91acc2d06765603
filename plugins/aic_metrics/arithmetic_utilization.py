"""ArithmeticUtilization: floating-point operation counts and the share of time per instruction class.

On Ascend, ``mac_fp16_ratio`` etc. are the cycles spent in one instruction class (cube fp16,
cube int8, vector fp32, ...) over the task's total cycles.  Here each is derived the same way as
PipeUtilization's ``mac_ratio``: the FLOPs the task has in that class / the machine's measured
peak for the unit and dtype / the task's duration (unclamped, 3 decimals):

* ``mac_fp16_ratio``: matmul-family FLOPs in float16 or bfloat16 (both 16-bit floats run on the
  same matrix path; Ascend's older naming has no separate bf16 column);
* ``mac_int8_ratio``: matmul-family FLOPs in int8/uint8;
* ``vec_fp32_ratio`` / ``vec_fp16_ratio`` (float16 and bfloat16) / ``vec_int32_ratio``:
  elementwise FLOPs in that dtype;
* ``vec_misc_ratio``: elementwise FLOPs in any other dtype (float64, int64, bool, ...).

A class the task has no work in shows 0.000 (e.g. every mac_* column of an elementwise op, or
of a float32 matmul: Ascend's older naming has no fp32 cube class -- its work is in
``cube_fops``); N/A when the work is unknown or no peak was measured for that dtype (a CPU
calibration measures float32 only, so 16-bit and int8 classes with work are N/A on CPU).
``cube_fops`` / ``vector_fops``: the FLOP counts themselves (:mod:`jobprof.plugin.opmath`: exact for
the matmul family; 1 per output element per arithmetic op).  ``aicore_time(us)``: the task's
duration; ``total_cycles``: N/A on CPU, CUPTI ``sm__cycles_elapsed.max`` on CUDA (UNVERIFIED).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobprof.plugins.aic_metrics import _group as g

GROUP = "ArithmeticUtilization"
COLUMNS = ("aicore_time(us)", "total_cycles", "mac_fp16_ratio", "mac_int8_ratio", "vec_fp32_ratio",
           "vec_fp16_ratio", "vec_int32_ratio", "vec_misc_ratio", "cube_fops", "vector_fops")
CYCLES = "sm__cycles_elapsed.max"
#: CUPTI metrics requested on CUDA (UNVERIFIED)
CUPTI = (CYCLES,)
_FP16 = frozenset({"c10::Half", "c10::BFloat16"})
_INT8 = frozenset({"signed char", "unsigned char"})
_FP32 = frozenset({"float"})
_INT32 = frozenset({"int"})
_VECTOR_NAMED = _FP32 | _FP16 | _INT32

_RATIO = ("FLOPs in this class (input shapes) / measured {unit} peak FLOP/s for the dtype (calibration) / "
          "task duration; 0 without work in the class; N/A when the work is unknown or the dtype's peak "
          "was not measured (CPU measures float32 only). CUDA: the same with the GPU's calibration "
          "(unverified)")
SOURCES = {
    "aicore_time(us)": "CPU and CUDA: the task's measured duration (Task Duration)",
    "total_cycles": f"CPU: N/A (no per-operator cycle counter readable from Python); CUDA: CUPTI {CYCLES} "
                    "(unverified)",
    "mac_fp16_ratio": "matmul float16/bfloat16: " + _RATIO.format(unit="matmul"),
    "mac_int8_ratio": "matmul int8/uint8: " + _RATIO.format(unit="matmul"),
    "vec_fp32_ratio": "elementwise float32: " + _RATIO.format(unit="vector"),
    "vec_fp16_ratio": "elementwise float16/bfloat16: " + _RATIO.format(unit="vector"),
    "vec_int32_ratio": "elementwise int32: " + _RATIO.format(unit="vector"),
    "vec_misc_ratio": "elementwise, other dtypes: " + _RATIO.format(unit="vector"),
    "cube_fops": "CPU and CUDA: matmul-family FLOPs from input shapes (exact: 2*M*N*K; convolutions: "
                 "2*N*out positions*weight elements from recorded stride/padding); N/A when unknown",
    "vector_fops": "CPU and CUDA: elementwise FLOPs from input shapes (1 per output element per "
                   "arithmetic op); N/A when unknown",
}


def _classes(w: g.Work) -> tuple[tuple[float | None, bool], ...]:
    """Per ratio column: (unit time of the class's work, whether the work is in the class).
    Work outside the class, or none at all, shows 0; inside it, its time over the duration."""
    out: list[tuple[float | None, bool]] = []
    for unit_time, amount, members in ((w.mac, w.cube, _FP16), (w.mac, w.cube, _INT8),
                                       (w.vec, w.vector, _FP32), (w.vec, w.vector, _FP16),
                                       (w.vec, w.vector, _INT32), (w.vec, w.vector, None)):
        if amount == 0:
            out.append((0.0, False))
        elif w.dtype is None:
            out.append((None, True))  # unknown dtype: the class is unknown
        else:
            inside = w.dtype not in _VECTOR_NAMED if members is None else w.dtype in members
            out.append((unit_time, True) if inside else (0.0, False))
    return tuple(out)


def values(task: Any, machine: Mapping[str, Any]) -> list[str]:
    seconds, w = g.derive(task, machine)
    cached = w.cells.get(GROUP)
    if cached is None:
        cached = w.cells[GROUP] = (_classes(w), g.integer(w.cube), g.integer(w.vector))
    classes, cube, vector = cached
    shares = [g.ratio_cell(time, seconds) if inside else "0.000" for time, inside in classes]
    cycles = g.counters(task, CUPTI).get(CYCLES) if task.extra else None
    return [g.duration_us(task), g.integer(cycles), *shares, cube, vector]


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=True, cupti=CUPTI)
