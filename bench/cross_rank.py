"""The cross-rank half of ``summary`` at scale: is an embedded engine (Polars, DuckDB) or a columnar
facts file (Parquet) worth a dependency?

The rows are a real profile's: one rank's iteration rows from a facts file (``--facts``, default:
made from a short real job), replicated to R ranks x N iterations with a deterministic jitter.
Arms, each timed as the median of ``--repeats`` runs in this process:

- ``python``: :func:`jobprof.analysis.summary.cross_rank` on the rows as the facts hold them
  (what ships);
- ``polars``: the same answers (per iteration: slowest rank, max, min, median, spread; per rank:
  slowest count and median excess) as Polars expressions, including building the frame from the
  rows (the facts are Python objects either way);
- ``read json`` / ``read parquet``: reading one rank's rows back from a JSON facts file vs a
  Parquet file of the same rows (the per-rank cost every command pays, times R).

Polars is optional here (``pip install polars``): without it only the python arms run.

    python bench/cross_rank.py [--shapes 256x200,1024x1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ((256, 200), (1024, 200), (1024, 1000))


def _real_rows() -> list[dict[str, Any]]:
    """One rank's iteration rows from a real short job's facts file."""
    import subprocess

    from common import clean_env

    out = Path(tempfile.mkdtemp(prefix="jobprof-cross-rank-"))
    env = clean_env({"PROFILING_MODE": "true",
                     "PROFILING_OPTIONS": json.dumps({"output": str(out), "export": "inline",
                                                      "training_trace": "on"})})
    subprocess.run([sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--steps", "20",
                    "--workers", "0"], env=env, check=True, capture_output=True, timeout=300)
    (facts,) = out.glob("PROF_*/device_0/data/facts.0.json")
    from jobprof.analysis.facts import read_file

    rows: list[dict[str, Any]] = read_file(facts)["facts"]["rows"]
    return rows


def replicate(rows: list[dict[str, Any]], ranks: int, iterations: int) -> dict[int, list[dict[str, Any]]]:
    rng = random.Random(19)
    out = {}
    for rank in range(ranks):
        mine = []
        for i in range(iterations):
            row = dict(rows[i % len(rows)], rank=rank, device=rank, iteration=i + 1)
            row["iteration_ms"] = row["iteration_ms"] * (1 + 0.05 * rng.random())
            mine.append(row)
        out[rank] = mine
    return out


def _polars(rows_by_rank: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    import polars as pl

    frame = pl.DataFrame([{"rank": r["rank"], "iteration": r["iteration"], "iteration_ms": r["iteration_ms"],
                           "comm": r["communication_not_overlapped_ms"]}
                          for rows in rows_by_rank.values() for r in rows])
    frame = frame.with_columns(busy=pl.col("iteration_ms") - pl.col("comm").fill_null(0.0))
    per_iteration = frame.group_by("iteration").agg(
        max_ms=pl.col("busy").max(), min_ms=pl.col("busy").min(), median_ms=pl.col("busy").median(),
        slowest_rank=pl.col("rank").sort_by([pl.col("busy"), -pl.col("rank")]).last(),
        iteration_time=pl.col("iteration_ms").max()).sort("iteration")
    per_iteration = per_iteration.with_columns(spread_ms=pl.col("max_ms") - pl.col("min_ms"))
    slowest = per_iteration.group_by("slowest_rank").len()
    excess = frame.join(per_iteration.select("iteration", "median_ms"), on="iteration").group_by("rank").agg(
        median_excess=(pl.col("busy") / pl.col("median_ms") - 1).median())
    return {"per_iteration": per_iteration.height, "slowest": slowest.height, "excess": excess.height}


def _timed(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def run(shapes: list[tuple[int, int]], repeats: int) -> list[dict[str, Any]]:
    from jobprof.analysis.summary import cross_rank

    try:
        import polars as pl
    except ImportError:
        pl = None
    base = _real_rows()
    results = []
    for ranks, iterations in shapes:
        rows = replicate(base, ranks, iterations)
        row: dict[str, Any] = {"ranks": ranks, "iterations": iterations,
                               "python_s": _timed(lambda rows=rows: cross_rank(rows), repeats)}
        row["polars_s"] = _timed(lambda rows=rows: _polars(rows), repeats) if pl else None
        one = rows[0]
        with tempfile.TemporaryDirectory() as tmp:
            as_json = Path(tmp) / "facts.json"
            as_json.write_text(json.dumps({"rows": one}))
            row["read_json_ms"] = 1e3 * _timed(lambda p=as_json: json.loads(p.read_bytes()), repeats * 5)
            if pl:
                as_parquet = Path(tmp) / "rows.parquet"
                plain = [{k: v for k, v in r.items() if k != "_basis"} for r in one]
                pl.DataFrame(plain).write_parquet(as_parquet)
                row["read_parquet_ms"] = 1e3 * _timed(
                    lambda p=as_parquet: pl.read_parquet(p).to_dicts(), repeats * 5)
            else:
                row["read_parquet_ms"] = None
        results.append(row)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES),
                        help="RANKSxITERATIONS, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    results = run(shapes, args.repeats)  # type: ignore[arg-type]
    from tabulate import tabulate

    fmt = lambda v, d=2: "n/a" if v is None else f"{v:.{d}f}"  # noqa: E731
    print(tabulate([[r["ranks"], r["iterations"], fmt(r["python_s"]), fmt(r["polars_s"]),
                     fmt(r["read_json_ms"]), fmt(r["read_parquet_ms"])] for r in results],
                   headers=["ranks", "iterations", "cross_rank python s", "polars s",
                            "read 1 rank json ms", "parquet ms"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
