"""host_sys's files (msprof's names and columns) and the master timeline's usage layers.

Every value is a delta of cumulative counters between two samples of the iteration's stream
(:mod:`jobprof.plugins.host_sys.sampler`), the first one the last sample before the iteration.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, ExportContext, WorkerFetchRecord, records_of
from jobprof.plugins.host_sys import HOST, SAMPLES  # the streams' names
from jobprof.plugins.host_sys.records import (
    CoreLoad,
    CoreTicks,
    HostFacts,
    HostSample,
    host_facts,
    host_samples,
)
from jobprof.plugins.host_sys.sampler import MEMINFO

if TYPE_CHECKING:
    from jobprof.plugin import Timeline

#: jobprof's own sampling, shown beside the rank's process
SAMPLER = "jobprof (sampler)"

CPU_HEADER = ["Device_id", "Total Cpu Numbers", "Occupied Cpu Numbers", "Recommend Cpu Numbers"]
MEM_HEADER = ["Device_id", "Total Memory(KB)", "Peak Used Memory(KB)", "Recommend Memory(KB)"]
DISK_HEADER = [
    "Device_id",
    "Peak Disk Read(KB/s)",
    "Recommend Disk Read(KB/s)",
    "Peak Disk Write(KB/s)",
    "Recommend Disk Write(KB/s)",
]
NETWORK_HEADER = [
    "Device_id",
    "Netcard Speed(KB/s)",
    "Peak Used Speed(KB/s)",
    "Recommend Speed(KB/s)",
    "Netcard",
]
CPU_USAGE_HEADER = ["Device_id", "Cpu Type", "User(%)", "Sys(%)", "IoWait(%)", "Irq(%)", "Soft(%)", "Idle(%)"]
PROCESS_CPU_HEADER = ["Device_id", "PID", "Name", "CPU(%)"]
SYS_MEM_HEADER = [
    "Device_id",
    "Memory Total(kB)",
    "Memory Free(kB)",
    "Buffers(kB)",
    "Cached(kB)",
    "Share Memory(kB)",
    "Commit Limit(kB)",
    "Committed AS(kB)",
    "Huge Pages Total(pages)",
    "Huge Pages Free(pages)",
]
#: sys_mem's columns from /proc/meminfo: what the sampler reads, less MemAvailable (the
#: Memory Usage layer's)
SYS_MEM_KEYS = tuple(k for k in MEMINFO if k != "MemAvailable")
PROCESS_MEM_HEADER = ["Device_id", "PID", "Name", "Size(pages)", "Resident(pages)", "Shared(pages)"]


# -- reading the stream ----------------------------------------------------------------------------


#: the last raw samples and host facts decoded, with what they decoded to: every writer of an
#: iteration and its facts read the same raw lists, decoded once (the raw list is held, so its
#: identity is not reused)
_last_samples: tuple[object, list[HostSample]] = ((), [])
_last_host: tuple[object, HostFacts] = ((), HostFacts())


def samples(streams: Mapping[str, list[Any]]) -> list[HostSample]:
    """The iteration's samples, oldest first, the one before it included (``before``)."""
    global _last_samples
    raw, (last, decoded) = streams.get(SAMPLES, ()), _last_samples
    if raw is not last:
        decoded = host_samples(raw)
        _last_samples = (raw, decoded)
    return list(decoded)


def host(streams: Mapping[str, list[Any]]) -> HostFacts:
    """The host's facts (the iteration's ``host_facts`` record)."""
    global _last_host
    raw, (last, facts) = streams.get(HOST, ()), _last_host
    if raw is not last:
        facts = host_facts(raw)
        _last_host = (raw, facts)
    return facts


def during(taken: list[HostSample]) -> list[HostSample]:
    return [s for s in taken if not s.before]


def labels(streams: Mapping[str, list[Any]], taken: list[HostSample]) -> dict[int, str]:
    """pid -> the name a process is shown by: ``DataLoader worker N`` (N from the dp plugin's
    records when it ran, else the sampler's numbering of torch's ``pt_data_worker``
    processes), else ``<process name> (<pid>)``."""
    out: dict[int, str] = {}
    for s in taken:
        for p in s.procs:
            out[p.pid] = p.label or f"{p.name} ({p.pid})"
    fetches = records_of(streams, WorkerFetchRecord)
    several = len({f.loader for f in fetches}) > 1
    for f in fetches:
        if f.pid is not None and f.pid in out:
            out[f.pid] = (
                f"DataLoader {f.loader} worker {f.worker}" if several else f"DataLoader worker {f.worker}"
            )
    return out


def span(taken: list[HostSample]) -> int:
    """Wall ns from the first sample (the one before the iteration) to the last."""
    return taken[-1].ns - taken[0].ns if len(taken) >= 2 else 0


