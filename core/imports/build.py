"""Pass 2: one trace's spooled events into a device folder, as a live CUDA job writes its raw data.

Each iteration gets the window file a live job's operator capture writes
(``data/kineto/window.<n>.json.gz``: Kineto's own events, unchanged but for the 2021 category
names) holding exactly its events: host events by their start, device work by its launch (a
kernel queued in step N runs in step N's records, wherever the GPU ran it).  Its raw line holds
the iteration, a reference to that window, the step points, and, where the trace has them, the
collectives (``hccl``) and the ``record_function`` ranges (``msproftx``).

Clock: the import's "monotonic" clock *is* the trace's wall clock (epoch ns), so the window
offset is 0 and start_info's anchor maps every time onto itself.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import attrs

from jobprof import __version__
from jobprof.files import fsio, kinetotrace, rawstore
from jobprof.imports import collectives
from jobprof.imports.scan import HOST, Scan
from jobprof.plugin.clock import ClockAnchor
from jobprof.plugin.records import CollectiveRecord, StepPointsRecord, TxRecord
from jobprof.plugin.values import Iteration

#: how an imported iteration was cut (info.json ``iteration_method``, the step trace)
BY_STEP = "ProfilerStep#N (imported)"
#: a trace without ProfilerStep annotations: the whole trace as one iteration
WHOLE_TRACE = "whole trace (imported; no ProfilerStep#N in it)"
#: window spools open at once while routing (an iteration's spool is reopened when needed)
OPEN_SPOOLS = 64
#: the record_function domain the msproftx plugin records ranges under
TX_DOMAIN = "record_function"


@attrs.frozen
class Built:
    """One trace file's iterations, written into a device folder."""

    path: Path
    rank: int
    iterations: tuple[int, ...]
    method: str
    events: int
    kernels: int
    collectives: int
    #: record_function ranges (user_annotation) imported as msproftx ranges
    ranges: int
    #: complete events whose time lies in no ProfilerStep (left out)
    outside: int
    #: iterations left out because an earlier file of the rank has them
    duplicates: tuple[int, ...]
    unknown: Mapping[str, int]
    first_ns: int
    last_ns: int
    provenance: Mapping[str, Any]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with fsio.open_read(path) as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def iterations_of(found: Scan) -> tuple[list[tuple[int, int, int]], str]:
    """(number, start, end) per iteration in time order, and how they were cut."""
    if found.steps:
        return sorted(((n, s, e) for n, (s, e) in found.steps.items()), key=lambda it: it[1]), BY_STEP
    if found.first_ns is None or found.last_ns is None:
        return [], WHOLE_TRACE
    return [(1, found.first_ns, max(found.last_ns, found.first_ns + 1))], WHOLE_TRACE


class _Spools:
    """Per-iteration files of events, at most :data:`OPEN_SPOOLS` open at once."""

    def __init__(self, folder: Path, root: Path) -> None:
        self.folder, self.root = folder, root
        self.open: dict[int, IO[bytes]] = {}
        self.paths: dict[int, Path] = {}
        self.count: Counter[int] = Counter()

    def write(self, key: int, data: bytes) -> None:
        handle = self.open.pop(key, None)
        if handle is None:
            if len(self.open) >= OPEN_SPOOLS:
                self.open.pop(next(iter(self.open))).close()
            path = self.paths.get(key)
            if path is None:
                path = self.paths[key] = self.folder / f".import.{key}.json"
                handle = fsio.create(path, self.root, binary=True)
            else:
                handle = open(fsio.open_append(path, self.root), "ab")  # noqa: SIM115 (kept open: LRU)
        self.open[key] = handle  # the most recently used last
        if self.count[key]:
            handle.write(b",")
        handle.write(data)
        self.count[key] += 1

    def close(self) -> None:
        for handle in self.open.values():
            handle.close()
        self.open.clear()

    def window(self, key: int, base_ns: int, target: Path) -> int:
        """The iteration's events as a window file (gzip, written atomically); its bytes."""
        self.close()
        path = self.paths.get(key)
        # level 1, as a live job's windows (kinetotrace.save_window): raw data, read back once
        with fsio.StreamedFile(target, binary=True, compress=True, root=self.root, level=1) as out:
            out.handle.write(b'{"baseTimeNanoseconds": %d, "traceEvents": [' % base_ns)
            if path is not None:
                with fsio.open_read(path) as spool:
                    while block := spool.read(1 << 20):
                        out.handle.write(block)
            out.handle.write(b"]}")
            out.finish()
        if path is not None:
            path.unlink()
        return target.stat().st_size


