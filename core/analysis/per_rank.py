"""One ``PROF_`` folder per rank, as ``msprof --analyze`` leaves a cluster: what msprof-analyze's
``cluster`` and ``compare`` read (docs/msprof-tools.md).

msprof writes one ``PROF_`` per rank; jobprof writes one per job with a ``device_<id>`` folder
per rank.  msprof-analyze counts each ``PROF_`` as one rank, so :func:`split` writes, under a
new folder ``out``, for every rank::

    PROF_<n>_<stamp>_<letters>R<rank>/
      device_<id>/                      info.json, start_info, end_info, summary/, timeline/
                                        (copies; raw data stays in the job's folder)
      mindstudio_profiler_output/       the CANN 8 layout of that rank (jobprof.analysis.cann8)
      analyze/communication.json        per collective: Communication Time Info, Bandwidth Info
      analyze/communication_matrix.json per collective: the rank's own link (src = dst)

**Wait** (what msprof measures with its notify tasks) is derived here from every rank's start of
the same collective (same process group, same sequence number): a rank that starts first waits
until the last one starts, ``wait = min(dur, last start - own start)``; the rest of the
collective is transit.  On one host the ranks share a clock; across hosts the estimate carries
the hosts' clock offset (see ``jobprof summary``'s clock note).  A collective whose peers were
not all profiled has no wait (0, transit = its duration) and is counted in :attr:`Split.unpaired`.
The rank's timeline gets the split as two task events (``Notify_Wait``, then ``Transit``) on a
``Plane 0`` thread of its communication process, where ``msprof-analyze compare`` reads waits;
that process has CANN 7's name, ``HCCL`` (MindInsight reads no other; msprof-analyze reads both).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from jobprof.analysis import cann8
from jobprof.analysis.merge import RankSource, load_events, read_sources
from jobprof.files import fsio
from jobprof.files.profdir import iteration_files

#: the per-iteration collective timeline of the hccl plugin
HCCL = "hccl"
#: msprof's op names: ``hcom_<type>_`` (advisor and cluster read the type from the name)
HCOM_TYPES = {
    "all_reduce": "allReduce", "all_reduce_coalesced": "allReduce", "all_gather": "allGather",
    "all_gather_into_tensor": "allGather", "all_gather_coalesced": "allGather",
    "all_gather_into_tensor_coalesced": "allGather", "reduce_scatter": "reduceScatter",
    "reduce_scatter_tensor": "reduceScatter", "reduce_scatter_tensor_coalesced": "reduceScatter",
    "broadcast": "broadcast", "reduce": "reduce", "all_to_all": "alltoall", "all_to_all_single": "alltoall",
    "send": "send", "recv": "receive", "recv_any_source": "receive", "barrier": "barrier",
    "gather": "gather", "scatter": "scatter",
}
METADATA = ("info.json.{}", "start_info.{}", "end_info.{}", "sample.json")
PROF_RE = re.compile(r"^PROF_(\d{6})_(\d{17})_([A-Za-z]+)$")


@attrs.frozen
class Split:
    folders: tuple[Path, ...]
    collectives: int
    #: collectives without every peer's record (their wait is 0)
    unpaired: int


@attrs.frozen
class _Call:
    rank: int
    name: str
    group: str
    seq: int
    start_us: float  # on the job's time axis (epoch µs)
    dur_us: float
    size: int
    backend: str
    ranks: tuple[int, ...]  # () where the record has none ("N/A")
    group_rank: int  # the rank's place in its group


def _ranks(value: Any) -> tuple[int, ...]:
    return tuple(int(r) for r in value) if isinstance(value, list) else ()


def _calls(sources: Iterable[RankSource]) -> Iterator[_Call]:
    """Every collective of every rank, from the hccl plugin's per-iteration timelines."""
    for source in sources:
        base_us = source.time_base_ns / 1000
        for file in iteration_files(source.path, "timeline", HCCL):
            for event in load_events(file.path):
                args = event.get("args") or {}
                if event.get("ph") != "X" or "seq" not in args:
                    continue
                yield _Call(source.rank, str(event["name"]), str(args.get("group name") or args.get("group")),
                            int(args["seq"]), base_us + float(event["ts"]), float(event.get("dur", 0)),
                            int(args.get("size(Byte)") or 0), str(args.get("backend", "N/A")),
                            _ranks(args.get("group ranks")),
                            int(args["rank"]) if isinstance(args.get("rank"), int) else source.rank)


