"""L2Cache: L2 hits and miss-allocates per task, for writes and the two read ports.

* CPU: N/A in every column.  The last-level-cache counters (perf events, see
  :mod:`jobprof.ops.perfcounters`) can only be attributed to an operator by reading them around
  every operator call from Python; a metric group gets just the task and the calibration at
  export, so it has no such reading.  The ``l2`` switch does exactly that per operator (at a
  cost) and writes the ``l2_cache`` file with the hit rate: use it for CPU cache behaviour.
* CUDA (UNVERIFIED: no GPU here): sector counts from CUPTI per kernel --
  ``write_cache_hit`` = ``lts__t_sectors_op_write_lookup_hit.sum``,
  ``write_cache_miss_allocate`` = ``lts__t_sectors_op_write_lookup_miss.sum``,
  ``r0_read_cache_hit`` = ``lts__t_sectors_op_read_lookup_hit.sum``,
  ``r0_read_cache_miss_allocate`` = ``lts__t_sectors_op_read_lookup_miss.sum``.
  ``r1_*`` (Ascend's second read port) has no analogue: N/A.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobprof.plugin import NA
from jobprof.plugins.aic_metrics import _group as g

GROUP = "L2Cache"
COLUMNS = ("write_cache_hit", "write_cache_miss_allocate", "r0_read_cache_hit", "r0_read_cache_miss_allocate",
           "r1_read_cache_hit", "r1_read_cache_miss_allocate")
#: column -> CUPTI metric (CUDA, UNVERIFIED)
MAPPING = {
    "write_cache_hit": "lts__t_sectors_op_write_lookup_hit.sum",
    "write_cache_miss_allocate": "lts__t_sectors_op_write_lookup_miss.sum",
    "r0_read_cache_hit": "lts__t_sectors_op_read_lookup_hit.sum",
    "r0_read_cache_miss_allocate": "lts__t_sectors_op_read_lookup_miss.sum",
}
CUPTI = tuple(MAPPING.values())
_CPU = "CPU: N/A (LLC perf counters cannot be read per operator by a metric group; the l2 switch does)"
SOURCES = {column: f"{_CPU}; CUDA: CUPTI {metric} (sectors, unverified)"
           for column, metric in MAPPING.items()}
SOURCES.update({
    "r1_read_cache_hit": "N/A: Ascend's second read port has no analogue (CPU and CUDA)",
    "r1_read_cache_miss_allocate": "N/A: Ascend's second read port has no analogue (CPU and CUDA)",
})


def values(task: Any, machine: Mapping[str, Any]) -> list[str]:
    cupti = g.counters(task, CUPTI)
    return [g.integer(cupti.get(MAPPING[c])) if c in MAPPING else NA for c in COLUMNS]


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=False, cupti=CUPTI)
