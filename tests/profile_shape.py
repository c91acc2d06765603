"""The run-independent shape of a jobprof output folder, for comparing two jobprof versions.

``shape(prof_root)`` reads every file under the ``output`` folder's ``PROF_*`` directories and
returns a JSON-able dict that two runs of the same deterministic job give identically, whatever
the clock did, and that changes when a file, a column, a row, an event, a key or a formatting
choice changes.  It imports nothing from jobprof (module paths change between the versions it
compares).  Used by tests/test_same_output.py; regenerate a golden with

    python tests/profile_shape.py --write tests/data/same_output_<case>.json <output folder>

(``--print`` instead of ``--write`` shows it).

Masking rules (everything else is kept verbatim):

1. Names.  The ``PROF_<index>_<stamp>_<random>`` folder keeps its index only; inside it a run of
   14+ digits in a file or folder name (a timestamp) becomes ``#``.
2. Value rule, for every CSV cell, every JSON value and every string:
   - a decimal number with a fraction (``12.345``; in CSV cells also inside text, e.g. the
     trailing-tab stamp ``1796206116549821.623\\t``) is time-derived in jobprof (times,
     durations, percentages, ratios, rates, bandwidths, calibrated peaks): its digits become
     ``#``, keeping sign, the number of decimals and surrounding text (``#.###\\t``); JSON
     floats become ``"<float>"``;
   - an integer of 12+ digits is an absolute stamp (epoch us/ns, monotonic clock): ``"#"``;
   - the absolute path of the output folder inside any string becomes ``<output>`` and the
     ``PROF_`` folder name its rule-1 form.
3. Name rule, by CSV column or JSON key (case-insensitive, see ``_VOLATILE_KEY``): process,
   thread and stream ids (``pid``, ``tid``, hccl's ``thread``, ``Stream ID``: jobprof's CPU
   stream id is the OS pid), host and machine facts (``hostname``, ``OS``, ``cpuCores``,
   ``memoryTotal``, DeviceInfo's ``ai_core_num`` and ``aic_frequency``), dates and clocks
   (``collectionDate*``, ``collectionTime*``, ``clockMonotonic*``, ``time_base_ns``), jobprof's
   own timings (``own_startup_ms``, ``export_seconds``, ``seconds``), ``filesize`` in ``*.done``
   markers (the size of a file holding masked values) and the ``options.output`` path: the whole value becomes
   ``"<masked>"`` (a dict or list keeps its keys / length).  In info.json's ``calibration``
   block (machine speed: peaks, bandwidth, the matmul size it grew to, buffer sizes from the
   cache size) every number is masked, its texts are kept, except where the peaks came from
   (``source``, ``cache_file``, ``measured_at``, ``cache_note``, ``other_cpu_share``: measured
   now or read from the calibration cache, which depends on the runs before): masked whole;
   ``version`` strings are kept (``"1.0"`` is no time).
   3b. Races (``_RACE_KEY``): values that record which of two concurrent things happened first,
   found different between runs of the same job: hccl's ``end from`` / raw ``end_from``
   (``completion`` vs ``backward end``: did DDP's bucket finish before backward ended) and
   ``group ranks`` / raw ``ranks`` (``[0, 1]`` in some runs, ``N/A`` in others: the lazy
   ``_global_ranks`` lookup; looks like a jobprof bug): the whole value becomes ``"<masked>"``,
   whatever its type (a list's length would tell the two outcomes apart).
4. Timelines (Chrome trace JSON): ``ts`` and ``dur`` are masked by rule 2; ``pid`` and ``tid``
   (and flow ``id``) are kept as ordinals in first-seen order within the file (``pid#0``,
   ``tid#2``): which events share a track stays checked, the OS pid / thread id numbers do not.
   Each event is kept as one JSON string with its keys in file order.  A thread track named
   after an OS thread (``Thread <id>``, ``Stream <id>``) sorts by that id: its
   ``thread_sort_index`` is masked and the id in names becomes ``<os id>``.
   4b. Lanes: a ``<track> (lane k)`` track exists only when spans on ``<track>`` overlapped in
   time (DDP's async bucket all-reduces overlap or not, run to run); its events are counted on
   ``<track>`` and its own thread metadata is dropped.
5. Row order is kept except where jobprof ranks rows by time: ``op_statistic`` (sorted by
   Total Time) and ``communication_statistic`` rows are compared sorted, after masking.
6. ``data/`` raw segments (jobprof's internal record stream, not a user-facing format): only
   their structure: per line, its keys, ``index``, and per stream the record count and the
   distinct record shapes (dict keys, list lengths, value types), no values.
7. ``data/facts.<id>.json`` (a cache of the analysis commands, added after the goldens were
   made): its keys, the plugins asked and those that answered, and its row count; no values.
8. ``data/kineto/window.<n>.json.gz`` (Kineto's own Chrome trace of one capture window, gzip;
   the operator tier reads operators only from these since issue 28): its top-level keys and
   whether it holds events; the events are Kineto's (thread ids, timings, Python ids), not ours.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import sys
from pathlib import Path

MASK = "<masked>"

# Rule 3: column / key names whose whole value is run- or machine-dependent.
_VOLATILE_KEY = re.compile(
    r"^(pid|tid|thread|stream[ _]?id|hostname|os|cpucores|memorytotal|ai_core_num|aic_frequency|"
    r"collection(date|time)(begin|end)|"
    r"clockmonotonic(raw)?|time_base_ns|own_startup_ms|bootstrap_ms|export_seconds|seconds|filesize|"
    r"output)$", re.IGNORECASE)
# Rule 5: files whose rows jobprof sorts by a time column.
_RANKED_BY_TIME = re.compile(r"^(op_statistic|communication_statistic)_")
_FRACTION = re.compile(r"(?<![\w.])(-?)(\d+)\.(\d+)(?![\w.])")
_LONG_INT = re.compile(r"(?<![\w.])\d{12,}(?![\w.])")
_PROF = re.compile(r"PROF_(\d+)_\d+_[A-Z0-9]+")
_STAMP_IN_NAME = re.compile(r"\d{14,}")
_OS_ID_IN_TEXT = re.compile(r"\b(Thread|Stream) (\d+)\b")
_LANE = re.compile(r"^(.*) \(lane \d+\)$")
# Rule 3b: values that say which of two racing events came first (see the docstring).
_RACE_KEY = re.compile(r"^(end from|end_from|group ranks|ranks)$")


def _os_ids(prof_root: Path) -> set[int]:
    """The run's OS process / thread ids: info.json pids, msprof_tx tids, CSV stream ids."""
    ids: set[int] = set()
    for path in prof_root.glob("PROF_*/*/info.json*"):
        try:
            pid = json.loads(path.read_text(encoding="utf-8")).get("pid")
        except (ValueError, AttributeError):
            continue
        if str(pid).isdigit():
            ids.add(int(pid))
    for path in prof_root.glob("PROF_*/*/summary/*.csv"):
        with open(path, newline="", encoding="utf-8-sig") as handle:
            for row in csv.DictReader(handle):
                for key in ("pid", "tid", "Stream ID", "stream_id"):
                    if (row.get(key) or "").strip().isdigit():
                        ids.add(int(row[key]))
    return ids


