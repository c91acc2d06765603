"""Does orjson earn its place?  Decoding what the analysis commands read back: json vs jsonread.

The files are a real profile's (``--prof``, default: made by a short real job with the operator
tier, so it has raw lines, Kineto windows, timelines and facts files): every file of each kind is
decoded by :func:`json.loads` and by :func:`jobprof.files.jsonread.loads` (orjson where it
accepts the text), the median of ``--repeats`` passes each; the values are checked equal.

    python bench/jsonread.py [--prof PROF_DIR] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _made() -> Path:
    """A real profile: examples/train_mlp.py, 20 steps, training_trace and task_trace l1."""
    sys.path.insert(0, str(ROOT / "bench"))
    from common import clean_env

    out = Path(tempfile.mkdtemp(prefix="jobprof-jsonread-"))
    env = clean_env({"PROFILING_MODE": "true", "PROFILING_OPTIONS": json.dumps(
        {"output": str(out), "export": "inline", "training_trace": "on", "task_trace": "l1"})})
    subprocess.run([sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--steps", "20",
                    "--workers", "0"], env=env, check=True, capture_output=True, timeout=600)
    (prof,) = out.glob("PROF_*")
    return prof


def inputs(prof: Path) -> dict[str, list[bytes]]:
    """Each kind of file the analysis commands decode, as the bytes they decode."""
    lines = [line for seg in sorted(prof.glob("device_*/data/raw.*.jsonl"))
             for line in seg.read_bytes().splitlines() if line.strip()]
    windows = [gzip.decompress(p.read_bytes()) for p in sorted(prof.glob("device_*/data/kineto/*.json.gz"))]
    timelines = [p.read_bytes() for p in sorted(prof.glob("device_*/timeline/msprof_*.json"))]
    facts = [p.read_bytes().partition(b"\n")[0] for p in sorted(prof.glob("device_*/data/facts.*.json"))]
    return {"raw lines": lines, "Kineto windows": windows, "master timelines": timelines,
            "facts files": facts}


def _timed(decode: Callable[[bytes], Any], items: list[bytes], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        for item in items:
            decode(item)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def run(prof: Path, repeats: int) -> list[dict[str, Any]]:
    from jobprof.files import jsonread

    if jsonread._fast() is None:
        raise SystemExit("orjson is not installed: nothing to compare")
    rows = []
    for kind, items in inputs(prof).items():
        if not items:
            continue
        for item in items:  # the same values, or the bench is void
            assert json.dumps(jsonread.loads(item)) == json.dumps(json.loads(item)), kind
        size = sum(len(i) for i in items)
        slow, fast = _timed(json.loads, items, repeats), _timed(jsonread.loads, items, repeats)
        rows.append({"kind": kind, "files": len(items), "MB": size / 1e6, "json s": slow,
                     "jsonread s": fast, "json MB/s": size / 1e6 / slow, "jsonread MB/s": size / 1e6 / fast,
                     "speed-up": slow / fast})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prof", type=Path, help="a PROF_ directory (default: made by a short real job)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from tabulate import tabulate

    rows = run(args.prof or _made(), args.repeats)
    print(tabulate(rows, headers="keys", floatfmt=".3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