def proc_deltas(taken: list[HostSample], field: str) -> dict[int, int]:
    """pid -> how much ``field`` (a cumulative counter of :class:`ProcSample`) grew from the
    process's first sample in ``taken`` to its last (a process seen once: 0)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s in taken:
        for p in s.procs:
            value = getattr(p, field)
            if isinstance(value, int) and value >= 0:
                first.setdefault(p.pid, value)
                last[p.pid] = value
    return {pid: max(0, last[pid] - first[pid]) for pid in last}


#: a child's CPU is read in clock ticks (/proc/<pid>/stat: 10 ms each): over a window shorter
#: than this many ticks one tick more or less is a 10% error or worse
MIN_TICKS = 10


def coarse(taken: list[HostSample], facts: HostFacts) -> bool:
    """The window is too short for the children's tick-counted CPU (the rank's own is in ns)."""
    tick = facts.tick_ns or 10_000_000
    children = any(len(s.procs) > 1 for s in taken)
    return children and span(taken) < MIN_TICKS * tick


def own_delta(taken: list[HostSample]) -> int:
    return max(0, taken[-1].own_ns - taken[0].own_ns) if len(taken) >= 2 else 0


def rank_pid(taken: list[HostSample]) -> int | None:
    return taken[-1].procs[0].pid if taken and taken[-1].procs else None


def cpu_shares(taken: list[HostSample]) -> list[tuple[int, str, float]]:
    """(pid, name, CPU %) of each job process over the iteration (100: one core), the rank's
    without jobprof's sampling, which is its own row (``jobprof (sampler)``)."""
    wall = span(taken)
    if wall <= 0:
        return []
    names = {p.pid: p.name for s in taken for p in s.procs}
    cpu = proc_deltas(taken, "cpu_ns")
    me, own = rank_pid(taken), own_delta(taken)
    out = []
    for pid, used in cpu.items():
        if pid == me:
            used = max(0, used - own)
        out.append((pid, names[pid], 100 * used / wall))
    if me is not None and me in cpu:
        out.append((me, SAMPLER, 100 * own / wall))
    return out


def _f(value: float) -> str:
    return f"{value:.2f}"


def _kb_s(delta: int, ns: int) -> float:
    return delta / 1024 / (ns / 1e9) if ns > 0 else 0.0


def peak_rate(taken: list[HostSample], total: Any) -> float:
    """The highest rate (KB/s) between consecutive samples of a cumulative total ``total(s)``."""
    best = 0.0
    for a, b in itertools.pairwise(taken):
        x, y = total(a), total(b)
        if x is not None and y is not None and b.ns > a.ns:
            best = max(best, _kb_s(y - x, b.ns - a.ns))
    return best


def job_total(field: str) -> Any:
    """A sample's total of ``field`` (of :class:`ProcSample`) over the job's processes (None:
    not read)."""

    def total(s: HostSample) -> int | None:
        values = [getattr(p, field) for p in s.procs]
        values = [v for v in values if isinstance(v, int) and v >= 0]
        return sum(values) if values else None

    return total


def job_rate_peak(taken: list[HostSample], field: str) -> float:
    """The job's peak rate of ``field`` (KB/s), each interval summing the processes present at
    both of its ends (a process that starts or ends is not a jump)."""
    best = 0.0
    for a, b in itertools.pairwise(taken):
        before = {p.pid: getattr(p, field) for p in a.procs}
        grown = 0
        for p in b.procs:
            x, y = before.get(p.pid, -1), getattr(p, field)
            if x >= 0 and y >= 0:
                grown += max(0, y - x)
        if b.ns > a.ns:
            best = max(best, _kb_s(grown, b.ns - a.ns))
    return best


# -- files -----------------------------------------------------------------------------------------


def _enough(ctx: ExportContext, net: bool = False) -> list[HostSample] | None:
    """The iteration's samples when there are two or more (and, with ``net``, one read the
    interfaces)."""
    taken = samples(ctx.streams)
    if len(taken) < 2 or (net and not any(s.net is not None for s in taken)):
        return None
    return taken


def render_host_cpu(ctx: ExportContext) -> str | None:
    taken = _enough(ctx)
    facts = host(ctx.streams)
    if taken is None or "cpu" not in facts.host_sys:
        return None
    wall = span(taken)
    used = sum(proc_deltas(taken, "cpu_ns").values())
    occupied = _f(used / wall) if wall > 0 and not coarse(taken, facts) else NA
    cpus = facts.cpus or NA
    return ctx.csv(CPU_HEADER, [[ctx.device_id, cpus, occupied, NA]])


