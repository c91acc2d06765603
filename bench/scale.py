"""Analysis commands at cluster scale: one real profile replicated to 8 .. 1,024 ranks.

The source is a real 2-rank profile (``generate`` of ``bench/analysis.py``: torchrun DDP, 200
iterations, training_trace + hccl + dp + task_trace l0; cached with ``--cache``).  It is replicated
to each rank count by :func:`replicate`: device ``k`` of the replica is built from source device
``k % source ranks``.

What :func:`replicate` shares and what it rewrites:

- **Hard links** (``os.link``, one inode for every replica of a file): every raw segment
  (``data/raw.*.jsonl``), every Kineto window (``data/kineto/*``), ``start_info.<dev>`` and
  ``end_info.<dev>`` and their ``.done`` markers (clock stamps and sizes, nothing that names the
  device), and every per-iteration file of ``summary/`` and ``timeline/``.  A file whose *name*
  embeds the device id (``start_info.<dev>``, ``summary/op_statistic_<dev>_<model>_<iter>.csv``,
  ``timeline/hccl_<dev>_<model>_<iter>.json``, ...) is linked under the new device's name.
- **Rewritten copies**: ``info.json.<dev>`` (``rank_id``, ``devices``, ``DeviceInfo[].id`` become
  the new device id, ``jobprof.world_size`` the replica's rank count) and its ``.done`` marker (the
  new size).  That is what the analysis commands read to tell ranks apart (``rank_id``) and to look
  for missing ranks (``world_size``).  When the source has facts files
  (``data/facts.<dev>.json``, written at a job's exit since the facts commit), each is rewritten
  too: ``device``, ``rank`` and the rank entry's ``rank``/``device``/``world_size``, every
  breakdown row's ``rank``/``device``, and a fresh ``stamp`` (``jobprof.analysis.facts.stamp`` of
  the new folder: its folders' mtimes differ from the source's).  ``replicate(..., facts=False)``
  leaves them out (the commands then reduce every rank from its raw data).
- **Left as the source wrote them** (not read to tell ranks apart): the raw lines' hccl records
  (``rank``, ``ranks``, ``rank_size`` of the 2-rank gloo group: rewriting them would copy every raw
  segment; the bandwidths summary derives from ``rank_size`` therefore stay those of the measured
  2-rank collectives), the Kineto windows (relative names; ``traceName`` holds the source's scratch
  path, read by nothing), the CSVs' ``Device_id`` column and the timelines' ``NPU <dev>`` labels,
  and ``pid`` / ``hostname`` in info.json (``merge`` gives each rank its own pid block anyway).

Each command runs as a child process (the ``_MEASURED`` wrapper of ``bench/analysis.py``: its own
peak RSS from VmHWM), with ``--timeout`` seconds (a timeout is recorded, not a failure):

- ``summary --json`` cold (no facts files: every rank reduced from raw data), per engine when the
  installed ``jobprof summary`` has ``--engine``: ``local --jobs 1``, ``local`` (every core) and
  ``dask`` (a local cluster); one arm otherwise;
- ``report -o x.html`` cold (default engine), with the page's size;
- ``diff A A --json`` (the replica against itself: both sides read in full);
- ``merge -o m.json --iterations 1-5``: a window, since a merge of every iteration of 64+ ranks
  is tens of millions of events;
- then the rewritten facts files are added and ``summary --json`` and ``report`` run again (what a
  profile written by a current jobprof holds).

Per rank count: wall s, CPU s (the child and the workers it waited for), the command's own peak RSS
(VmHWM) and the largest single process of its tree (``wait4``'s ``ru_maxrss``: pool and Dask
workers included), output size, and s per rank.  Then a linear extrapolation to 1,024 ranks x
1,000 iterations on 32 cores and the issue's targets as pass/FAIL rows.

    python bench/scale.py [--ranks 8,64,256,1024 | --quick] [--cache DIR] [--timeout S] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from analysis import _MEASURED, _jobprof, generate

from common import HarnessError, clean_env

RANKS = (8, 64, 256, 1024)
QUICK_RANKS = (8, 32)
SOURCE_ITERATIONS, SOURCE_RANKS = 200, 2
MERGE_WINDOW = "1-5"
TIMEOUT_S = 600.0
#: the issue's targets: summary of 256 ranks x 200 iterations, default engine; the report page
TARGET_RANKS = 256
TARGET_S = 30.0
TARGET_MB = 1024.0
TARGET_PAGE_MB = 2.0
#: the extrapolation's job
EXTRA_RANKS, EXTRA_ITERATIONS, EXTRA_CORES = 1024, 1000, 32

_INFO_RE = re.compile(r"^info\.json\.(\d+)$")
_FACTS_RE = re.compile(r"^facts\.(\d+)\.json$")
#: top-level files of a device folder named for the device: ``<name>.<dev>`` and ``<name>.<dev>.done``
_NAMED_RE = re.compile(r"^(?P<name>start_info|end_info|info\.json)\.(?P<device>\d+)(?P<done>\.done)?$")


# -- replication -------------------------------------------------------------------------------
def _devices(prof: Path) -> list[tuple[int, Path]]:
    from jobprof.files.profdir import device_dirs

    return [(int(d.name.split("_")[1]), d) for d in device_dirs(prof)]


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        raise HarnessError(f"cannot hard-link {src} -> {dst} ({exc}): the replica must be on the "
                           "source's file system") from exc


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    done = path.with_name(path.name + ".done")
    done.write_text(f"filesize:{len(text.encode())}\n")


def _info(src: Path, device: int, world: int) -> str:
    info = json.loads(src.read_text())
    info["rank_id"] = device
    info["devices"] = str(device)
    for entry in info.get("DeviceInfo") or ():
        if isinstance(entry, dict):
            entry["id"] = device
    if isinstance(info.get("jobprof"), dict):
        info["jobprof"]["world_size"] = world
    return json.dumps(info)


def _name_for(name: str, old: int, new: int) -> str:
    """A device folder's file name with the device id it embeds replaced (else unchanged)."""
    from jobprof.files.profdir import ITERATION_FILE_RE

    named = _NAMED_RE.match(name)
    if named and int(named["device"]) == old:
        return f"{named['name']}.{new}{named['done'] or ''}"
    it = ITERATION_FILE_RE.match(name)
    if it and int(it["device"]) == old:
        return f"{it['name']}_{new}_{it['model']}_{it['iter']}.{it['ext']}"
    return name