class _Ctx:
    def __init__(self, root: Path, os_ids: set[int]) -> None:
        self.root = str(root.resolve())
        self.raw_root = str(root)
        self.os_ids = os_ids

    def text(self, value: str) -> str:
        for path in {self.root, self.raw_root}:
            value = value.replace(path, "<output>")
        value = _PROF.sub(r"PROF_\1_#_#", value)
        value = _OS_ID_IN_TEXT.sub(lambda m: f"{m[1]} <os id>" if int(m[2]) in self.os_ids else m[0], value)
        value = _FRACTION.sub(lambda m: f"{m[1]}#.{'#' * len(m[3])}", value)
        return _LONG_INT.sub("#", value)

    def value(self, value, key: str | None = None):
        if key == "calibration":
            return _calibration_masked(value)
        if key == "version" and isinstance(value, str):
            return value
        if key is not None and _RACE_KEY.match(key):
            return MASK  # whole: the race shows in the type too ([0, 1] or "N/A")
        if key is not None and _VOLATILE_KEY.match(key):
            if isinstance(value, dict):
                return {k: MASK for k in value}
            if isinstance(value, list):
                return [MASK] * len(value)
            return MASK
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, float):
            return "<float>"
        if isinstance(value, int):
            return "#" if abs(value) >= 10 ** 11 else value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v, k) for k, v in value.items()}
        return value


#: the calibration's provenance (jobprof.ops.calcache): which depends on earlier runs
_CALIBRATION_SOURCE = ("source", "cache_file", "measured_at", "cache_note", "other_cpu_share")