def render_host_mem(ctx: ExportContext) -> str | None:
    taken = _enough(ctx)
    facts = host(ctx.streams)
    if taken is None or "mem" not in facts.host_sys:
        return None
    page = facts.page or 4096
    rss = [job_total("rss")(s) for s in during(taken)]
    peak = max((r for r in rss if r is not None), default=None)
    total = facts.mem_total_kb or NA
    return ctx.csv(MEM_HEADER, [[ctx.device_id, total, NA if peak is None else peak * page // 1024, NA]])


def render_host_disk(ctx: ExportContext) -> str | None:
    taken = _enough(ctx)
    if taken is None or "disk" not in host(ctx.streams).host_sys:
        return None
    read = job_rate_peak(taken, "read_bytes")
    write = job_rate_peak(taken, "write_bytes")
    return ctx.csv(DISK_HEADER, [[ctx.device_id, _f(read), NA, _f(write), NA]])


def render_host_network(ctx: ExportContext) -> str | None:
    taken = _enough(ctx, net=True)
    facts = host(ctx.streams)
    if taken is None or "network" not in facts.host_sys:
        return None
    speeds = facts.speed_mbps or {}
    names = sorted({n for s in taken for n in s.net or {}})
    rows = []
    for name in names:

        def both(s: HostSample, name: str = name) -> int | None:
            nic = (s.net or {}).get(name)
            return nic.recv + nic.sent if nic else None

        speed = speeds.get(name) or 0
        rows.append(
            [
                ctx.device_id,
                _f(speed * 1e6 / 8 / 1024) if speed > 0 else NA,
                _f(peak_rate(taken, both)),
                NA,
                name,
            ]
        )
    return ctx.csv(NETWORK_HEADER, rows)


def _core_order(name: str) -> tuple[int, int]:
    return (1, 0) if name == "Avg" else (0, int(name) if name.isdigit() else 0)


def render_cpu_usage(ctx: ExportContext) -> str | None:
    every = samples(ctx.streams)
    details = [s.cpu_detail for s in every if s.cpu_detail]
    if len(details) < 2:
        # an iteration shorter than the sampling period: the cores are read by the thread only
        # (not at the hand-over), so none was read during it: N/A, not a missing file
        if "cpu" not in host(ctx.streams).host_sys_usage or len(every) < 2 or not details:
            return None
        cores = sorted(details[0], key=_core_order)
        return ctx.csv(CPU_USAGE_HEADER, [[ctx.device_id, name, *[NA] * 6] for name in cores])
    a, b = details[0], details[-1]
    rows = []
    for name in sorted(set(a) & set(b), key=_core_order):
        d = CoreTicks(*(y - x for x, y in zip(a[name], b[name], strict=True)))  # each kind's ticks
        total = sum(d)
        if total <= 0:
            rows.append([ctx.device_id, name, *[NA] * 6])
            continue

        def pct(ticks: int, total: int = total) -> float:
            return 100 * ticks / total

        rows.append(
            [
                ctx.device_id,
                name,
                _f(pct(d.user) + pct(d.nice)),
                _f(pct(d.system)),
                _f(pct(d.iowait)),
                _f(pct(d.irq)),
                _f(pct(d.softirq)),
                _f(pct(d.idle)),
            ]
        )
    return ctx.csv(CPU_USAGE_HEADER, rows)


def render_process_cpu(ctx: ExportContext) -> str | None:
    taken = samples(ctx.streams)
    facts = host(ctx.streams)
    if len(taken) < 2 or "cpu" not in facts.host_sys_usage:
        return None
    shown = labels(ctx.streams, taken)
    rows = []
    short = coarse(taken, facts)
    me = rank_pid(taken)
    for pid, name, pct in cpu_shares(taken):
        label = name if name == SAMPLER else shown.get(pid, name)
        # a child's CPU in a window of a few clock ticks: N/A, not a multiple of 10 ms / window
        rows.append([ctx.device_id, pid, label, NA if short and pid != me else _f(pct)])
    return ctx.csv(PROCESS_CPU_HEADER, rows)


def render_sys_mem(ctx: ExportContext) -> str | None:
    # the last reading at or before the iteration's end (the thread reads /proc/meminfo; in an
    # iteration shorter than its period that is the one before the iteration)
    readings = [s.mem for s in samples(ctx.streams) if s.mem]
    if not readings or "mem" not in host(ctx.streams).host_sys_usage:
        return None
    mem = readings[-1]
    return ctx.csv(SYS_MEM_HEADER, [[ctx.device_id, *[mem.get(k, NA) for k in SYS_MEM_KEYS]]])


def render_process_mem(ctx: ExportContext) -> str | None:
    taken = during(samples(ctx.streams))
    if not taken or "mem" not in host(ctx.streams).host_sys_usage:
        return None
    shown = labels(ctx.streams, taken)
    rows = [
        [ctx.device_id, p.pid, shown.get(p.pid, p.name), p.vms, p.rss, p.shared]
        for p in taken[-1].procs
        if p.rss >= 0
    ]
    return ctx.csv(PROCESS_MEM_HEADER, rows)


# -- the master timeline ---------------------------------------------------------------------------

#: the Disk Usage layer's values: (its key, the ProcSample counter it is the rate of)
_DISK_RATES = (
    ("read(KB/s)", "read_bytes"),
    ("write(KB/s)", "write_bytes"),
    ("read_chars(KB/s)", "rchar"),
    ("write_chars(KB/s)", "wchar"),
)


def add_to_master(ctx: ExportContext, timeline: Timeline) -> None:
    """Counter tracks (``"ph": "C"``), one point per sample of the iteration, each the value
    over the interval since the sample before: ``CPU Usage`` (``CPU <n>``, ``CPU Avg``, each job
    process, ``jobprof (sampler)``), ``Memory Usage`` (the host's used %, each process's RSS),
    ``Disk Usage`` (each process's read/write KB/s), ``Network Usage`` (each interface)."""
    taken = samples(ctx.streams)
    if len(taken) < 2:
        return
    facts = host(ctx.streams)
    on = set(facts.host_sys) | set(facts.host_sys_usage)
    shown = labels(ctx.streams, taken)
    page = facts.page or 4096
    out: list[dict[str, Any]] = []
    pids: dict[str, int] = {}

    def point(layer: str, name: str, ts: float, args: dict[str, Any]) -> None:
        pid = pids.get(layer)
        if pid is None:
            pid = pids[layer] = timeline.process(layer, "Host")
        out.append({"name": name, "ph": "C", "pid": pid, "tid": 0, "ts": ts, "args": args})

    me = rank_pid(taken)
    previous_cores: dict[str, CoreLoad] | None = taken[0].cores if taken else None
    for a, b in itertools.pairwise(taken):
        ns = b.ns - a.ns
        if ns <= 0:
            continue
        ts = ctx.to_us(b.ns)
        before = {p.pid: p for p in a.procs}
        if "cpu" in on:
            # each core's usage since its previous reading (the hand-over's sample reads none)
            cb = b.cores or {}
            ca = (previous_cores or {}) if cb else {}
            if cb:
                previous_cores = cb
            for name in sorted(set(ca) & set(cb), key=_core_order):
                total = cb[name].total - ca[name].total
                if total > 0:
                    busy = 100 * (cb[name].busy - ca[name].busy) / total
                    point("CPU Usage", f"CPU {name}", ts, {"Usage(%)": round(busy, 2)})
            own = max(0, b.own_ns - a.own_ns)
            for p in b.procs:
                q = before.get(p.pid)
                if q is None or p.cpu_ns < 0 or q.cpu_ns < 0:
                    continue
                used = max(0, p.cpu_ns - q.cpu_ns) - (own if p.pid == me else 0)
                point("CPU Usage", shown[p.pid], ts, {"CPU(%)": round(100 * max(0, used) / ns, 2)})
            if me is not None:
                point("CPU Usage", SAMPLER, ts, {"CPU(%)": round(100 * own / ns, 2)})
        if "mem" in on:
            mem = b.mem or {}
            if mem.get("MemTotal") and "MemAvailable" in mem:
                used_pct = 100 * (mem["MemTotal"] - mem["MemAvailable"]) / mem["MemTotal"]
                point("Memory Usage", "Memory", ts, {"Used(%)": round(used_pct, 2)})
            for p in b.procs:
                if p.rss >= 0:
                    point("Memory Usage", shown[p.pid], ts, {"RSS(MB)": round(p.rss * page / 2**20, 3)})
        if "disk" in on:
            for p in b.procs:
                q = before.get(p.pid)
                if q is None or p.read_bytes < 0 or q.read_bytes < 0:
                    continue
                args = {key: round(_kb_s(max(0, getattr(p, field) - getattr(q, field)), ns), 3)
                        for key, field in _DISK_RATES}
                point("Disk Usage", shown[p.pid], ts, args)
        if "network" in on:
            na, nb = a.net or {}, b.net or {}
            for name in sorted(set(na) & set(nb)):
                point(
                    "Network Usage",
                    name,
                    ts,
                    {
                        "recv(KB/s)": round(_kb_s(max(0, nb[name].recv - na[name].recv), ns), 3),
                        "sent(KB/s)": round(_kb_s(max(0, nb[name].sent - na[name].sent), ns), 3),
                    },
                )
    if out:
        timeline.add(out)