def dumps_function() -> Any:
    try:
        import orjson

        return orjson.dumps
    except ImportError:  # orjson is a dependency; json if a platform lacks its wheel
        return lambda obj: json.dumps(obj).encode()


def build(found: Scan, spool: Path, device_dir: Path, rank: int, taken: set[int], window_from: int,
          backend: str | None) -> tuple[Built, list[tuple[int, dict[str, list[Any]]]], int]:
    """Pass 2 over the spool pass 1 wrote (one JSON line per event, no parse): each line into its
    iteration's window file in ``device_dir/data/kineto``, numbered from ``window_from``; the raw
    lines to append (in time order); ``taken``: iteration numbers an earlier file of this rank
    has (left out).  Returns what was built, the lines, and the next window number."""
    header = found.header
    spans, method = iterations_of(found)
    keep = [(n, s, e) for n, s, e in spans if n not in taken]
    duplicates = tuple(n for n, _, _ in spans if n in taken)
    starts = [s for _, s, _ in keep]
    ends = [e for _, _, e in keep]
    numbers = [n for n, _, _ in keep]
    launches = found.launches

    def slot(owner: int) -> int:
        k = bisect_right(starts, owner) - 1
        return k if k >= 0 and owner < ends[k] else -1

    folder = device_dir / "data" / kinetotrace.FOLDER
    spools = _Spools(folder, device_dir.parent)
    outside = kernels = 0
    try:
        with fsio.open_read(spool) as lines:
            for line, start, link in zip(lines, found.starts, found.links, strict=True):
                if link >= 0:
                    launch = launches.get(link)
                    k = slot(launch[0] if launch is not None else start)
                else:
                    k = slot(start)
                if k < 0:
                    outside += 1
                    continue
                if link != HOST:
                    kernels += 1
                spools.write(numbers[k], line[:-1])
        fp: dict[int, int] = {}
        bp: dict[int, int] = {}
        forward, backward = found.forward, found.backward
        for i in range(0, len(forward), 2):
            start, end = forward[i], forward[i + 1]
            k = slot(start)
            if k >= 0 and start < fp.get(k, start + 1) and not found.in_not_forward(start, end):
                fp[k] = start
        for i in range(0, len(backward), 2):
            k = slot(backward[i])
            if k >= 0:
                bp[k] = max(bp.get(k, backward[i + 1]), backward[i + 1])
        comms: dict[int, list[CollectiveRecord]] = {}
        group = collectives.default_group(header.distributed)
        for start, end, e in found.nccl:
            if not collectives.is_collective_kernel(e.get("name", "")):
                continue
            launch = launches.get((e.get("args") or {}).get("correlation"))  # type: ignore[arg-type]
            k = slot(launch[0] if launch is not None else start)
            if k < 0:
                continue
            host = found.comms_at(launch[1], launch[0]) if launch is not None else {}
            comms.setdefault(numbers[k], []).append(collectives.record(
                e, start, end, host, launch[1] if launch is not None else None, header.rank, backend, group))
        tx: dict[int, list[TxRecord]] = {}
        for start, end, name, tid in found.ranges:
            k = slot(start)
            if k >= 0:
                tx.setdefault(numbers[k], []).append(TxRecord(name, start, end, tid, "r", TX_DOMAIN))
        out = []
        window = window_from
        _number_collectives(comms, keep)
        for k, (number, start, end) in enumerate(keep):
            name = kinetotrace.window_name(window)
            window += 1
            size = spools.window(number, header.base_ns, folder / name)
            f, b = fp.get(k), bp.get(k)
            if f is not None and b is not None and b < f:
                b = None  # a backward before any forward is no BP End of this step
            streams: dict[str, list[Any]] = {
                rawstore.ITERATION_STREAM: [Iteration(number, start, end, method, f, b).to_record()],
                rawstore.OPS_STREAM: [kinetotrace.reference(name, 0, size, True, found.shapes)],
                StepPointsRecord.STREAM: [StepPointsRecord(f, b, "auto", "auto").to_raw()],
            }
            if found.nccl:
                streams[CollectiveRecord.STREAM] = [r.to_raw() for r in comms.get(number, ())]
            if number in tx:
                streams[TxRecord.STREAM] = [r.to_raw() for r in sorted(tx[number], key=lambda r: r.start_ns)]
            out.append((number, streams))
    finally:
        spools.close()
        for path in spools.paths.values():
            path.unlink(missing_ok=True)
    built = Built(header.path, rank, tuple(numbers), method, found.events, kernels,
                  sum(map(len, comms.values())), sum(map(len, tx.values())), outside, duplicates,
                  dict(found.unknown), found.first_ns or 0, found.last_ns or 0,
                  provenance(found, keep, method))
    return built, out, window