def _copy_device(src: Path, old: int, dst: Path, new: int, world: int) -> int:
    """Device folder ``src`` (device ``old``) as ``dst`` (device ``new``): links and rewrites;
    facts files are left out (:func:`add_facts`).  Returns the number of links made."""
    links = 0
    for here, dirs, files in os.walk(src):
        rel = Path(here).relative_to(src)
        target = dst / rel
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if rel == Path("data") and _FACTS_RE.match(name):
                continue
            if rel == Path(".") and (m := _INFO_RE.match(name)) and int(m[1]) == old:
                _write(target / f"info.json.{new}", _info(Path(here, name), new, world))
                continue
            if rel == Path(".") and name == f"info.json.{old}.done":
                continue  # written with the rewritten info.json
            _link(Path(here, name), target / _name_for(name, old, new))
            links += 1
        dirs.sort()
    return links


def _facts_text(src: Path, folder: Path, device: int, world: int) -> str | None:
    """The source device's facts file rewritten for ``device`` in ``folder``, stamped afresh."""
    from jobprof.analysis import facts as facts_mod

    try:
        kept = facts_mod.read_file(src)
        asked, facts = kept["stamp"][1], kept["facts"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    facts["device"] = facts["rank"] = device
    entry = facts.get("entry")
    if isinstance(entry, dict):
        entry["rank"] = entry["device"] = device
        if "world_size" in entry:
            entry["world_size"] = world
    for row in facts.get("rows") or ():
        row["rank"] = row["device"] = device
    return facts_mod.file_text(facts_mod.stamp(folder, asked), facts)


def add_facts(src_prof: Path, replica: Path) -> int:
    """Writes each replica device's facts file from its source device's (same ``k % n`` mapping
    as :func:`replicate`), once the device folder is complete (the stamp holds its folders'
    mtimes).  Returns how many were written (0: the source has none)."""
    source = _devices(src_prof)
    devices = _devices(replica)
    world = len(devices)
    written = 0
    for k, (new, folder) in enumerate(devices):
        old, src_dir = source[k % len(source)]
        facts_file = src_dir / "data" / f"facts.{old}.json"
        if not facts_file.is_file():
            continue
        text = _facts_text(facts_file, folder, new, world)
        if text is not None:
            (folder / "data" / f"facts.{new}.json").write_text(text)
            written += 1
    return written


def replicate(src_prof: Path, dest: Path, ranks: int, facts: bool = True) -> Path:
    """A copy of the PROF_ folder ``src_prof`` with ``ranks`` devices, made in ``dest`` (created;
    same file system as the source) under the source's name; returns its path.  Device ``k`` is
    source device ``k % source ranks``, as rank ``k`` of a job of ``ranks`` (see the module doc
    for what is linked and what rewritten).  ``facts``: also rewrite the source's facts files."""
    source = _devices(src_prof)
    if not source:
        raise HarnessError(f"{src_prof}: no device_<id> folder")
    if ranks < 1:
        raise ValueError(f"ranks {ranks}: expected 1 or more")
    out = Path(dest) / src_prof.name
    out.mkdir(parents=True)
    for k in range(ranks):
        old, folder = source[k % len(source)]
        _copy_device(folder, old, out / f"device_{k}", k, ranks)
    if facts:
        add_facts(src_prof, out)
    return out


def _stretch_tables(tables: dict[str, list[Any]], factor: float) -> dict[str, list[Any]]:
    """diff's tables (``DiffTable.to_plain``) grown ``factor`` times, as if their iterations
    repeated: counts and times scaled, each per-iteration series repeated to the new length."""
    out: dict[str, list[Any]] = {}
    for plugin, found in tables.items():
        out[plugin] = []
        for table in found:
            covered = table.get("covered")
            grown = None if covered is None else round(covered * factor)
            rows = []
            for key, calls, time_, size, series in table["rows"]:
                if series:
                    laps = -(-round(len(series) * factor) // len(series))
                    series = (series * laps)[:round(len(series) * factor)]
                rows.append([key, round(calls * factor), time_ * factor,
                             None if size is None else round(size * factor), series])
            out[plugin].append({**table, "covered": grown, "rows": rows})
    return out


def stretch(src_prof: Path, dest: Path, ranks: int, iterations: int) -> Path:
    """A facts-only replica of ``ranks`` ranks x ``iterations`` iterations, for the combine half
    at sizes no raw replica reaches here (1,024 x 1,000): each device holds its rewritten
    info.json, linked end_info / raw segments, and a facts file whose iteration rows and records
    are the source device's repeated to ``iterations`` (iteration numbers and start times
    continued), its rank entry recomputed from them, its plugins' aggregates as the source's, and
    every iteration counted as rendered.  No summary/ or timeline/ file: what it measures is
    reading facts files and the cross-rank half, not rendering."""
    from jobprof.analysis import facts as facts_mod
    from jobprof.analysis.profile import Profile

    source = _devices(src_prof)
    kept = {old: facts_mod.read_file(d / "data" / f"facts.{old}.json") for old, d in source}
    out = Path(dest) / src_prof.name
    out.mkdir(parents=True)
    for k in range(ranks):
        old, folder = source[k % len(source)]
        device = out / f"device_{k}"
        (device / "data").mkdir(parents=True)
        _write(device / f"info.json.{k}", _info(folder / f"info.json.{old}", k, ranks))
        for name in (f"{base}.{old}{done}" for base in ("end_info", "start_info") for done in ("", ".done")):
            if (folder / name).exists():
                _link(folder / name, device / _name_for(name, old, k))
        for segment in sorted((folder / "data").glob("raw.*.jsonl")):
            _link(segment, device / "data" / segment.name)
    keys = None
    for k in range(ranks):
        old, _ = source[k % len(source)]
        src = kept[old]["facts"]
        keys = keys or kept[old]["stamp"][1]
        rows, records = src["rows"], src["iterations"]
        span = records[-1]["end_ns"] - records[0]["start_ns"] if records else 0
        new_rows, new_records = [], []
        for i in range(iterations):
            lap, j = divmod(i, len(rows))
            shift = lap * span
            new_rows.append({**rows[j], "rank": k, "device": k, "iteration": i + 1,
                             "start_ns": rows[j]["start_ns"] + shift, "_basis": src["entry"]["basis"]})
            rec = records[j]
            new_records.append({**rec, "index": i + 1, "start_ns": rec["start_ns"] + shift,
                                "end_ns": rec["end_ns"] + shift})
        folder = out / f"device_{k}"
        entry = facts_mod.rank_entry(Profile(out, device=k), k, new_rows)
        facts = {**src, "device": k, "rank": k, "entry": entry, "iterations": new_records,
                 "rows": [{n: v for n, v in r.items() if n != "_basis"} for r in new_rows],
                 "rendered": [[1, iterations]], "problems": [],
                 "diff_tables": _stretch_tables(src.get("diff_tables") or {}, iterations / len(rows))}
        stamp = facts_mod.stamp(folder, keys)
        (folder / "data" / f"facts.{k}.json").write_text(facts_mod.file_text(stamp, facts))
    return out


# -- timing ------------------------------------------------------------------------------------
def _run(cmd: list[str], cwd: Path, timeout: float) -> dict[str, Any]:
    """One child run as ``_timed`` of ``bench/analysis.py`` does it (wall, CPU, its own VmHWM), with
    a time limit: past it the child's process group (its workers too) is killed and the run is
    recorded as ``timeout``.  Also the largest process of its tree (``ru_maxrss``)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        began = time.perf_counter()
        child = subprocess.Popen(cmd, env=clean_env(), cwd=str(cwd), stdout=out, stderr=err,
                                 start_new_session=True)
        timed_out = False
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - began > timeout:
                timed_out = True
                os.killpg(child.pid, signal.SIGKILL)
                _, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - began
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        return {"status": "timeout", "wall_s": wall, "cpu_s": None, "peak_mb": None, "tree_mb": None,
                "stdout": ""}
    if child.returncode != 0:
        raise HarnessError(f"{' '.join(cmd[3:])!r} exited {child.returncode}:\n{stderr[-2000:]}")
    hwm = re.findall(r"jobprof-bench-vmhwm-kb (\d+)", stderr)
    return {"status": "ok", "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_mb": int(hwm[-1]) / 1024 if hwm else None, "tree_mb": usage.ru_maxrss / 1024,
            "stdout": stdout}


def has_engines() -> bool:
    """Whether the installed ``jobprof summary`` takes ``--engine``."""
    proc = subprocess.run([str(_jobprof()), "summary", "--help"], env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    return "--engine" in proc.stdout


def _arms(prof: Path, work: Path, engines: bool) -> list[tuple[str, list[str], Path | None]]:
    """(name, command, output file) of the cold arms (no facts files)."""
    run = [sys.executable, "-c", _MEASURED]
    summary = [*run, "summary", "--json", str(prof)]
    arms: list[tuple[str, list[str], Path | None]] = []
    if engines:
        arms += [("summary local x1", [*summary, "--engine", "local", "--jobs", "1"], None),
                 ("summary local (default)", [*summary, "--engine", "local"], None),
                 ("summary dask", [*summary, "--engine", "dask"], None)]
    else:
        arms.append(("summary (default)", summary, None))
    arms += [("report (default)", [*run, "report", str(prof), "-o", str(work / "x.html")], work / "x.html"),
             ("diff A A", [*run, "diff", str(prof), str(prof), "--json"], None),
             (f"merge --iterations {MERGE_WINDOW}",
              [*run, "merge", str(prof), "-o", str(work / "m.json"), "--iterations", MERGE_WINDOW],
              work / "m.json")]
    return arms


def _check(stdout: str, ranks: int, iterations: dict[int, int]) -> str | None:
    """What is wrong with a replica's ``summary --json`` (None: ranks 0..ranks-1, each with its
    source rank's iteration count)."""
    model = json.loads(stdout)
    seen = [(r["rank"], r["iterations"]["count"]) for r in model["ranks"]]
    want = [(k, iterations[k % len(iterations)]) for k in range(ranks)]
    return None if seen == want else f"summary saw {seen[:6]}... ({len(seen)} ranks), expected {want[:6]}..."


def _source(cache: Path, work: Path) -> tuple[Path, dict[str, Any], bool]:
    """The source profile, with facts files: a linked 2-rank copy whose facts are computed once
    (a profile generated before facts files existed has none).  Returns (path, meta, has facts)."""
    meta = generate(cache, SOURCE_ITERATIONS, SOURCE_RANKS)
    prof = Path(meta["prof"])
    if list(prof.glob("device_*/data/facts.*.json")):
        return prof, meta, True
    copy = replicate(prof, work / "source", SOURCE_RANKS, facts=False)
    code = ("import sys\nfrom pathlib import Path\nfrom jobprof.analysis import facts\n"
            "from jobprof.engine.manager import PluginManager\nfrom jobprof.plugin.reporter import Reporter\n"
            "m = PluginManager(Reporter())\nm.load_entry_points()\n"
            "print(len(facts.write(Path(sys.argv[1]), m)))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(copy)], env=clean_env(), capture_output=True,
                          text=True, timeout=600)
    ok = proc.returncode == 0 and proc.stdout.strip() == str(SOURCE_RANKS)
    return copy, meta, ok


def run(rank_counts: list[int], cache: Path | None, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="jobprof-bench-scale-") as tmp:
        cache = cache or Path(tmp) / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        # replicas live beside the source (hard links need its file system), removed after use
        work = Path(tempfile.mkdtemp(prefix="scale-work-", dir=cache))
        try:
            return _measure(rank_counts, cache, work, timeout)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _measure(rank_counts: list[int], cache: Path, work: Path, timeout: float) -> dict[str, Any]:
    src, meta, with_facts = _source(cache, work)
    probe = _run([sys.executable, "-c", _MEASURED, "summary", "--json", str(src)], work, timeout)
    if probe["status"] != "ok":
        raise HarnessError(f"summary of the source timed out after {timeout:.0f} s")
    iterations = {r["rank"]: r["iterations"]["count"] for r in json.loads(probe["stdout"])["ranks"]}
    engines = has_engines()
    result: dict[str, Any] = {"source": {**meta, "facts_source": str(src), "facts": with_facts,
                                         "iterations_per_rank": iterations},
                              "engines": engines, "cores": os.cpu_count(), "timeout_s": timeout,
                              "merge_window": MERGE_WINDOW, "points": []}
    for ranks in rank_counts:
        point: dict[str, Any] = {"ranks": ranks, "commands": {}}
        began = time.perf_counter()
        replica = replicate(src, work / f"r{ranks}", ranks, facts=False)
        point["replicate_s"] = time.perf_counter() - began
        point["files"] = sum(len(f) for _, _, f in os.walk(replica))
        arms = _arms(replica, work, engines)
        for name, cmd, output in arms:
            one = _run(cmd, work, timeout)
            if one["status"] == "ok" and name.startswith("summary") and "problem" not in point:
                point["problem"] = _check(one["stdout"], ranks, iterations)
            if output is not None and output.exists():
                one["output_bytes"] = output.stat().st_size
                output.unlink()
            elif name.startswith(("summary", "diff")) and one["status"] == "ok":
                one["output_bytes"] = len(one["stdout"].encode())
            one.pop("stdout")
            point["commands"][name] = one
            print(f"scale: {ranks} ranks: {name}: {_fmt(one['wall_s'])} s ({one['status']})",
                  file=sys.stderr, flush=True)
        if with_facts and add_facts(src, replica) == ranks:
            facts_arms = (("summary, facts files", arms[1 if engines else 0][1], None),
                          ("report, facts files", arms[3 if engines else 1][1], work / "x.html"),
                          ("diff A A, facts files", arms[4 if engines else 2][1], None))
            for name, cmd, output in facts_arms:
                one = _run(cmd, work, timeout)
                if output is not None and output.exists():
                    one["output_bytes"] = output.stat().st_size
                    output.unlink()
                elif one["status"] == "ok":
                    one["output_bytes"] = len(one["stdout"].encode())
                one.pop("stdout")
                point["commands"][name] = one
                print(f"scale: {ranks} ranks: {name}: {_fmt(one['wall_s'])} s ({one['status']})",
                      file=sys.stderr, flush=True)
        result["points"].append(point)
        shutil.rmtree(replica.parent, ignore_errors=True)
    return result


# -- output ------------------------------------------------------------------------------------
def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for point in result["points"]:
        for name, c in point["commands"].items():
            ok = c["status"] == "ok"
            out.append({"ranks": point["ranks"], "command": name,
                        "wall s": _fmt(c["wall_s"]) if ok else f"timeout ({c['wall_s']:.0f} s)",
                        "CPU s": _fmt(c["cpu_s"]), "peak MB (own)": _fmt(c["peak_mb"], 0),
                        "largest process MB": _fmt(c["tree_mb"], 0),
                        "output bytes": f"{c['output_bytes']:,}" if c.get("output_bytes") else "-",
                        "s / rank": _fmt(c["wall_s"] / point["ranks"], 3) if ok else "-"})
    return out


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``wall = serial + per_rank * ranks`` (one point: serial 0)."""
    if len(points) < 2:
        ranks, wall = points[0]
        return 0.0, wall / ranks
    n = len(points)
    mx = sum(r for r, _ in points) / n
    my = sum(w for _, w in points) / n
    slope = sum((r - mx) * (w - my) for r, w in points) / sum((r - mx) ** 2 for r, _ in points)
    return max(my - slope * mx, 0.0), slope


def _series(result: dict[str, Any], name: str) -> list[tuple[int, float]]:
    return [(p["ranks"], p["commands"][name]["wall_s"]) for p in result["points"]
            if p["commands"].get(name, {}).get("status") == "ok"]


def extrapolation(result: dict[str, Any]) -> list[str]:
    """1,024 ranks x 1,000 iterations on 32 cores, from the measured points (see the lines)."""
    its = SOURCE_ITERATIONS
    scale = EXTRA_RANKS * EXTRA_ITERATIONS
    lines = [f"extrapolation to {EXTRA_RANKS:,} ranks x {EXTRA_ITERATIONS:,} iterations on {EXTRA_CORES} "
             f"cores: fit wall = serial + c x ranks by least squares over the measured rank counts "
             f"(serial: the intercept, start-up and the cross-rank half); c from the largest measured "
             f"point, (wall - serial) / ranks, per rank-iteration c / {its}; predicted = serial + "
             f"c x cores used here / {its} x {EXTRA_RANKS} x {EXTRA_ITERATIONS} / cores (the map half "
             "spread over the cores; with facts files the per-rank cost is paid in one process: 1 core)"]
    here = result["cores"] or 1
    default = "summary local (default)" if result["engines"] else "summary (default)"
    # (arm, cores it used here, cores of the extrapolated machine)
    arms = [("summary local x1", 1, EXTRA_CORES), (default, here if result["engines"] else 1, EXTRA_CORES),
            ("summary dask", here, EXTRA_CORES), ("summary, facts files", 1, 1)]
    for name, used, cores in arms:
        points = _series(result, name)
        if not points:
            continue
        serial, _ = _fit(points)
        ranks, wall = max(points)
        per_rank = max(wall - serial, 0.0) / ranks
        predicted = serial + per_rank * used / its * scale / cores
        lines.append(f"{name}: serial {serial:.2f} s, {per_rank:.4f} s per rank on {used} core(s) "
                     f"({per_rank * used / its * 1e3:.3f} core-ms per rank-iteration) at {ranks} ranks -> "
                     f"about {predicted:,.0f} s ({predicted / 60:,.1f} min) for {EXTRA_RANKS:,} x "
                     f"{EXTRA_ITERATIONS:,} on {cores} core{'s' if cores > 1 else ''}")
    return lines


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    point = next((p for p in result["points"] if p["ranks"] == TARGET_RANKS), None)
    default = "summary local (default)" if result["engines"] else "summary (default)"
    checks = [(f"summary {TARGET_RANKS} ranks x {SOURCE_ITERATIONS} it, default engine, no facts files: wall",
               default, "wall_s", TARGET_S, "s"),
              (f"summary {TARGET_RANKS} ranks: peak RSS of the command", default, "peak_mb", TARGET_MB, "MB"),
              (f"summary {TARGET_RANKS} ranks, facts files: wall", "summary, facts files", "wall_s",
               TARGET_S, "s"),
              (f"summary {TARGET_RANKS} ranks, facts files: peak RSS", "summary, facts files", "peak_mb",
               TARGET_MB, "MB"),
              (f"report page at {TARGET_RANKS} ranks", "report (default)", "output_bytes",
               TARGET_PAGE_MB * 1e6, "bytes")]
    out = []
    for label, name, key, target, unit in checks:
        c = (point or {}).get("commands", {}).get(name)
        limit = f"<= {target / 1e6:.0f} MB" if unit == "bytes" else f"<= {target:.0f} {unit}"
        if c is None:
            value, word = "not measured", "-"
        elif c["status"] != "ok":
            value, word = f"timeout ({c['wall_s']:.0f} s)", "FAIL"
        else:
            got = c.get(key)
            value = f"{got / 1e6:.2f} MB" if unit == "bytes" else f"{got:.1f} {unit}"
            word = "pass" if got is not None and got <= target else "FAIL"
        out.append({"target": label, "measured": value, "limit": limit, "result": word})
    return out


def notes(result: dict[str, Any]) -> list[str]:
    src = result["source"]
    lines = [f"source: {src['ranks']} ranks x {src['iterations']} iterations ({src['prof']}); replica "
             f"device k = source device k % {src['ranks']}, data hard-linked, info.json rewritten",
             f"merge runs on iterations {result['merge_window']} only (every iteration of 64+ ranks "
             "is tens of millions of events)",
             "cold rows: no facts files, every rank reduced from its raw data on the engine named; "
             "'facts files' rows: each replica rank's facts file rewritten from the source's"
             + ("" if src["facts"] else " (NOT available: the facts rows are missing)"),
             "peak MB (own): VmHWM of the command's process; largest process MB: ru_maxrss over it and "
             "the workers it waited for (one process, not a sum)"]
    if not result["engines"]:
        lines.append("this jobprof summary has no --engine: one summary arm")
    for p in result["points"]:
        lines.append(f"{p['ranks']} ranks: replica of {p['files']:,} files made in {p['replicate_s']:.1f} s"
                     + (f"; CHECK FAILED: {p['problem']}" if p.get("problem") else
                        "; summary saw every rank with its source's iteration count"))
    return lines + extrapolation(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", help="rank counts, e.g. 8,64 (default 8,64,256,1024)")
    parser.add_argument("--quick", action="store_true", help=f"rank counts {QUICK_RANKS}")
    parser.add_argument("--cache", type=Path, help="keep the generated source profile here (reused next "
                        "time); the replicas are made beside it")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per command")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the raw numbers here")
    parser.add_argument("--stretch", metavar="RxN", help="instead: a facts-only replica of R ranks x N "
                        "iterations (stretch()); time summary --json, report and diff reading it")
    args = parser.parse_args()
    if args.stretch:
        return _stretched(args)
    counts = ([int(x) for x in args.ranks.split(",")] if args.ranks else
              list(QUICK_RANKS if args.quick else RANKS))
    try:
        result = run(counts, args.cache, args.timeout)
    except HarnessError as exc:
        print(f"bench: harness failure: {exc}", file=sys.stderr)
        return 2
    from tabulate import tabulate

    print(tabulate(rows(result), headers="keys", tablefmt="github"))
    print()
    print(tabulate(targets(result), headers="keys", tablefmt="github"))
    for line in notes(result):
        print(f"- {line}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"- raw numbers: {args.json}")
    return 2 if any(p.get("problem") for p in result["points"]) else 0


def _stretched(args: argparse.Namespace) -> int:
    """``--stretch RxN``: the combine half alone, at R ranks x N iterations (facts files only)."""
    ranks, iterations = (int(x) for x in args.stretch.lower().split("x"))
    cache = args.cache or Path(tempfile.mkdtemp(prefix="jobprof-stretch-"))
    work = Path(tempfile.mkdtemp(prefix="stretch-", dir=cache))
    try:
        prof, _, _ = _source(cache, work)
        began = time.perf_counter()
        replica = stretch(prof, work / "stretched", ranks, iterations)
        took = time.perf_counter() - began
        print(f"stretch: {ranks} ranks x {iterations} iterations built in {took:.1f} s")
        for name, cmd in (("summary --json", ["summary", "--json", str(replica)]),
                          ("report", ["report", str(replica), "-o", str(work / "r.html")]),
                          ("diff A A --json", ["diff", "--json", str(replica), str(replica)])):
            got = _run([sys.executable, "-c", _MEASURED, *cmd], work, args.timeout)
            size = (work / "r.html").stat().st_size if name == "report" and (work / "r.html").exists() \
                else len(got.get("stdout") or "")
            if name == "summary --json" and got.get("stdout"):
                model = json.loads(got["stdout"])
                counts = {r["iterations"]["count"] for r in model["ranks"]}
                if len(model["ranks"]) != ranks or counts != {iterations}:
                    raise HarnessError(f"the stretched profile read as {len(model['ranks'])} ranks with "
                                       f"{sorted(counts)} iterations, not {ranks} x {iterations}")
            print(f"stretch: {name}: {got.get('wall_s', float('nan')):.2f} s wall, "
                  f"{got.get('cpu_s', float('nan')):.2f} s CPU, {got.get('peak_mb', float('nan')):.0f} MB "
                  f"peak, {size:,} bytes out ({got.get('status', 'ok')})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
