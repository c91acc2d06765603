"""aicpu: host-side operator execution, split into compute, copy and framework (dispatch) time.

msprof's aicpu file lists the operators that ran on the AI CPU, each split into compute,
memcpy and dispatch time.  jobprof's equivalent is the host: one row per top-level operator
(called from Python or by the autograd engine, with no dispatcher operator around it), its time
split from the operator tree Kineto recorded (see :mod:`jobprof.plugins.aicpu.split` for the
exact rule and the operator lists).  Writes ``summary/aicpu_<dev>_<model>_<iter>.csv`` and a
``jobprof summary`` section (top operators, framework-bound verdict).

On CUDA jobs the split is of the host time of each operator, and operators that launched no
device work are marked ``<name> [host]`` in the Node column: the model runs on the GPU but they
ran entirely on the CPU (e.g. ``aten::nonzero`` on a CPU tensor, ``aten::item`` waits).
UNVERIFIED on a GPU so far.

Switch: ``"aicpu": "on"`` (the dp plugin also follows it when ``dp`` is unset).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobprof.plugin import JSON, Config, PluginSession, Section, WriterSpec, hookimpl
from jobprof.plugins.aicpu.report import aicpu_sections, rank_facts
from jobprof.plugins.aicpu.writer import render_csv

if TYPE_CHECKING:
    from jobprof.plugin import Profile


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {"properties": {"aicpu": {"default": "off"}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on("aicpu")


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    # the split needs the operator tree, not shapes
    session.request_ops(shapes=False)


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [WriterSpec("aicpu", "csv", render_csv,
                       "one row per top-level operator: compute / memcpy / dispatch split of its time")]


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return aicpu_sections(profile)