def _number_collectives(comms: dict[int, list[CollectiveRecord]], keep: list[tuple[int, int, int]]) -> None:
    """A call's ``seq`` (its number in its group, what ranks are matched by) where the trace
    does not say it: counted in launch order from the first imported iteration (each rank of a
    job imported over the same steps counts the same calls)."""
    counters: Counter[str | None] = Counter()
    for number, _, _ in keep:
        calls = comms.get(number)
        if not calls:
            continue
        calls.sort(key=lambda r: r.start_ns)
        for i, call in enumerate(calls):
            if call.seq is None:
                calls[i] = attrs.evolve(call, seq=counters[call.group])
            counters[call.group] += 1


def provenance(found: Scan, keep: list[tuple[int, int, int]], method: str) -> dict[str, Any]:
    header = found.header
    return {
        "source": str(header.path), "bytes": header.size, "encoding": header.encoding,
        "sha256": sha256(header.path), "schemaVersion": header.schema_version,
        "trace": {k: v for k, v in header.other.items() if isinstance(v, (str, int, float))},
        "events": found.events, "categories": dict(found.categories),
        "unknown_categories": dict(found.unknown), "steps": [n for n, _, _ in keep],
        "iteration_method": method, "repeated_steps": found.repeated_steps}


def _device_info(found: Scan) -> list[dict[str, Any]]:
    """info.json ``DeviceInfo`` from the trace's ``deviceProperties``: the GPU its kernels ran on."""
    device = found.device
    props = next((p for p in found.header.device_properties if p.get("id") == device), None)
    if props is None:
        return [{"id": device if device is not None else 0, "type": "CPU" if device is None else "GPU"}]
    name = props.get("name")
    out: dict[str, Any] = {"id": device, "type": "ROCm" if _is_amd(props) else "CUDA",
                           "name": name if isinstance(name, str) else "N/A",
                           "compute_units": "CUDA streaming multiprocessors", "aiv_num": 0}
    sms = props.get("numSms")
    if isinstance(sms, int) and sms > 0:
        out["ai_core_num"] = sms
    memory = props.get("totalGlobalMem")
    if isinstance(memory, int) and memory > 0:
        out["memory_bytes"] = memory
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    if isinstance(major, int) and isinstance(minor, int):
        out["compute_capability"] = f"{major}.{minor}"
    return [out]


def _is_amd(props: Mapping[str, Any]) -> bool:
    name = str(props.get("name", ""))
    return "AMD" in name or "Radeon" in name or "Instinct" in name or props.get("warpSize") == 64


