"""aic_metrics: msprof's per-task metric groups, appended to ``op_summary`` (contract section 1.2).

One module per group, each registered as its own entry point (a group is a plugin; a
third-party group is registered exactly the same way):

============================  ====================================================
entry point                   group (``aic_metrics`` value)
============================  ====================================================
``aic_pipe_utilization``      PipeUtilization (msprof's default group)
``aic_arithmetic_utilization`` ArithmeticUtilization
``aic_memory``                Memory
``aic_memory_l0``             MemoryL0
``aic_memory_ub``             MemoryUB
``aic_resource_conflict_ratio`` ResourceConflictRatio
``aic_l2_cache``              L2Cache
``aic_memory_access``         MemoryAccess
============================  ====================================================

Every value is measured (the task's duration, CUPTI counters on CUDA) or derived from
measurement: FLOPs and bytes from the recorded input shapes (:mod:`jobprof.ops.opmath`) and the
machine's peaks measured once by :mod:`jobprof.ops.calibrate`.  A column with no source on the
machine is ``N/A``; each module's docstring and its ``MetricSet.sources`` say where every column
comes from.  The shared arithmetic lives in :mod:`._group`.
"""