def _calibration_masked(value):
    if not isinstance(value, dict):
        return _numbers_masked(value)
    return {k: MASK if k in _CALIBRATION_SOURCE else _numbers_masked(v) for k, v in value.items()}


def _numbers_masked(value):
    if isinstance(value, dict):
        return {k: _numbers_masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_masked(v) for v in value]
    return MASK if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _row(cells: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(cells)
    return out.getvalue()


def _name(part: str) -> str:
    part = _PROF.sub(r"PROF_\1_#_#", part)
    return _STAMP_IN_NAME.sub("#", part)


def _csv(path: Path, ctx: _Ctx) -> dict:
    data = path.read_bytes()
    text = data.decode("utf-8-sig")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    masked = [[MASK if i < len(header) and _VOLATILE_KEY.match(header[i].strip()) else ctx.text(cell)
               for i, cell in enumerate(row)] for row in body]
    if _RANKED_BY_TIME.match(path.name):
        masked.sort()
    return {"kind": "csv", "bom": data.startswith(b"\xef\xbb\xbf"),
            "newline": "\\r\\n" if b"\r\n" in data else "\\n", "header": header,
            "rows": [_row(r) for r in masked]}


def _timeline(data, text: str, ctx: _Ctx) -> dict:
    events = data if isinstance(data, list) else data.get("traceEvents", [])
    for event in events:  # the OS threads this file names ("Thread 11060", "Stream 11060")
        name = event.get("args", {}).get("name") if event.get("name") == "thread_name" else None
        if isinstance(name, str) and (m := _OS_ID_IN_TEXT.match(name)):
            ctx.os_ids.update({int(m[2]), event.get("tid")})
    # Rule 4b: lane k of a track ("<track> (lane k)", jobprof.lanes) exists when spans on that
    # track overlapped in time (DDP's bucket all-reduces: a race); its events count as the track's.
    names = {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
             if e.get("name") == "thread_name" and isinstance(e.get("args", {}).get("name"), str)}
    by_name = {(pid, name): tid for (pid, tid), name in names.items()}
    lane_of: dict[tuple, object] = {}
    for (pid, tid), name in names.items():
        if (m := _LANE.match(name)) and (pid, m[1]) in by_name:
            lane_of[(pid, tid)] = by_name[(pid, m[1])]
    ordinals: dict[str, dict] = {"pid": {}, "tid": {}, "id": {}}
    out = []
    for event in events:
        if (event.get("pid"), event.get("tid")) in lane_of:
            if event.get("ph") == "M" and event.get("name") in ("thread_name", "thread_sort_index"):
                continue
            event = {**event, "tid": lane_of[(event.get("pid"), event.get("tid"))]}
        if (event.get("name") == "thread_sort_index" and isinstance(event.get("args"), dict)
                and ctx.os_ids & {event.get("tid"), event["args"].get("sort_index")}):
            # An OS thread's tracks sort by its id (msproftx: id * lanes + lane; task_trace's
            # overlapping lane: the thread's id).
            event = {**event, "args": {**event["args"], "sort_index": "<os id>"}}
        masked = {}
        for key, value in event.items():
            if key in ordinals and isinstance(value, (int, str)):
                seen = ordinals[key]
                masked[key] = f"{key}#{seen.setdefault(value, len(seen))}"
            elif key in ("ts", "dur"):
                masked[key] = "<float>" if isinstance(value, float) else ctx.value(value)
            else:
                masked[key] = ctx.value(value, key)
        out.append(json.dumps(masked, ensure_ascii=False))
    shape = {"kind": "timeline", "top": type(data).__name__,
             "compact": ", " not in text[:4096], "lines": text.count("\n"), "events": out}
    if isinstance(data, dict):
        shape["other"] = {k: ctx.value(v, k) for k, v in data.items() if k != "traceEvents"}
    return shape


def _record_shape(record) -> str:
    if isinstance(record, dict):
        return "{" + ",".join(f"{k}:" + ("<race>" if _RACE_KEY.match(k) else _record_shape(v)
                                         if isinstance(v, (dict, list)) else type(v).__name__)
                              for k, v in record.items()) + "}"
    if isinstance(record, list):
        return f"[{len(record)}:" + ",".join(sorted({type(v).__name__ for v in record})) + "]"
    return type(record).__name__


def _raw(path: Path) -> dict:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if not isinstance(record, dict):
            lines.append(type(record).__name__)
            continue
        streams = record.get("streams", {})
        lines.append({"keys": list(record), "index": record.get("index"),
                      "streams": {name: {"count": len(recs) if isinstance(recs, list) else None,
                                         "shapes": sorted({_record_shape(r) for r in recs})
                                         if isinstance(recs, list) else _record_shape(recs)}
                                  for name, recs in streams.items()} if isinstance(streams, dict) else None})
    return {"kind": "raw", "lines": lines}


def _facts(path: Path) -> dict:
    # two JSON lines: {"stamp", "facts"}, then {"diff_tables"}
    head, _, tail = path.read_text(encoding="utf-8").partition("\n")
    kept = json.loads(head)
    facts = kept.get("facts") or {}
    return {"kind": "facts", "keys": sorted(kept), "facts_keys": sorted(facts),
            "second_line_keys": sorted(json.loads(tail)) if tail else None,
            "asked": facts.get("asked"), "answered": sorted(facts.get("plugins") or {}),
            "rows": len(facts.get("rows") or ())}


def _kineto_window(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    return {"kind": "kineto window", "keys": sorted(trace), "has_events": bool(trace.get("traceEvents"))}


def _file(path: Path, ctx: _Ctx) -> dict:
    if path.parent.name == "kineto" and path.parent.parent.name == "data" and path.name.endswith(".json.gz"):
        return _kineto_window(path)
    if path.parent.name == "data" and path.suffix == ".jsonl":
        return _raw(path)
    if path.parent.name == "data" and path.name.startswith("facts."):
        return _facts(path)
    if path.suffix == ".csv":
        return _csv(path, ctx)
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError:  # plain text: the *.done markers ("filesize:N")
        lines = []
        for line in text.splitlines():
            key, sep, rest = line.partition(":")
            lines.append(f"{key}{sep}{MASK if sep and _VOLATILE_KEY.match(key) else ctx.text(rest)}"
                         if sep else ctx.text(line))
        return {"kind": "text", "lines": lines}
    if path.parent.name == "timeline" or (isinstance(data, dict) and "traceEvents" in data):
        return _timeline(data, text, ctx)
    return {"kind": "json", "compact": ", " not in text[:4096], "value": ctx.value(data)}


def shape(prof_root: Path) -> dict:
    """The normalized description of every file under ``prof_root``'s ``PROF_*`` folders."""
    prof_root = Path(prof_root)
    ctx = _Ctx(prof_root, _os_ids(prof_root))
    out: dict = {"prof_dirs": [], "files": {}}
    for prof in sorted(prof_root.glob("PROF_*")):
        name = _name(prof.name)
        out["prof_dirs"].append(name)
        for path in sorted(p for p in prof.rglob("*") if p.is_file()):
            rel = "/".join([name, *(_name(part) for part in path.relative_to(prof).parts)])
            out["files"][rel] = _file(path, ctx)
    return out


def dumps(value: dict) -> str:
    """Indented JSON with each CSV row / timeline event on its own line (readable git diffs)."""
    return json.dumps(value, indent=1, ensure_ascii=False, sort_keys=False) + "\n"


def diff(expected: dict, actual: dict, limit: int = 20) -> list[str]:
    """The first ``limit`` differences, each as 'path: expected != actual'."""
    found: list[str] = []

    def walk(a, b, where: str) -> None:
        if len(found) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in list(a) + [k for k in b if k not in a]:
                if key not in b:
                    found.append(f"{where}/{key}: only in golden")
                elif key not in a:
                    found.append(f"{where}/{key}: only in this run")
                else:
                    walk(a[key], b[key], f"{where}/{key}")
                if len(found) >= limit:
                    return
        elif isinstance(a, list) and isinstance(b, list):
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{where}[{i}]")
                if len(found) >= limit:
                    return
            if len(a) != len(b) and len(found) < limit:
                found.append(f"{where}: {len(a)} items in golden, {len(b)} in this run"
                             f" (first extra: {(a[len(b):] or b[len(a):])[0]!r:.300})")
        else:
            found.append(f"{where}:\n    golden: {a!r:.400}\n    run:    {b!r:.400}")

    walk(expected, actual, "")
    return found


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--write":
        Path(argv[1]).parent.mkdir(parents=True, exist_ok=True)
        Path(argv[1]).write_text(dumps(shape(Path(argv[2]))), encoding="utf-8")
        return 0
    if len(argv) == 2 and argv[0] == "--print":
        sys.stdout.write(dumps(shape(Path(argv[1]))))
        return 0
    print("usage: profile_shape.py --write GOLDEN.json OUTPUT_DIR | --print OUTPUT_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