def _waits(calls: list[_Call]) -> tuple[dict[tuple[int, str, int], float], int]:
    """Each call's wait (µs) for the last rank of its group to start; and how many calls had
    no record from some peer."""
    starts: dict[tuple[str, int], dict[int, float]] = {}
    for call in calls:
        starts.setdefault((call.group, call.seq), {})[call.rank] = call.start_us
    waits, unpaired = {}, 0
    for call in calls:
        seen = starts[(call.group, call.seq)]
        if call.ranks and not set(call.ranks) <= set(seen):
            unpaired += 1
            waits[(call.rank, call.group, call.seq)] = 0.0
            continue
        last = max(seen.values())
        waits[(call.rank, call.group, call.seq)] = max(0.0, min(call.dur_us, last - call.start_us))
    return waits, unpaired


def op_key(call: _Call) -> str:
    """msprof's key of a collective: ``hcom_<type>__<seq>_0_1@<group>``."""
    kind = HCOM_TYPES.get(call.name, call.name.replace("_", ""))
    return f"hcom_{kind}__{call.seq}_0_1@{call.group}"


def _time_info(call: _Call, wait_us: float) -> dict[str, Any]:
    elapse, wait = call.dur_us / 1000, wait_us / 1000
    transit = max(0.0, elapse - wait)
    ratio = round(wait / (wait + transit), 4) if wait + transit else 0.0
    return {"Start Timestamp(us)": round(call.start_us, 3), "Elapse Time(ms)": round(elapse, 6),
            "Transit Time(ms)": round(transit, 6), "Wait Time(ms)": round(wait, 6),
            # the wait here is all synchronisation (peers not there yet); nothing idles after it
            "Synchronization Time(ms)": round(wait, 6), "Idle Time(ms)": 0.0,
            "Wait Time Ratio": ratio, "Synchronization Time Ratio": ratio}


def _bandwidth(call: _Call, wait_us: float) -> dict[str, Any]:
    transit_ms = max(0.0, call.dur_us - wait_us) / 1000
    size_mb = call.size / 1e6
    return {"Transit Size(MB)": round(size_mb, 6), "Transit Time(ms)": round(transit_ms, 6),
            "Bandwidth(GB/s)": round(size_mb / transit_ms, 6) if transit_ms else 0.0,
            "Large Packet Ratio": 0.0, "Size Distribution": {f"{size_mb:g}": [1, round(transit_ms, 6)]}}


def _prof_name(prof: Path, rank: int) -> str:
    named = PROF_RE.match(prof.name)
    number, stamp, letters = named.groups() if named else ("000001", "0" * 17, "JOBPROFXXXXXXXXX")
    return f"PROF_{number}_{stamp}_{letters[:12].upper()}R{rank:03d}"


def split(prof: Path, out: Path) -> Split:
    """Write the per-rank folders of ``prof`` into the new folder ``out`` (it must not exist)."""
    sources = read_sources(prof)
    if not sources:
        raise ValueError(f"{prof} has no device_<id> folders")
    calls = list(_calls(sources))
    waits, unpaired = _waits(calls)
    out.mkdir(mode=fsio.DIR_MODE)
    folders = []
    for source in sources:
        rank_prof = out / _prof_name(prof, source.rank)
        rank_prof.mkdir(mode=fsio.DIR_MODE)
        _copy_device(source.path, rank_prof / source.path.name)
        cann8.assemble(rank_prof)
        mine = [c for c in calls if c.rank == source.rank]
        _write_analyze(rank_prof, source.rank, mine, waits)
        _add_wait_tasks(rank_prof, mine, waits, source.time_base_ns / 1000)
        folders.append(rank_prof)
    return Split(tuple(folders), len(calls), unpaired)


def _copy_device(device_dir: Path, to: Path) -> None:
    """The rendered files and metadata of one device (never its raw data: large, and only
    ``jobprof export`` reads it)."""
    device = device_dir.name.split("_", 1)[1]
    to.mkdir(mode=fsio.DIR_MODE)
    for name in METADATA:
        path = device_dir / name.format(device)
        if path.is_file() and not path.is_symlink():
            shutil.copyfile(path, to / path.name)
    for folder in ("summary", "timeline"):
        (to / folder).mkdir(mode=fsio.DIR_MODE)
        for file in iteration_files(device_dir, folder):
            if not file.path.is_symlink():
                shutil.copyfile(file.path, to / folder / file.path.name)


