"""host_sys's own records, read only by host_sys: the ``host_samples`` and ``host_facts``
streams decoded here, once, and read by their field names everywhere else.

The raw shapes stay as written (:meth:`HostSampler.take`, the plugin's session start): a sample
is a dict (``ns``, ``own_ns``, ``procs``: one dict per process, the fields of
:class:`~jobprof.plugins.host_sys.sampler.ProcSample`; ``before`` on the sample before the
iteration; ``cores``: ``{core: {"busy", "total"}}``; ``cpu_detail``: ``{core: {tick kind: n}}``
on the first and last samples; ``mem``: ``/proc/meminfo`` by its names; ``net``: ``{interface:
{"recv", "sent"}}``), the host's facts one dict per iteration.  A field a raw record lacks
reads as not read (-1, None).  ``NamedTuple``: a few hundred samples per iteration at 50 Hz,
each read by several writers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from jobprof.plugins.host_sys.sampler import CoreTicks, ProcSample

__all__ = ["CoreLoad", "CoreTicks", "HostFacts", "HostSample", "NetCount", "ProcSample", "host_facts",
           "host_samples"]


class CoreLoad(NamedTuple):
    """A core's (or ``Avg``: all cores') busy and total ticks so far (/proc/stat)."""

    busy: int
    total: int


class NetCount(NamedTuple):
    """An interface's bytes received and sent so far (/proc/net/dev)."""

    recv: int
    sent: int


class HostSample(NamedTuple):
    """One sample of the ``host_samples`` stream (monotonic ns); a reading the sample did not
    take is None (``cores``, ``cpu_detail``, ``mem``, ``net``)."""

    ns: int
    #: the sampler's own CPU so far (ns: jobprof's, shown apart from the rank's)
    own_ns: int
    #: the job's processes, the rank's first
    procs: tuple[ProcSample, ...]
    #: the last sample before the iteration (the base of its deltas)
    before: bool = False
    cores: dict[str, CoreLoad] | None = None
    cpu_detail: dict[str, CoreTicks] | None = None
    #: /proc/meminfo's fields the sampler keeps, by their names (kB; HugePages_* in pages)
    mem: dict[str, int] | None = None
    net: dict[str, NetCount] | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> HostSample | None:
        """The sample of a raw one, or None when it is not one (no time, no process list)."""
        if not isinstance(raw, dict):
            return None
        get = raw.get
        ns, procs = get("ns"), get("procs")
        if not isinstance(ns, int) or not isinstance(procs, list):
            return None
        cores, detail, net = get("cores"), get("cpu_detail"), get("net")
        if cores:
            cores = {name: CoreLoad(c.get("busy", 0), c.get("total", 0)) for name, c in cores.items()}
        if detail:
            detail = {name: _ticks(t) for name, t in detail.items()}
        if net is not None:
            net = {name: NetCount(n.get("recv", 0), n.get("sent", 0)) for name, n in net.items()}
        return cls(ns, get("own_ns", 0), tuple(map(_proc, procs)), bool(get("before")), cores or None,
                   detail or None, get("mem"), net)


def _proc(raw: Mapping[str, Any]) -> ProcSample:
    if tuple(raw) == _PROC:  # the sampler's own dict (ProcSample._asdict()): in field order
        return _make_proc(raw.values())
    get = raw.get  # a field missing (not read), or another layout: what is there
    return ProcSample(get("pid", -1), get("name", "?"), get("label", ""), get("cpu_ns", -1), get("vms", -1),
                      get("rss", -1), get("shared", -1), get("rchar", -1), get("wchar", -1),
                      get("read_bytes", -1), get("write_bytes", -1))


_PROC = ProcSample._fields
_make_proc = ProcSample._make


def _ticks(raw: Mapping[str, Any]) -> CoreTicks:
    if tuple(raw) == _TICKS:  # the sampler's own dict (CoreTicks._asdict()): in field order
        return _make_ticks(raw.values())
    return CoreTicks(*(raw.get(k, 0) for k in _TICKS))


_TICKS = CoreTicks._fields
_make_ticks = CoreTicks._make


def host_samples(items: Iterable[Any]) -> list[HostSample]:
    """The samples of a raw ``host_samples`` stream, oldest first (others left out)."""
    out = [s for s in map(HostSample.from_raw, items) if s is not None]
    out.sort(key=_time)
    return out


def _time(sample: HostSample) -> int:
    return sample.ns


class HostFacts(NamedTuple):
    """What the host is and what was asked of it (``host_facts``: one record per iteration,
    written at the session's start); None where a record does not say."""

    #: the ``host_sys`` / ``host_sys_usage`` options' kinds that are sampled
    host_sys: tuple[str, ...] = ()
    host_sys_usage: tuple[str, ...] = ()
    freq: int | None = None
    cpus: int | None = None
    mem_total_kb: int | None = None
    #: bytes per page of the RSS / statm figures
    page: int | None = None
    #: ns per clock tick of a child's CPU time
    tick_ns: int | None = None
    #: each interface's link speed (Mbit/s)
    speed_mbps: Mapping[str, int] | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> HostFacts | None:
        if not isinstance(raw, dict):
            return None
        get = raw.get
        return cls(tuple(get("host_sys") or ()), tuple(get("host_sys_usage") or ()), get("freq"), get("cpus"),
                   get("mem_total_kb"), get("page"), get("tick_ns"), get("speed_mbps"))


def host_facts(items: Iterable[Any]) -> HostFacts:
    """The host's facts of a raw ``host_facts`` stream (its first record that is one); all
    unknown without one."""
    for raw in items:
        facts = HostFacts.from_raw(raw)
        if facts is not None:
            return facts
    return HostFacts()