#: Kineto's categories of API calls (HIP's on ROCm are read as the same)
API_CATEGORIES = ("cuda_runtime", "cuda_driver")


def has_api_calls(built: Built) -> bool:
    """The trace file holds CUDA runtime or driver calls (runtime_api then has data)."""
    categories = built.provenance.get("categories") or {}
    return any(categories.get(c) for c in API_CATEGORIES)


def options(found_any_nccl: bool, found_any_tx: bool, output: str,
            found_any_api: bool = False) -> dict[str, Any]:
    """The options of a live job that would have written what the import writes."""
    return {"output": output, "training_trace": "on", "task_trace": "on",
            # host-side time per operator, [host] on those that launched no device work
            "aicpu": "on",
            "hccl": "on" if found_any_nccl else "off", "msproftx": "on" if found_any_tx else "off",
            # CUDA runtime / driver calls (HIP's): api_statistic and the timeline's API layer
            "runtime_api": "on" if found_any_api else "off",
            # the iteration as Kineto's trace format again (`jobprof kineto`, HTA)
            "kineto_trace": "on"}


@attrs.frozen
class RankFacts:
    """What a rank's metadata needs of its traces, kept once the scans are gone."""

    device_info: list[dict[str, Any]]
    host_pid: int | None
    rank_in_trace: int | None
    file_name: str

    @classmethod
    def of(cls, found: Scan) -> RankFacts:
        return cls(_device_info(found), found.host_pid, found.header.rank, found.header.path.name)


def write_metadata(device_dir: Path, found: RankFacts, built: list[Built], rank: int, world: Any,
                   backend: Any, config: Mapping[str, Any], time_base_ns: int) -> None:
    """start_info, end_info and info.json of an imported device folder (what the trace says;
    what it cannot say, the host's name, OS, cores, memory, is N/A)."""
    device = int(device_dir.name.rpartition("_")[2])
    first = min(b.first_ns for b in built) // 1000 * 1000
    last = max(b.last_ns for b in built)
    begin, end = ClockAnchor(first, first, first), ClockAnchor(last // 1000 * 1000, last // 1000 * 1000, 0)
    root = device_dir.parent
    fsio.write_with_done(device_dir / f"start_info.{device}", json.dumps(begin.info("Begin")), root)
    fsio.write_with_done(device_dir / f"end_info.{device}", json.dumps(end.info("End")), root)
    iterations = [n for b in built for n in b.iterations]
    info = {
        "jobInfo": "NA", "version": "1.0", "OS": "N/A", "cpuCores": "N/A", "hostname": "N/A",
        "hwtype": "N/A", "devices": str(device),
        "pid": str(found.host_pid) if found.host_pid is not None else "N/A",
        "pid_name": found.file_name, "memoryTotal": "N/A",
        "rank_id": rank,
        "DeviceInfo": found.device_info,
        "jobprof": {
            "version": __version__, "torch": "N/A", "options": dict(config), "explicit": sorted(config),
            "options_source": "jobprof import", "device_id_from": "rank in the trace (distributedInfo)"
            if found.rank_in_trace is not None else "the order of the files",
            "world_size": world, "backend": backend, "local_rank": "N/A",
            "iteration_method": built[0].method, "plugins": [], "own_startup_ms": {},
            "time_base_ns": time_base_ns, "disabled": [],
            "end_reason": "imported", "iterations_written": len(iterations), "iterations_exported": 0,
            "iterations_deferred": 0, "export_seconds": 0, "segments_aged": 0, "aged": [], "unrendered": [],
            "export_notes": [], "messages": [],
            "imported": [dict(b.provenance, outside=b.outside, duplicates=list(b.duplicates),
                              kernels=b.kernels, collectives=b.collectives) for b in built],
        },
    }
    fsio.write_with_done(device_dir / f"info.json.{device}", json.dumps(info), root)

