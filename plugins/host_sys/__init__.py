"""host_sys: the host's CPU, memory, disk and network while the job runs, as msprof's host files.

Options (msprof's): ``host_sys`` (comma list of ``cpu,mem,disk,network,osrt``: the job's
processes' usage, and the host's network) and ``host_sys_usage`` (``cpu,mem``: the host's usage
per core and its memory, and every process of the job), sampled at ``host_sys_usage_freq`` Hz
(default 50) by one thread (:mod:`jobprof.plugins.host_sys.sampler`).  On when either list
is non-empty.

Files per iteration (:mod:`jobprof.plugins.host_sys.writer`): ``host_cpu_usage``,
``host_mem_usage``, ``host_disk_usage``, ``host_network_usage`` (``host_sys``), ``cpu_usage``,
``process_cpu_usage``, ``sys_mem``, ``process_mem`` (``host_sys_usage``); the master
timeline's ``CPU Usage``, ``Memory Usage``, ``Disk Usage`` and ``Network Usage`` counters; a
``jobprof summary`` / ``report`` part with findings (:mod:`jobprof.plugins.host_sys.report`).

``osrt`` (the job's system calls: ``perf record`` of the raw_syscalls tracepoints, where the
machine lets it run; else the reason said once, no file) is :mod:`jobprof.plugins.host_sys.osrt`:
``os_runtime_statistic`` and the ``OS Runtime API`` layer.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    JSON,
    Config,
    ExportContext,
    Iteration,
    PluginSession,
    Section,
    Streams,
    StreamsOut,
    WriterSpec,
    hookimpl,
)

if TYPE_CHECKING:
    from jobprof.plugin import Profile, Timeline
    from jobprof.plugins.host_sys import osrt
    from jobprof.plugins.host_sys.sampler import HostSampler

# the sampler, the writers, the report and the tracer are imported where they are used: every
# profiled interpreter's start-up pays for this module alone (all of them: ~18 ms)

#: the streams an iteration carries: the samples taken during it, and the host's facts (cores,
#: page size, link speeds)
SAMPLES = "host_samples"
HOST = "host_facts"

NAME = "host_sys"
#: what the sampler reads for each value of the options (osrt is not the sampler's)
SAMPLED = frozenset({"cpu", "mem", "disk", "network"})
#: iteration methods whose hand-over happens at the iteration's end, on the training thread
ON_TIME = frozenset({"optimizer_step", "explicit"})
DEFAULT_FREQ = 50
#: a hand-over this close to the iteration's end samples the iteration's end state
END_SLACK_NS = 1_000_000
#: info.json key of the system-call tracer (its own: host_sys's is the sampler's)
OSRT_INFO = "host_sys_osrt"


def _items(config: Config, key: str) -> list[str]:
    value = config.get(key) or ""
    return [v for v in value.split(",") if v] if isinstance(value, str) else []


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    return {
        "properties": {
            "host_sys": {"description": "the job's processes' CPU, memory, disk and the host's network"},
            "host_sys_usage": {"description": "the host's CPU per core and memory, every job process's"},
            "host_sys_usage_freq": {"default": DEFAULT_FREQ},
        }
    }


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return bool(_items(config, "host_sys") or _items(config, "host_sys_usage"))


class _State:
    def __init__(self, sampler: HostSampler | None, facts: dict[str, Any],
                 tracer: osrt.OsrtTracer | None = None) -> None:
        self.sampler = sampler
        self.facts = facts
        self.tracer = tracer


def _start_osrt(session: PluginSession) -> osrt.OsrtTracer | None:
    """The system-call tracer (``perf record``), started off the training thread by the thread
    that then converts its output (perf takes ~0.25 s to attach: calls before that are not
    traced); where it cannot run, the reason and what would enable it are said once and no file
    is written."""
    import tempfile
    import threading

    from jobprof.plugins.host_sys import osrt

    reason = osrt.available()
    if reason is not None:
        session.set_info(OSRT_INFO, {"collected": False, "reason": reason})
        session.reporter.once_per_job("", f"host_sys osrt: not collected here: {reason}")
        return None
    tracer = osrt.OsrtTracer()
    pid = os.getpid()

    def trace() -> None:  # perf attaches here, and this thread converts until the end
        try:
            tracer.run(pid, tempfile.gettempdir())
        except (OSError, RuntimeError) as exc:  # OsrtError is a RuntimeError
            tracer.notes.append(f"not collected: {exc}")
            session.reporter.once_per_job("", f"host_sys osrt: not collected: {exc}")

    threading.Thread(target=trace, name="jobprof-osrt", daemon=True).start()
    session.set_info(OSRT_INFO, {"collected": True, "method": "perf record raw_syscalls (CLOCK_MONOTONIC)"})
    return tracer


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    host_sys = _items(session.config, "host_sys")
    usage = _items(session.config, "host_sys_usage")
    freq = session.config.get("host_sys_usage_freq") or DEFAULT_FREQ
    sampled = (set(host_sys) | set(usage)) & SAMPLED
    tracer = _start_osrt(session) if "osrt" in host_sys else None
    if not sampled:
        session.attach(NAME, _State(None, {}, tracer))
        return
    import psutil  # type: ignore[import-untyped]

    from jobprof.plugins.host_sys.sampler import HostSampler

    what = set(sampled)
    if "cpu" in sampled:
        what.add("cores")
    if "mem" in sampled:
        what.add("meminfo")
    sampler = HostSampler(psutil, frozenset(what), int(freq),
                          exclude=tracer.own_pids if tracer is not None else None)
    speeds: dict[str, int] = {}
    if "network" in host_sys:
        try:
            speeds = {name: int(s.speed) for name, s in psutil.net_if_stats().items()}
        except (OSError, psutil.Error):
            speeds = {}
    facts = {
        "host_sys": sorted(set(host_sys) & SAMPLED),
        "host_sys_usage": sorted(usage),
        "freq": int(freq),
        "cpus": psutil.cpu_count() or os.cpu_count(),
        "mem_total_kb": psutil.virtual_memory().total // 1024,
        "page": sampler.page,
        "tick_ns": 1_000_000_000 // os.sysconf("SC_CLK_TCK"),
        "speed_mbps": speeds,
    }
    session.attach(NAME, _State(sampler, facts, tracer))
    sampler.start()
    session.set_info(NAME, {"freq": int(freq), "sampled": sorted(sampled), "source": "/proc (pread)"})


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut | None:
    state: _State = session.attached(NAME)
    streams: dict[str, Any] = {}
    sampler = state.sampler
    if sampler is not None:
        # the end state of the iteration when the program has not run since its end (as
        # task_memory's sampler does): its counters' deltas are then the iteration's own
        now = time.monotonic_ns()
        late = now - iteration.end_ns
        if iteration.method in ON_TIME or 0 <= late <= END_SLACK_NS:  # the hand-over is the end
            sampler.handover(iteration.end_ns - 1)
            session.record_own(now, time.monotonic_ns(), "host_sys sample")
        streams[SAMPLES] = partial(sampler.take, iteration)
        streams[HOST] = [state.facts]
    if state.tracer is not None:  # deferred: the sink thread waits for perf's segment
        from jobprof.plugins.host_sys.osrt import OSRT_STREAM

        streams[OSRT_STREAM] = partial(state.tracer.take_raw, iteration.start_ns, iteration.end_ns)
    return streams or None


def _own_cpu(sampler: HostSampler) -> dict[str, Any]:
    alive = max(1, (sampler.stopped_ns or time.monotonic_ns()) - sampler.started_ns)
    own = sampler.own_ns()
    return {
        "freq": sampler.freq,
        "samples": sampler.count,
        "sampler_cpu_s": round(own / 1e9, 6),
        "sampler_cpu_pct_of_one_core": round(100 * own / alive, 4),
        "handover_cpu_s": round(sampler.handover_ns / 1e9, 6),
        "per_sample_us": round(sampler.sample_wall_ns / 1000 / max(1, sampler.count), 2),
        "failed": sampler.failed,
    }


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    state: _State | None = session.attached(NAME)
    if state is None:
        return
    if state.tracer is not None:
        state.tracer.stop()
        info = session.get_info(OSRT_INFO) or {}
        session.set_info(OSRT_INFO, {**info, "notes": list(state.tracer.notes),
                                     "dropped_over_cap": state.tracer.dropped,
                                     "reattached": state.tracer.reattached,
                                     "perf_cpu_s": round(state.tracer.perf_cpu_s, 3)})
    if state.sampler is None:
        return
    state.sampler.stop()
    session.set_info(NAME, {**(session.get_info(NAME) or {}), **_own_cpu(state.sampler)})


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    # what the export needs, report included (its iteration facts): the job asks for the writers
    # on the training thread, so that the exporting thread imports nothing
    from jobprof.plugins.host_sys import osrt, report  # noqa: F401
    from jobprof.plugins.host_sys.writer import (
        render_cpu_usage,
        render_host_cpu,
        render_host_disk,
        render_host_mem,
        render_host_network,
        render_process_cpu,
        render_process_mem,
        render_sys_mem,
    )

    return [
        WriterSpec(
            "host_cpu_usage",
            "csv",
            render_host_cpu,
            "host_sys cpu: cores of the host, cores the job's processes kept busy",
        ),
        WriterSpec(
            "host_mem_usage",
            "csv",
            render_host_mem,
            "host_sys mem: the host's memory, the job's processes' peak resident memory",
        ),
        WriterSpec(
            "host_disk_usage",
            "csv",
            render_host_disk,
            "host_sys disk: the job's processes' peak storage read and write rates",
        ),
        WriterSpec(
            "host_network_usage",
            "csv",
            render_host_network,
            "host_sys network: each interface's link speed and peak rate",
        ),
        WriterSpec(
            "cpu_usage",
            "csv",
            render_cpu_usage,
            "host_sys_usage cpu: each core's user/sys/iowait/irq/soft/idle share",
        ),
        WriterSpec(
            "process_cpu_usage",
            "csv",
            render_process_cpu,
            "host_sys_usage cpu: each process of the job's CPU, jobprof's sampling apart",
        ),
        WriterSpec(
            "sys_mem", "csv", render_sys_mem, "host_sys_usage mem: /proc/meminfo at the iteration's end"
        ),
        WriterSpec(
            "process_mem",
            "csv",
            render_process_mem,
            "host_sys_usage mem: each process of the job's size, resident and shared pages",
        ),
        WriterSpec(
            "os_runtime_statistic",
            "csv",
            osrt.render_os_runtime_statistic,
            "host_sys osrt: system calls per process, thread and name (perf)",
        ),
    ]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    from jobprof.plugins.host_sys import osrt
    from jobprof.plugins.host_sys.writer import add_to_master

    add_to_master(ctx, timeline)
    osrt.add_to_master(ctx, timeline)


@hookimpl
def jobprof_iteration_facts(iteration: Iteration, streams: Streams) -> JSON:
    from jobprof.plugins.host_sys.report import iteration_digest

    return iteration_digest(iteration, streams)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    from jobprof.plugins.host_sys.report import rank_facts

    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    from jobprof.plugins.host_sys.report import sections

    return sections(profile)
