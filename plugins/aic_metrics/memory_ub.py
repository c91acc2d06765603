"""MemoryUB: bandwidth of Ascend's unified buffer (the vector unit's local memory), split by who
moved the data: the data movers (mte), the vector unit, the scalar unit.

No PyTorch or CPU analogue is measured: on a CPU the vector unit works out of registers and the
caches, with no per-operator counter readable from Python, and CUDA's closest store (shared
memory) is not split by these three clients in any CUPTI metric.  Every column is N/A on CPU and
on CUDA, in every row.
"""

from __future__ import annotations

from jobprof.plugins.aic_metrics import _group as g

GROUP = "MemoryUB"
COLUMNS = ("ub_read_bw_mte(GB/s)", "ub_write_bw_mte(GB/s)", "ub_read_bw_vector(GB/s)",
           "ub_write_bw_vector(GB/s)", "ub_read_bw_scalar(GB/s)", "ub_write_bw_scalar(GB/s)")
_REASON = ("N/A: Ascend's unified buffer has no measured analogue: no per-operator counter is readable on "
           "CPU, and CUDA's shared memory is not split by mover/vector/scalar in any CUPTI metric")
SOURCES = {column: _REASON for column in COLUMNS}
values = g.no_source(COLUMNS)


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=False)
