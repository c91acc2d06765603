"""MemoryL0: bandwidth of Ascend's L0 buffers -- L0A/L0B (the cube unit's input operands) and L0C
(its accumulator), also split out for cube traffic.

No PyTorch or CPU analogue is measured: a CPU keeps matmul operands in registers and L1, whose
traffic no per-operator counter readable from Python reports, and on CUDA the tensor cores'
operand staging (registers, shared memory) has no CUPTI metric that means the same thing.  Every
column is therefore N/A on CPU and on CUDA, in every row; the group exists so that a job asking
for it gets msprof's columns and this explanation instead of an error.
"""

from __future__ import annotations

from jobprof.plugins.aic_metrics import _group as g

GROUP = "MemoryL0"
COLUMNS = ("l0a_read_bw(GB/s)", "l0a_write_bw(GB/s)", "l0b_read_bw(GB/s)", "l0b_write_bw(GB/s)",
           "l0c_read_bw(GB/s)", "l0c_write_bw(GB/s)", "l0c_read_bw_cube(GB/s)", "l0c_write_bw_cube(GB/s)")
_REASON = ("N/A: Ascend's L0 buffers (cube operands / accumulator) have no measured analogue: no "
           "per-operator register or L1 traffic counter is readable on CPU, and no CUPTI metric means the "
           "same on CUDA")
SOURCES = {column: _REASON for column in COLUMNS}
values = g.no_source(COLUMNS)


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=False)
