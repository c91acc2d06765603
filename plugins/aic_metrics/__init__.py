"""aic_metrics: msprof's per-task metric groups, appended to ``op_summary`` (docs/msprof.md section 1.2).

One plugin (entry point ``aic_metrics``) with a table of groups, :data:`GROUPS`, one module per
group; each module defines its :class:`~._group.Group` (``SPEC``: name, columns, the function
computing their values, each column's source, what the values need) and documents its columns:

===================================  ===============================================
module                               group (``aic_metrics`` value)
===================================  ===============================================
:mod:`.pipe_utilization`             PipeUtilization (msprof's default group)
:mod:`.arithmetic_utilization`       ArithmeticUtilization
:mod:`.memory`                       Memory
:mod:`.memory_l0`                    MemoryL0
:mod:`.memory_ub`                    MemoryUB
:mod:`.resource_conflict_ratio`      ResourceConflictRatio
:mod:`.l2_cache`                     L2Cache
:mod:`.memory_access`                MemoryAccess
===================================  ===============================================

The plugin claims the core's ``aic_metrics`` key, is active when the options chose one of its
groups (then asks for what that group needs: operators with shapes,
CUPTI metrics, the calibration), and answers ``jobprof_aic_metrics(name)`` for its groups only:
None for any other name, so a third-party group (a plugin of its own that widens the key's
accepted values with ``{"enum": [...]}`` and answers for its name) still plugs in.

Every value is measured (the task's duration, CUPTI counters on CUDA) or derived from
measurement: FLOPs and bytes from the recorded input shapes (:mod:`jobprof.plugin.opmath`) and the
machine's peaks measured once by :mod:`jobprof.ops.calibrate`.  A column with no source on the
machine is ``N/A``; each module's docstring and its ``SOURCES`` say where every column comes
from.  The shared arithmetic lives in :mod:`._group`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jobprof.plugin import JSON, Config, MetricSet, PluginSession, Section, hookimpl
from jobprof.plugins.aic_metrics import (
    _group,
    arithmetic_utilization,
    l2_cache,
    memory,
    memory_access,
    memory_l0,
    memory_ub,
    pipe_utilization,
    resource_conflict_ratio,
)
from jobprof.plugins.aic_metrics.report import aic_metrics_sections, rank_facts

if TYPE_CHECKING:
    from jobprof.plugin import Profile

#: the built-in groups by ``aic_metrics`` value, msprof's default first
GROUPS: Mapping[str, _group.Group] = MappingProxyType({spec.name: spec for spec in (
    pipe_utilization.SPEC, arithmetic_utilization.SPEC, memory.SPEC, memory_l0.SPEC, memory_ub.SPEC,
    resource_conflict_ratio.SPEC, l2_cache.SPEC, memory_access.SPEC)})


def _chosen(config: Config) -> _group.Group | None:
    name = config.get("aic_metrics")
    return GROUPS.get(name) if isinstance(name, str) else None


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    """Claims the core's ``aic_metrics`` key (so it counts as collected) and narrows nothing: the
    core's schema already accepts these groups and ``Custom:<registers>``, and a third-party
    group widens it (an ``enum`` here would narrow the key to these groups)."""
    return {"properties": {"aic_metrics": {
        "description": f"built-in metric groups (jobprof.plugins.aic_metrics): {', '.join(GROUPS)}"}}}


@hookimpl
def jobprof_aic_metrics(name: str) -> MetricSet | None:
    """The metric set of ``name`` when it is one of :data:`GROUPS`, else None (another plugin's
    group, or nobody's)."""
    group = GROUPS.get(name) if isinstance(name, str) else None
    return None if group is None else group.metric_set()


@hookimpl
def jobprof_configure(config: Config) -> bool:
    """Active only when the options chose one of these groups."""
    return _chosen(config) is not None


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    group = _chosen(session.config)
    if group is not None:
        group.start(session)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    """The chosen group's values pooled per operator type (:mod:`.report`)."""
    return rank_facts(profile, device, GROUPS)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return aic_metrics_sections(profile, GROUPS)
