"""runtime_api: every CUDA runtime and driver API call per iteration, and those that block the host.

msprof's ``runtime_api`` records the host's API calls (AscendCL, runtime) into ``api_statistic``
and the master timeline's API layer.  jobprof's equivalent on CUDA: every call Kineto records
as ``cuda_runtime`` (level ``runtime``) or ``cuda_driver`` (level ``driver``) in the operator
capture (HIP's on ROCm, imported as the same categories), read from the core stream ``ops``
(:mod:`jobprof.plugins.runtime_api.calls`), so the plugin keeps no stream of its own:

* ``summary/api_statistic_<dev>_<model>_<iter>.csv``: per API, msprof's columns
  (:mod:`jobprof.plugins.runtime_api.writer`);
* an ``API`` process in the master timeline, a track per host thread, one event per call with
  the operator that made it and Kineto's correlation id (task_trace then draws its CANN layer
  without them and starts its HostToDevice flows on these events);
* a ``jobprof summary`` / ``report`` section (top APIs per rank, synchronising call sites) and
  the finding ``runtime_api_sync`` (:mod:`jobprof.plugins.runtime_api.report`).

A CPU-only build of torch has no runtime API: one line says so, once per job, ``info.json``
records it (``jobprof.runtime_api``), no file is written and no operator capture is asked for; a
GPU build whose program never initialised CUDA says so at the end.

Switch: ``"runtime_api": "on"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    JSON,
    Config,
    ExportContext,
    Iteration,
    PluginSession,
    Streams,
    WriterSpec,
    hookimpl,
)

# the writer and the report are imported where they are used (`statistics`, attrs classes: ~7 ms
# of every profiled interpreter's start-up otherwise)
NAME = "runtime_api"

if TYPE_CHECKING:
    from jobprof.plugin import Profile, Section, Timeline

#: said once per job on a machine without CUDA (and recorded in info.json)
CPU_ONLY = ("runtime_api: no CUDA runtime in this job (CPU only): there are no runtime API calls to "
            "record; no api_statistic file is written")
#: where the calls come from on CUDA (info.json)
SOURCE = "Kineto's cuda_runtime and cuda_driver activities (CUPTI), in the operator capture"


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    """The key is in jobprof's schema already (msprof's ``runtime_api``); its default."""
    return {"properties": {"runtime_api": {"default": "off"}}}


@hookimpl
def jobprof_configure(config: Config) -> bool:
    """Active only with ``"runtime_api": "on"``."""
    return config.is_on(NAME)


#: said once per job by a CUDA / ROCm build whose program never initialised the device
UNUSED = ("runtime_api: this job never used CUDA (torch.cuda was not initialised): there were no "
          "runtime API calls to record")


def _gpu_build(torch: Any) -> bool:
    """torch was built for CUDA or ROCm.  Not ``torch.cuda.is_available()``: that initialises the
    CUDA driver in the job's process (cudaGetDeviceCount), after which a child it forks cannot
    use CUDA: the profiled program would behave differently."""
    version = getattr(torch, "version", None)
    return bool(getattr(version, "cuda", None) or getattr(version, "hip", None))


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    """On a CUDA / ROCm build, ask for the operator capture (the calls are in it); on a CPU-only
    build, say once that there is nothing to record and record why in info.json."""
    import torch

    if not _gpu_build(torch):
        session.set_info(NAME, {"available": False, "reason": "CPU only: no CUDA runtime"})
        session.reporter.once_per_job("", CPU_ONLY)
        return
    session.attach(NAME, torch)
    session.request_ops(shapes=False)
    session.set_info(NAME, {"available": True, "source": SOURCE})


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    """A GPU build whose program never touched the device (``is_initialized``: no driver call):
    said once, not a silent absence of files."""
    torch = session.attached(NAME)
    if torch is None:
        return
    try:
        used = bool(torch.cuda.is_initialized())
    except Exception:
        return
    if not used:
        session.set_info(NAME, {**(session.get_info(NAME) or {}), "used": False})
        session.reporter.once_per_job("", UNUSED)


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    """``api_statistic``: per API of the iteration, msprof's columns."""
    # the report too (its iteration facts): asked on the training thread, the exporting thread
    # then imports nothing
    from jobprof.plugins.runtime_api import report  # noqa: F401
    from jobprof.plugins.runtime_api.writer import render_csv

    return [WriterSpec("api_statistic", "csv", render_csv,
                       "per CUDA runtime / driver API: level, total, count, mean, min, max, variance of its "
                       "host time (no file on a CPU-only job)")]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    """The master timeline's API layer."""
    from jobprof.plugins.runtime_api.writer import add_to_master

    add_to_master(ctx, timeline)


@hookimpl
def jobprof_iteration_facts(iteration: Iteration, streams: Streams) -> JSON:
    """Per-API totals and synchronising call sites of one iteration."""
    from jobprof.plugins.runtime_api.report import iteration_digest

    return iteration_digest(iteration, streams)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    """A device's API totals and synchronising calls."""
    from jobprof.plugins.runtime_api.report import rank_facts

    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    """The API table and the synchronising calls, with the ``runtime_api_sync`` finding."""
    from jobprof.plugins.runtime_api.report import sections

    return sections(profile)
