"""task_trace: every operator and device task of each iteration (op_summary, op_statistic,
task_time) and the host/device layers of the master timeline."""

from __future__ import annotations

from typing import Any

from jobprof.hookspec import hookimpl


@hookimpl
def jobprof_configure(config: Any) -> bool:
    return config.is_on("task_trace")


@hookimpl
def jobprof_session_start(session: Any) -> None:
    session.request_ops(shapes=session.config.level("task_trace") != "l0")
