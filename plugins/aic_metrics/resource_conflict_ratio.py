"""ResourceConflictRatio: how often the vector unit stalled on a memory bank or a resource.

* CPU: no per-operator counter of bank or resource conflicts is readable from Python: every
  column is N/A.
* CUDA (UNVERIFIED: no GPU here): ``vec_bank_cflt_ratio`` = shared-memory bank conflicts /
  shared-memory wavefronts, from CUPTI
  ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum`` +
  ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum`` over
  ``l1tex__data_pipe_lsu_wavefronts_mem_shared.sum`` (the share of shared-memory accesses
  replayed because of a conflict).  ``vec_bankgroup_cflt_ratio`` (Ascend's bank groups) and
  ``vec_resc_cflt_ratio`` have no CUPTI metric that means the same: N/A.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobprof.plugin import NA
from jobprof.plugins.aic_metrics import _group as g

GROUP = "ResourceConflictRatio"
COLUMNS = ("vec_bankgroup_cflt_ratio", "vec_bank_cflt_ratio", "vec_resc_cflt_ratio")
CONFLICTS_LD = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
CONFLICTS_ST = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
#: CUPTI metrics requested on CUDA (UNVERIFIED)
CUPTI = (CONFLICTS_LD, CONFLICTS_ST, WAVEFRONTS)
SOURCES = {
    "vec_bankgroup_cflt_ratio": "N/A: Ascend's bank groups have no measured analogue (CPU and CUDA)",
    "vec_bank_cflt_ratio": "CPU: N/A (no per-operator bank-conflict counter readable from Python); CUDA: "
                           f"CUPTI ({CONFLICTS_LD} + {CONFLICTS_ST}) / {WAVEFRONTS} (unverified)",
    "vec_resc_cflt_ratio": "N/A: no per-operator resource-conflict counter (CPU); no CUPTI metric means the "
                           "same (CUDA)",
}


def values(task: Any, machine: Mapping[str, Any]) -> list[str]:
    cupti = g.counters(task, CUPTI)
    conflicts = None
    if CONFLICTS_LD in cupti and CONFLICTS_ST in cupti:
        conflicts = cupti[CONFLICTS_LD] + cupti[CONFLICTS_ST]
    return [NA, g.f3(g.ratio(conflicts, cupti.get(WAVEFRONTS))), NA]


#: this group, as the plugin's table of groups lists it (jobprof.plugins.aic_metrics.GROUPS)
SPEC = g.Group(GROUP, COLUMNS, values, SOURCES, peaks=False, cupti=CUPTI)
