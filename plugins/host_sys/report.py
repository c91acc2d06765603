"""host_sys's part of ``jobprof summary`` / ``report``: the host's CPU, memory, disk and network per
iteration, and findings.

Map/reduce as task_memory's: :func:`iteration_digest` (``jobprof_iteration_facts``) reduces one
iteration's samples to a few numbers, :func:`rank_facts` a device's digests to its series
(binned to at most :data:`SERIES` rows) and totals, :func:`sections` reads them back.

Findings (each once per rank, with the iterations it concerns):

* ``host_cpu_saturated``: every core of the host was busy (``CPU Avg`` at least
  :data:`SATURATED_PCT`) while the loop waited for data (the dp plugin's waits, when it ran and
  they take at least :data:`WAIT_SHARE` of the iteration), else over the whole iteration;
* ``host_disk_read_in_wait``: the job's processes read from storage while the loop waited for data;
* ``host_memory_near_limit``: the host's memory was more than :data:`MEM_USED_PCT` used or less
  than :data:`MEM_AVAILABLE_PCT` available (``MemAvailable``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import NA, BatchRecord, Finding, Section, records_of
from jobprof.plugins.host_sys.writer import coarse, host, job_total, proc_deltas, samples, span

if TYPE_CHECKING:
    from jobprof.plugin import Iteration, Profile

MIB = 1 << 20
SERIES = 300
SHOWN = 30
SATURATED_PCT = 90.0
WAIT_SHARE = 0.10
#: iterations (a share of those judged) that must show a condition for its finding
FINDING_SHARE = 0.2
DISK_WAIT_MIN_BYTES = 1 * MIB
MEM_USED_PCT = 90.0
MEM_AVAILABLE_PCT = 5.0


def _overlap(a: int, b: int, spans: list[tuple[int, int]]) -> int:
    return sum(max(0, min(b, e) - max(a, s)) for s, e in spans)


def iteration_digest(iteration: Iteration, streams: Mapping[str, list[Any]]) -> dict[str, Any] | None:
    """One iteration in a few numbers: ``wall_ns`` (between its first and last sample),
    ``occupied`` (cores the job's processes kept busy), ``busy_pct`` (the host's CPU),
    ``rss_kb`` (the job's peak resident memory), ``mem_used_pct`` / ``mem_available_pct`` (the
    host's, worst sample), ``read_bytes`` / ``rchar`` / ``write_bytes`` / ``wchar`` (the job's),
    ``net_bytes`` (each interface, received + sent), and with the dp plugin's waits ``wait_ns``,
    ``wait_busy_pct`` and ``wait_read_bytes`` (the samples' intervals, weighted by how much of
    each the loop spent waiting)."""
    taken = samples(streams)
    wall = span(taken)
    if wall <= 0:
        return None
    facts = host(streams)
    out: dict[str, Any] = {"wall_ns": wall, "cpus": facts.cpus}
    cpu = proc_deltas(taken, "cpu_ns")
    if cpu:  # the rank's mean is the sum over its iterations (children's ticks add up exactly)
        out["cpu_ns"] = sum(cpu.values())
    if cpu and not coarse(taken, facts):  # children's ticks over a few ticks: not a figure
        out["occupied"] = round(sum(cpu.values()) / wall, 4)
    # the hand-over's sample reads no cores: the first and last readings of them
    readings = [s.cores for s in taken if s.cores]
    first, last = (readings[0].get("Avg"), readings[-1].get("Avg")) if readings else (None, None)
    if first is not None and last is not None and last.total > first.total:
        out["busy_pct"] = round(100 * (last.busy - first.busy) / (last.total - first.total), 2)
    page = facts.page or 4096
    inside = [s for s in taken if not s.before]
    rss = [r for r in map(job_total("rss"), inside) if r is not None]
    if rss:
        out["rss_kb"] = max(rss) * page // 1024
    mems = [s.mem for s in inside if s.mem and s.mem.get("MemTotal") and "MemAvailable" in s.mem]
    if mems:
        out["mem_used_pct"] = round(
            max(100 * (m["MemTotal"] - m["MemAvailable"]) / m["MemTotal"] for m in mems), 2
        )
        out["mem_available_pct"] = round(min(100 * m["MemAvailable"] / m["MemTotal"] for m in mems), 2)
    for field in ("read_bytes", "rchar", "write_bytes", "wchar"):
        grown = proc_deltas(taken, field)
        if grown:
            out[field] = sum(grown.values())
    nets = [s.net for s in taken if s.net]
    if len(nets) >= 2:
        out["net_bytes"] = {
            name: (nets[-1][name].recv + nets[-1][name].sent) - (nets[0][name].recv + nets[0][name].sent)
            for name in nets[-1]
            if name in nets[0]
        }
    waits = [(r.start_ns, r.end_ns) for r in records_of(streams, BatchRecord)]
    if waits:
        out["wait_ns"] = _overlap(iteration.start_ns, iteration.end_ns, waits)
        busy = total = 0.0
        read = 0.0
        # the host's cores between consecutive readings of them (the hand-over reads none)
        averages = [(s.ns, s.cores.get("Avg")) for s in taken if s.cores]
        for (a_ns, ca), (b_ns, cb) in itertools.pairwise(averages):
            if b_ns <= a_ns:
                continue
            share = _overlap(a_ns, b_ns, waits) / (b_ns - a_ns)
            if share > 0 and ca and cb:
                busy += share * (cb.busy - ca.busy)
                total += share * (cb.total - ca.total)
        for a, b in itertools.pairwise(taken):
            if b.ns <= a.ns:
                continue
            share = _overlap(a.ns, b.ns, waits) / (b.ns - a.ns)
            if share <= 0:
                continue
            x, y = job_total("read_bytes")(a), job_total("read_bytes")(b)
            if x is not None and y is not None:
                read += share * max(0, y - x)
        if total > 0:
            out["wait_busy_pct"] = round(100 * busy / total, 2)
        if "read_bytes" in out:
            out["wait_read_bytes"] = round(read)
    return out


def _on(profile: Profile, device: int) -> bool:
    options = profile.options(device)
    return bool(options.get("host_sys") or options.get("host_sys_usage"))


def rank_facts(profile: Profile, device: int) -> dict[str, Any] | None:
    if not _on(profile, device):
        return None
    series: list[dict[str, Any]] = []
    for index, d in profile.iteration_facts("host_sys", device, iteration_digest):
        if isinstance(d, dict):
            series.append({"iteration": index, **d})
    if not series:
        return None
    totals: dict[str, Any] = {}
    for field in ("read_bytes", "rchar", "write_bytes", "wchar"):
        values = [r[field] for r in series if field in r]
        if values:
            totals[field] = sum(values)
    nets: dict[str, int] = {}
    for r in series:
        for name, value in (r.get("net_bytes") or {}).items():
            nets[name] = nets.get(name, 0) + value
    return {
        "iterations": len(series),
        "series": _binned(series, SERIES),
        "cpus": next((r["cpus"] for r in series if r.get("cpus")), None),
        # CPU seconds per wall second over every iteration (not a mean of per-iteration figures:
        # those of iterations shorter than a few clock ticks are N/A)
        "occupied_mean": (
            round(sum(r["cpu_ns"] for r in series if "cpu_ns" in r)
                  / sum(r["wall_ns"] for r in series if "cpu_ns" in r), 4)
            if any("cpu_ns" in r for r in series) else None
        ),
        "busy_mean": _mean(r.get("busy_pct") for r in series),
        "rss_peak_kb": max((r["rss_kb"] for r in series if "rss_kb" in r), default=None),
        "mem_used_peak": max((r["mem_used_pct"] for r in series if "mem_used_pct" in r), default=None),
        "mem_available_min": min(
            (r["mem_available_pct"] for r in series if "mem_available_pct" in r), default=None
        ),
        "totals": totals,
        "net_bytes": nets,
        "saturated": _saturated(series),
        "disk_in_wait": _disk_in_wait(series),
    }


def _mean(values: Any) -> float | None:
    kept = [v for v in values if isinstance(v, int | float)]
    return round(sum(kept) / len(kept), 3) if kept else None


def _saturated(series: list[dict[str, Any]]) -> dict[str, Any] | None:
    waited = [r for r in series if r.get("wait_ns", 0) >= WAIT_SHARE * r["wall_ns"] and "wait_busy_pct" in r]
    if waited:
        judged, key, where = waited, "wait_busy_pct", "data_wait"
    else:
        judged, key, where = [r for r in series if "busy_pct" in r], "busy_pct", "iteration"
    hit = [r for r in judged if r[key] >= SATURATED_PCT]
    if not hit or len(hit) < FINDING_SHARE * len(judged):
        return None
    return {
        "where": where,
        "iterations": [r["iteration"] for r in hit][:20],
        "count": len(hit),
        "judged": len(judged),
        "busy_pct": round(sum(r[key] for r in hit) / len(hit), 2),
        "cpus": hit[0].get("cpus"),
    }


def _disk_in_wait(series: list[dict[str, Any]]) -> dict[str, Any] | None:
    waited = [r for r in series if r.get("wait_ns", 0) > 0 and "wait_read_bytes" in r]
    hit = [r for r in waited if r["wait_read_bytes"] >= DISK_WAIT_MIN_BYTES]
    if not hit or len(hit) < FINDING_SHARE * len(waited):
        return None
    return {
        "iterations": [r["iteration"] for r in hit][:20],
        "count": len(hit),
        "judged": len(waited),
        "bytes": sum(r["wait_read_bytes"] for r in hit),
    }


def _binned(series: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most ``limit`` rows: of each run of consecutive iterations, the busiest (occupied cores)."""
    if len(series) <= limit:
        return series
    size = -(-len(series) // limit)
    return [
        max(series[i : i + size], key=lambda r: (r.get("occupied") or 0, r.get("rss_kb") or 0))
        for i in range(0, len(series), size)
    ]


def _mib(value: float | None) -> Any:
    return NA if value is None else round(value / MIB, 3)


def _num(value: Any) -> Any:
    return NA if value is None else value


def sections(profile: Profile) -> list[Section]:
    summary: list[list[Any]] = []
    findings: list[Finding] = []
    chosen: tuple[int, dict[str, Any]] | None = None
    many = len(profile.devices) > 1
    for device in profile.devices:
        facts = profile.facts("host_sys", device, rank_facts)
        if not facts:
            continue
        rank = profile.rank(device)
        totals = facts.get("totals") or {}
        nets = facts.get("net_bytes") or {}
        summary.append(
            [
                device,
                _num(facts.get("cpus")),
                _num(facts.get("occupied_mean")),
                _num(facts.get("busy_mean")),
                _mib(facts["rss_peak_kb"] * 1024) if facts.get("rss_peak_kb") is not None else NA,
                _num(facts.get("mem_used_peak")),
                _mib(totals.get("read_bytes")),
                _mib(totals.get("rchar")),
                _mib(totals.get("write_bytes")),
                _mib(sum(nets.values())) if nets else NA,
            ]
        )
        if chosen is None:
            chosen = (rank, facts)
        findings += _findings(f"rank {rank}: " if many else "", rank, facts)
    if not summary:
        return []
    out = [
        Section(
            "Host: CPU, memory, disk, network per rank",
            [
                "device",
                "cores",
                "occupied cores (mean)",
                "host CPU busy % (mean)",
                "job peak RSS (MiB)",
                "host memory peak used %",
                "storage read (MiB)",
                "read calls (MiB)",
                "storage write (MiB)",
                "network (MiB)",
            ],
            summary,
            [
                "occupied cores: the CPU seconds of the job's processes (the rank's, its DataLoader workers "
                "and other children, jobprof's sampling included) per wall second; host CPU busy: every "
                "core's non-idle share (/proc/stat); storage read/write: /proc/<pid>/io read_bytes / "
                "write_bytes; read calls: rchar (everything read through read system calls, page cache "
                "included); network: every interface's bytes received and sent, the host's "
                "(not only the job's)"
            ],
            key="host_sys",
            findings=findings,
        )
    ]
    if chosen is None:
        return out
    rank, facts = chosen
    shown = _binned(facts["series"], SHOWN)
    suffix = f", rank {rank}" if many else ""
    note = (
        [f"{facts['iterations']} iterations in {len(shown)} rows: each row is the busiest iteration of a run"]
        if facts["iterations"] > len(shown)
        else []
    )
    if any("occupied" in r or "busy_pct" in r for r in shown):
        out.append(
            Section(
                f"Host CPU per iteration{suffix}",
                ["iteration", "occupied cores", "host busy %", "host busy % in data wait"],
                [
                    [
                        r["iteration"],
                        _num(r.get("occupied")),
                        _num(r.get("busy_pct")),
                        _num(r.get("wait_busy_pct")),
                    ]
                    for r in shown
                ],
                note,
                key="host_cpu_iterations",
                chart=("occupied_cores", "host_busy_pct"),
            )
        )
    if any("rss_kb" in r or "mem_used_pct" in r for r in shown):
        out.append(
            Section(
                f"Host memory per iteration{suffix}",
                ["iteration", "job peak RSS (MiB)", "host used %", "host available %"],
                [
                    [
                        r["iteration"],
                        _mib(r["rss_kb"] * 1024) if "rss_kb" in r else NA,
                        _num(r.get("mem_used_pct")),
                        _num(r.get("mem_available_pct")),
                    ]
                    for r in shown
                ],
                note,
                key="host_memory_iterations",
                chart=("job_peak_rss_mib",),
            )
        )
    if any("rchar" in r for r in shown):
        out.append(
            Section(
                f"Host disk per iteration (MiB){suffix}",
                [
                    "iteration",
                    "storage read",
                    "read calls",
                    "storage write",
                    "write calls",
                    "storage read in data wait",
                ],
                [
                    [
                        r["iteration"],
                        _mib(r.get("read_bytes")),
                        _mib(r.get("rchar")),
                        _mib(r.get("write_bytes")),
                        _mib(r.get("wchar")),
                        _mib(r.get("wait_read_bytes")),
                    ]
                    for r in shown
                ],
                note,
                key="host_disk_iterations",
                chart=("storage_read", "read_calls", "storage_write"),
            )
        )
    names = sorted({n for r in shown for n in r.get("net_bytes") or {}})
    if names:
        out.append(
            Section(
                f"Host network per iteration (MiB received + sent){suffix}",
                ["iteration", *names],
                [[r["iteration"], *[_mib((r.get("net_bytes") or {}).get(n)) for n in names]] for r in shown],
                note,
                key="host_network_iterations",
                columns=["iteration", *[f"net_{i}" for i in range(len(names))]],
                chart=tuple(f"net_{i}" for i in range(len(names))),
            )
        )
    return out


def _findings(who: str, rank: int, facts: dict[str, Any]) -> list[Finding]:
    out = []
    sat = facts.get("saturated")
    if sat:
        while_ = "while the loop waited for data" if sat["where"] == "data_wait" else "over the iteration"
        out.append(
            Finding(
                "host_cpu_saturated",
                f"{who}the host's CPU was saturated {while_}: {sat['busy_pct']:.0f}% of all "
                f"{sat['cpus']} cores busy in {sat['count']} of {sat['judged']} iterations (e.g. "
                f"iteration {sat['iterations'][0]}); more DataLoader workers cannot help, the input "
                "pipeline needs fewer CPU cycles or more cores",
                {"rank": rank, **sat},
                weight=2,
            )
        )
    disk = facts.get("disk_in_wait")
    if disk:
        out.append(
            Finding(
                "host_disk_read_in_wait",
                f"{who}the job read {disk['bytes'] / MIB:.1f} MiB from storage while the loop waited "
                "for data "
                f"({disk['count']} of {disk['judged']} iterations with a wait, e.g. iteration "
                f"{disk['iterations'][0]}): the data is not in the page cache; faster storage, a local copy "
                "or prefetching shortens the wait",
                {"rank": rank, **disk},
                weight=2,
            )
        )
    used, available = facts.get("mem_used_peak"), facts.get("mem_available_min")
    if (used is not None and used > MEM_USED_PCT) or (
        available is not None and available < MEM_AVAILABLE_PCT
    ):
        out.append(
            Finding(
                "host_memory_near_limit",
                f"{who}the host's memory was near its limit: {used}% used at the peak, "
                f"{available}% available at the lowest; the job risks the kernel's OOM killer or swapping",
                {"rank": rank, "used_pct": used, "available_pct": available},
                weight=3,
            )
        )
    return out
