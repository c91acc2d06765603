"""OOM forensics: what was live when the job died of running out of memory.

On CUDA, once the program has initialised CUDA, the caching allocator keeps a bounded history of
its allocations with their Python stacks (``torch.cuda.memory._record_memory_history`` with
``stacks="python"``, the cheap setting, and ``max_entries`` :data:`HISTORY`), unless the program
records one itself (its settings are left alone).  When the job ends with an uncaught
``torch.OutOfMemoryError``, ``MemoryError`` or an allocator's failure (:data:`OOM_TEXT`: the CPU
allocator raises a RuntimeError), the session's end (which runs after Python printed
the traceback: the job's exception, output and exit code are unchanged) takes the allocator's
snapshot while the failing frames still hold their tensors, and keeps a digest in ``info.json``
(``jobprof.memory_oom``): the iteration, the error, the largest live blocks with the Python frame
that allocated each, and the last allocator events.  On CPU the digest holds the process's RSS and
high-water mark and the size asked for; ``jobprof summary`` adds the operators that held the most
at the memory peak.
UNVERIFIED on a GPU so far.
"""

from __future__ import annotations

import re
import sys
from typing import Any

#: allocator events the CUDA history ring keeps
HISTORY = 20_000
#: live blocks and last events kept in the digest
TOP = 10
LAST = 20


def start_history(torch: Any) -> str:
    """Turn the CUDA allocator's history on (training thread, CUDA initialised); returns what
    was done, for info.json."""
    memory = torch.cuda.memory
    try:
        if any(memory._snapshot().get("device_traces") or ()):
            return "the program records the allocator's history itself: left as it set it"
        memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=HISTORY)
    except Exception as exc:  # a torch without the private API
        return f"unavailable ({type(exc).__name__}: {exc})"
    return f"on (python stacks, last {HISTORY} events)"


#: what torch's allocators say when they cannot allocate (CUDA: ``torch.OutOfMemoryError``,
#: "CUDA out of memory. Tried to allocate 20.00 MiB"; CPU: a RuntimeError, "DefaultCPUAllocator:
#: can't allocate memory: you tried to allocate 35184372088832 bytes")
OOM_TEXT = re.compile(r"out of memory|can't allocate memory|cannot allocate memory", re.IGNORECASE)
_ASKED_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)
_ASKED_UNITS = re.compile(r"tried to allocate ([\d.]+) (GiB|MiB|KiB|B)\b", re.IGNORECASE)
_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def died_of_oom() -> BaseException | None:
    """The uncaught exception the program is ending with, if it is an out-of-memory error."""
    died = getattr(sys, "last_value", None)
    if not isinstance(died, BaseException):
        return None
    names = {cls.__name__ for cls in type(died).__mro__}
    if names & {"OutOfMemoryError", "MemoryError"} or OOM_TEXT.search(str(died)[:2000]):
        return died
    return None


def asked_bytes(message: str) -> int | None:
    """The size of the allocation that failed, where the error says it."""
    found = _ASKED_BYTES.search(message)
    if found:
        return int(found[1])
    found = _ASKED_UNITS.search(message)
    return round(float(found[1]) * _UNITS[found[2].lower()]) if found else None


def _frame(frames: Any) -> str:
    """The innermost frame of the program's own (not torch's) of a recorded stack."""
    frames = frames or []
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and not name.startswith("??"):
            return f"{name}:{f.get('line', '?')} {f.get('name', '')}".strip()
    if frames:
        f = frames[0]
        return f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '')}".strip()
    return ""


def cuda_digest(torch: Any, device: int | None) -> dict[str, Any]:
    """The live blocks and the last events of the allocator's snapshot (empty without CUDA)."""
    if device is None or not torch.cuda.is_initialized():
        return {}
    snap = torch.cuda.memory._snapshot()
    blocks: list[dict[str, Any]] = []
    reserved = 0
    for seg in snap.get("segments") or ():
        if seg.get("device") != device:
            continue
        reserved += int(seg.get("total_size", 0))
        for block in seg.get("blocks") or ():
            if block.get("state") == "active_allocated":
                blocks.append(
                    {
                        "bytes": int(block.get("requested_size") or block.get("size", 0)),
                        "where": _frame(block.get("frames")),
                    }
                )
    blocks.sort(key=lambda b: -b["bytes"])
    traces = snap.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    last = [
        {"action": e.get("action"), "bytes": int(e.get("size", 0)), "where": _frame(e.get("frames"))}
        for e in events[-LAST:]
    ]
    return {
        "device": f"cuda:{device}",
        "live_bytes": sum(b["bytes"] for b in blocks),
        "reserved_bytes": reserved,
        "live_blocks": len(blocks),
        "largest": blocks[:TOP],
        "last_events": last,
    }


def digest(died: BaseException, iteration: int, rss: int, hwm: int, cuda: dict[str, Any]) -> dict[str, Any]:
    text = str(died).strip()
    message = text.splitlines()[0][:300] if text else ""
    out: dict[str, Any] = {
        "error": type(died).__name__,
        "message": message,
        "iteration": iteration,
        "asked_bytes": asked_bytes(text),
        "rss_bytes": rss,
        "rss_peak_bytes": hwm,
    }
    if cuda:
        out["cuda"] = cuda
    return out
