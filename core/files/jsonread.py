"""Decoding the JSON jobprof reads back at volume: raw lines, Kineto windows, timelines, facts files.

orjson decodes these 1.6-4x faster than the standard library (bench/README, "jsonread"), and
decoding is a large part of what ``summary`` of a 1,000-rank profile costs.  It accepts strict
RFC 8259 JSON only, so whatever it refuses (NaN or Infinity in a Kineto trace, UTF-16, nesting
deeper than 1,024) is decoded again by :func:`json.loads`, which accepts it or raises its own
error.  orjson reads an integer beyond 64 bits as a float, silently: text holding a number that
long goes to :func:`json.loads` from the start.  So the values are the same either way (both
parse numbers with correct rounding), only faster.  Encoding stays with :mod:`json`: the files
and ``--json`` output keep their bytes.
"""

from __future__ import annotations

import functools
import json
from typing import Any

# a number orjson cannot hold as an int (beyond -2**63 .. 2**64-1) has 20 digits, or 19 after a
# minus: found on a copy with every digit made "0" (translate and find run in C; a regex is slower
# than the decode).  A false alarm, digits in a string, only costs the slower decoder.
_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_ZEROS_TEXT = str.maketrans("123456789", "000000000")


def _wide(data: bytes | str) -> bool:
    if isinstance(data, bytes):
        zeros = data.translate(_ZEROS)
        return b"0" * 20 in zeros or b"-" + b"0" * 19 in zeros
    text = data.translate(_ZEROS_TEXT)
    return "0" * 20 in text or "-" + "0" * 19 in text


@functools.cache
def _fast() -> Any:
    """orjson, or None when it is not installed; imported on the first read, never in a profiled
    job that reads nothing back."""
    try:
        import orjson
    except ImportError:  # installed without its dependencies: the standard library alone
        return None
    return orjson


def fast() -> Any:
    """orjson (imported now), or None when it is not installed: for writers too."""
    return _fast()


def preload() -> None:
    """Import orjson now, on this thread: the profiled job's exporting thread reads raw data
    back, and its first read importing it at exit deadlocked with a SIGTERM that interrupted
    the main thread inside an import (torch's atexit; CI run 83, py-spy of the hung job)."""
    _fast()


def loads(data: bytes | str) -> Any:
    """``json.loads(data)``, by orjson where it can (ValueError / RecursionError as json's)."""
    fast = _fast()
    if fast is not None and not _wide(data):
        try:
            return fast.loads(data)
        except fast.JSONDecodeError:
            pass  # refused: the standard library decides
    return json.loads(data)