def _write_analyze(rank_prof: Path, rank: int, calls: Iterable[_Call],
                   waits: dict[tuple[int, str, int], float]) -> None:
    communication: dict[str, Any] = {}
    matrix: dict[str, Any] = {}
    for call in calls:
        wait = waits[(rank, call.group, call.seq)]
        key = op_key(call)
        bandwidth = _bandwidth(call, wait)
        communication[key] = {"Communication Time Info": _time_info(call, wait),
                              "Communication Bandwidth Info": {call.backend.upper(): bandwidth}}
        # the rank's own link only: jobprof does not see which peer each byte went to
        local = call.ranks.index(rank) if rank in call.ranks else call.group_rank
        matrix[key] = {f"{local}-{local}": {"Transport Type": call.backend.upper(),
                                            "Transit Size(MB)": bandwidth["Transit Size(MB)"],
                                            "Transit Time(ms)": bandwidth["Transit Time(ms)"],
                                            "Bandwidth(GB/s)": bandwidth["Bandwidth(GB/s)"]}}
    analyze = rank_prof / "analyze"
    analyze.mkdir(mode=fsio.DIR_MODE)
    for name, data in (("communication.json", communication), ("communication_matrix.json", matrix)):
        with fsio.create(analyze / name, root=rank_prof) as handle:
            json.dump(data, handle)


def _add_wait_tasks(rank_prof: Path, calls: list[_Call], waits: dict[tuple[int, str, int], float],
                    base_us: float) -> None:
    """The derived wait and transit of each collective as task events under the collective, on
    a ``Plane 0`` thread of the Communication process of the rank's msprof timeline."""
    folder = rank_prof / cann8.FOLDER
    timelines = sorted(folder.glob("msprof_*.json"))
    if not timelines or not calls:
        return
    path = timelines[-1]
    events = load_events(path)
    named = next((e for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                  and (e.get("args") or {}).get("name") == "Communication"), None)
    if named is None:
        return
    pid = named["pid"]
    # CANN 7's name of the process: MindInsight reads collectives only from "HCCL";
    # msprof-analyze reads either
    named["args"] = {**named["args"], "name": "HCCL"}
    # the assembled timeline's ts is µs since its own base: its one device's (base_us)
    tids = [e.get("tid", 0) for e in events if e.get("pid") == pid and isinstance(e.get("tid"), int)]
    indices = [(e.get("args") or {}).get("sort_index") for e in events
               if e.get("pid") == pid and e.get("name") == "thread_sort_index"]
    plane = max(tids, default=0) + 1
    # sorted last: compare gives a plane's tasks to the communication thread sorted before it
    last = max([i for i in indices if isinstance(i, int)] + tids, default=0) + 1
    added: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "tid": plane, "name": "thread_name", "args": {"name": "Plane 0"}},
        {"ph": "M", "pid": pid, "tid": plane, "name": "thread_sort_index", "args": {"sort_index": last}}]
    derived = "derived by jobprof: the wait for the group's last rank to start this collective"
    for call in calls:
        wait = waits[(call.rank, call.group, call.seq)]
        ts = round(call.start_us - base_us, 3)
        added.append({"ph": "X", "pid": pid, "tid": plane, "name": "Notify_Wait", "ts": ts,
                      "dur": round(wait, 3), "args": {"derived": derived, "op": op_key(call)}})
        added.append({"ph": "X", "pid": pid, "tid": plane, "name": "Transit", "ts": round(ts + wait, 3),
                      "dur": round(max(0.0, call.dur_us - wait), 3), "args": {"op": op_key(call)}})
    # thread_sort_index for every thread of the process: compare reads a thread only with one
    sorted_tids = {e.get("tid") for e in events
                   if e.get("pid") == pid and e.get("name") == "thread_sort_index"}
    for tid in sorted(set(tids) - sorted_tids):
        added.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                      "args": {"sort_index": tid}})
    with fsio.StreamedFile(path, root=rank_prof) as out:
        json.dump(events + added, out.handle)
        out.finish()
