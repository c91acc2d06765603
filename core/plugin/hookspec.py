"""The plugin contract: every hook jobprof calls, in lifecycle order, and the rules around them.

This module is the reference.  Its docstrings are Markdown: `docs/hooks.md` is generated from them
(`python -m jobprof.engine.hookdoc`, checked by `tests/test_docs.py`), CONTRIBUTING.md teaches the
contract with an example and links here.  Everything a plugin imports comes from `jobprof.plugin`.

## 1. Calling conventions

Mark each implementation with `@hookimpl` (`from jobprof.plugin import hookimpl`). Hooks are called
by keyword, so an implementation declares only the arguments it uses
(`def jobprof_iteration_end(iteration):` is fine); declaring an argument the hook does not have
disables the plugin. Hooks are called by pluggy, in pluggy's order with built-ins first: every
built-in implementation runs before any third-party one (a third-party `tryfirst` is ignored,
`trylast` is kept), and third-party plugins run the last loaded first (pluggy's override order;
they load by entry-point name). `jobprof_aic_metrics` is `firstresult` (the first answer stops the
call). New-style hook wrappers (`@hookimpl(wrapper=True)`) wrap the other implementations and see
their answers (`jobprof.plugin.Answer`); old-style `hookwrapper=True` is refused (the hookspec
module's docstring has the rules). Return values are checked: a result the contract does not allow
disables the plugin ([section 6](#6-when-a-plugin-breaks)).

**One import surface.** Everything a plugin uses from jobprof is exported by `jobprof.plugin`
(`from jobprof.plugin import ExportContext, WriterSpec, hookimpl`; the list is
`jobprof.plugin.__all__`): `hookimpl` and `Answer`; the values `Config`, `Iteration`,
`ExportContext`, `WriterSpec`, `MetricSet`, `PartSource`, `NA`, `STEP_MODE_MODEL_ID`; the types
the hooks are annotated with that are no class: `Streams` (an iteration's records by stream),
`StreamsOut` (what `jobprof_iteration_end` hands over), `Spans`, `JSON` (facts); what a plugin
reads and writes: `PluginSession`, `Profile` (a protocol of the read-only view the analysis commands
pass; `profile.is_on(device, "l2")` says whether an option was on
for a device, `profile.options(device)` gives them all), `Timeline`, the declared records of shared streams with
`records_of`, an `ops` record (`OpRecord`, a named tuple: `r.name`, `r.start`, `r.dur`, `r.kind`,
`r.shapes`, ...), an `op_memory` record (`MemoryEvent`: `e.ts`, `e.bytes`, `e.addr`,
`e.total_allocated`, ...), `OpView` / `Task` and the
module `opview`, `assign_lanes` / `lane_tid` / `lane_name`, the module `opmath`, the module
`histogram` (durations in 2% log buckets: medians and p95s that merge across iterations and
ranks, for `jobprof_rank_facts`; `histogram.median_p95(h)` reads both back); the answers
`Finding`, `Section`, `DiffTable`, `DiffCount` and the span categories of the breakdown
(`DATA_WAIT`, `COMPUTE`, ...); the module `channel` (records from the job's other processes,
imported on first use: `from jobprof.plugin import channel`); `read_raw` (a device folder's raw
records read back, for a plugin's tests). Importing it imports no torch and no later stage. The
built-in plugins import nothing else from jobprof but a short named allow-list of mechanisms of one
plugin each (`jobprof.ops.perfcounters` for l2, `jobprof.ops.calibrate` for aic_metrics: heavy,
machine-specific, no part of the contract): `tests/test_layout.py` holds them to it, so a third-party
plugin can do everything a built-in one does. Every other module of jobprof is private: the engine
that drives this contract (`jobprof.engine`: the plugin manager, options), the stages that collect,
store, render and analyse. Module paths from before this layout (`jobprof.types`,
`jobprof.plugin.types`, `jobprof.plugin.manager`, ...) still import, with a `DeprecationWarning`.

Hooks are called by pluggy, with pluggy's semantics:

- **Order.** pluggy's: the last registered runs first, `trylast` implementations last.
  Built-ins always run before third-party plugins (jobprof registers their plain
  implementations `tryfirst` and ignores `tryfirst` on a third-party one), so a built-in
  claims its streams and writer files first; the first plugin to return a stream or a file
  owns it.  Third-party plugins load by entry-point name (then `sys.path`) and so run in
  reverse of that order: a plugin loaded later can override an earlier one's answer to
  `jobprof_aic_metrics`.
- **firstresult.** `jobprof_aic_metrics` is `firstresult`: pluggy stops at the first
  implementation that returns something other than None; the later ones are not called.
- **Wrappers.** A new-style wrapper, `@hookimpl(wrapper=True)`, runs around the other
  implementations of a hook (pluggy's own order among wrappers).  What it receives from
  `yield` is the list of `Answer` (plugin, checked value) the implementations
  returned, or for a firstresult hook the one Answer or None; what it returns replaces it.  It
  may drop or reorder answers and add its own (`Answer(<its plugin name>, value)`, checked
  like an implementation's).  A wrapper that raises, or returns anything else, is disabled
  and the inner result passes through unchanged.  Old-style `hookwrapper=True` is refused:

```python
@hookimpl(wrapper=True)
def jobprof_report_sections(profile):
    answers = yield
    return [a for a in answers if a.plugin != "noisy"]
```


## 2. Lifecycle

```
 every process started with PROFILING_MODE=true (main thread, before the user's script runs)
 ├─ registration  load `jobprof` entry points ─> jobprof_options_schema()  (every loaded plugin)
 │                compose core schema + fragments, validate PROFILING_OPTIONS ─> frozen Config
 ├─ configure     jobprof_configure(config)  ─> False: inactive in this process
 │
 │  ... the user's script runs ...
 ├─ collection    `import torch` completes ──> jobprof_session_start(session)  [thread importing torch]
 │                each finished iteration ───> jobprof_iteration_end(session, iteration) [training thread]
 │                   │ {stream: [records]}              (first iteration: PROF_ dir created,
 │                   ▼                                   jobprof_writers(config) called once)
 │                training thread: queues the records (Sink.submit: no encoding, no I/O)
 │                jobprof-sink thread, every 0.1 s: one line per iteration appended to data/raw.<first iter>.jsonl
 │                   then (export inline: ≤1% duty; background: at exit, 0.25 s, then the exporter) ─> WriterSpec.render(ctx) ─> summary/, timeline/
 │                                                  └─> jobprof_timeline(ctx, timeline) ─> timeline/msprof_*
 │                                                  └─> jobprof_iteration_spans, jobprof_iteration_facts (iterations with operators; kept for facts)
 │                exit / SIGTERM / uncaught exception ─> jobprof_session_end(session)
 │                   then (not after SIGTERM) jobprof_rank_facts, jobprof_diff_tables ─> data/facts.<id>.json
 │
 jobprof export PROF_DIR   (any later time, any machine) ─> jobprof_aic_metrics(group), jobprof_configure(recorded config),
                                                              jobprof_writers(it) of those not answering False ─> render(ctx),
                                                              jobprof_timeline(ctx, timeline),
                                                              then jobprof_rank_facts, jobprof_diff_tables per device ─> facts files
 jobprof summary | report | diff PROF_DIR  ─> jobprof_iteration_spans(iteration, streams) per iteration not yet done,
                                             jobprof_rank_facts(profile, device) per rank without a facts file,
                                             jobprof_report_sections(profile), jobprof_breakdown_sources()
 jobprof diff A B          ─> jobprof_diff_tables(profile, device) per device without a facts file
 jobprof plugins           ─> jobprof_options_schema(), jobprof_writers(None)
 jobprof check             ─> jobprof_options_schema(), jobprof_configure(config)
```

| phase | hook | process | thread | how often |
|---|---|---|---|---|
| registration | `jobprof_options_schema()` | every process with `PROFILING_MODE=true`; `jobprof check`, `plugins` | main, at interpreter start | once per process (see [3.1](#31-jobprof_options_schema-registration)) |
| configure | `jobprof_configure(config)` | same, once the options are valid; `jobprof check` | main, at interpreter start | once per process |
| collection | `jobprof_session_start(session)` | the profiled process, when it imports torch | the thread that imported torch | once, active plugins only |
| collection | `jobprof_iteration_end(session, iteration)` | the profiled process | the thread that ended the iteration; at exit, the main thread | once per iteration, in order |
| collection | `jobprof_session_end(session)` | the profiled process | main thread: atexit, or the SIGTERM handler | once, active plugins only |
| export | `jobprof_aic_metrics(name)` | the profiled process (at its first export); `jobprof export` | training thread / CLI | once per export (firstresult: the first answer owns the group) |
| export | `jobprof_writers(config)` | the profiled process (at the first iteration); `jobprof export`; `jobprof plugins` | training thread / CLI | once per process |
| export | `WriterSpec.render(ctx)` | the profiled process; `jobprof export` | the `jobprof-sink` thread / CLI | once per file |
| export | `jobprof_timeline(ctx, timeline)` | the profiled process; `jobprof export` | the `jobprof-sink` thread / CLI | once per iteration |
| reporting | `jobprof_iteration_spans(iteration, streams)` | the profiled process (an iteration with operators, as it is rendered); `jobprof summary`, `report`, `diff` for the others | the `jobprof-sink` thread / CLI | once per stored iteration and rank |
| reporting | `jobprof_iteration_facts(iteration, streams)` | the profiled process and `jobprof export` (an iteration with operators, as it is rendered); for the others, wherever `jobprof_rank_facts` reads them | the `jobprof-sink` thread / CLI / worker | once per stored iteration and rank |
| reporting | `jobprof_rank_facts(profile, device)` | the profiled process at exit; `jobprof export`; `summary`, `report` (or their `--jobs` / Dask workers) | main thread at exit / CLI / worker | once per device reduced |
| reporting | `jobprof_report_sections(profile)` | `jobprof summary`, `report`, `diff` | CLI | once per command |
| reporting | `jobprof_breakdown_sources()` | `jobprof summary`, `report` | CLI | once per command |
| reporting | `jobprof_diff_tables(profile, device)` | the profiled process at exit; `jobprof export`; `jobprof diff` (or its `--jobs` / Dask workers) | main thread at exit / CLI / worker | once per device reduced |

The split between **collection** (in the training process, as cheap as possible, raw records
only) and **export** (rendering files from those records, off the critical path) is the heart of
the design: it keeps the job fast, keeps finished iterations on disk when the job is killed, and
lets `jobprof export` regenerate every file later.

Details behind the rules of CONTRIBUTING.md section 2:

- **Raw data layout**: the core writes one JSON line per finished iteration,
  `{"index": 3, "streams": {"iteration": [...], "gc": [...]}}`, to segment files
  `device_<id>/data/raw.<first iteration:09d>.jsonl` (up to 100 iterations each). The training
  thread only queues the records; the `jobprof-sink` thread encodes and appends the queued
  iterations with one `write()` every 0.1 s, so an iteration is on disk,
  whole, within 0.1 s of the hook returning (at exit, SIGTERM or an uncaught exception, at once).
  Read them back with `read_raw(device_dir)` from `jobprof.plugin`: it yields
  `(index, {stream: records})` in order and leaves out the core's `ops` stream (a writer reads
  operators with `ctx.records("ops")`); bad lines go to the optional `problem(text)` callback.
- **Imports**: writers, timeline hooks and the callables a `jobprof_iteration_end` defers run on
  the `jobprof-sink` thread, which must import nothing: import what they need in
  `jobprof_session_start` (or at module level, if cheap). A first import there can deadlock with a
  SIGTERM that lands inside an import of the main thread at exit (torch's exit handlers import);
  jobprof then gives up on that thread after 1 s, and the raw data it held is lost.
  `tests/test_faults.py::test_the_exporting_thread_imports_nothing` checks jobprof's own plugins
  with an audit hook (`sys.addaudithook`, event `import`, on the thread named `jobprof-sink`).
- **Timestamps**: convert raw `time.monotonic_ns()` values at export with `ctx.to_us(ns)` (a
  timeline `ts`: µs since the job's time base, exact to the ns) and `ctx.dur_us(start_ns, end_ns)`
  (a timeline `dur`, from the integer ends: never `to_us(end) - to_us(start)`; then spans that
  nest in ns nest in Perfetto too — the rule is in `core/plugin/clock.py`), or
  `ctx.stamp_cell(ns)` (a CSV cell: exact epoch µs with 3 decimals and the TAB msprof appends, or
  `N/A` for None; `ctx.stamp(ns)` without the TAB).
- **Records from other processes** (a collector running in DataLoader workers or other helper
  processes of the job) travel over the API's `channel` (`from jobprof.plugin import channel`):
  the owner opens a `channel.Receiver(name, on_message)` before it starts the helpers
  (`on_message(data, peer)` gets each packet and the sender's `Peer`), a helper opens
  `channel.Sender.for_owner(name)` from the inherited
  `JOBPROF_<NAME>_CHANNEL` variable. The receiver accepts only peers with the owner's uid that
  descend from it (`SO_PEERCRED`) and counts what it refuses (`refused`, `first_refused`) and what
  `on_message` rejects (`malformed`). Treat every packet as hostile all the same: parse it into a
  frozen attrs record in `on_message`, raise `ValueError` for anything out of shape or range (the
  channel counts it), and report the counts once at `jobprof_session_end` (see
  `plugins/dp/fetch.py`).
- **Files**: writers never open files. A report or diff hook reads a profile's files (rendered
  CSVs from `profile.summary_files(device, name)`) with `profile.open_text(path)`: anything but a
  regular file (a FIFO or device someone left in a profile) raises `OSError` instead of blocking
  the command forever; say what you left out with `profile.problem(text)` (shown once, after the
  command's output). The core writes every file (a writer returns text): no planted link is
  followed, folders are created 0750 and files 0640.

## 3. The hooks

One function each, in lifecycle order: when it is called, its arguments, what it returns, what
is checked, an example.

## 4. Streams other plugins read: declared records

A stream is its owner's private format until a second reader appears. Once another plugin (or
the core) reads it, its record type is declared in the contract (`jobprof.plugin.records`, exported
by `jobprof.plugin`: an attrs class with `STREAM`, `VERSION`, a tolerant `from_raw` that returns
None for a record not shaped right, and `to_raw`): the owner writes `to_raw()`, every reader goes
through `jobprof.plugin.records_of(ctx_or_streams_or_profile, RecordType)` (or
`profile.typed(RecordType)`), which skips what does not parse instead of crashing. The declared
ones today: `CollectiveRecord` (hccl), `StepPointsRecord` (training_trace), `TxRecord` (msproftx),
`BatchRecord` / `WorkerFetchRecord` (dp), `CompiledGraphRecord` with its `FusedKernel` items
(fusion_op: task_trace gives a compiled graph's tasks its Model ID through them). A stream only its
owner reads keeps its record class in the plugin (dp's loader records, fusion_op's compile
counters). Never read another plugin's records by field names you guessed, and never import another
plugin: propose a declaration instead. Changing a declared record's fields means a new `VERSION`
with `from_raw` still reading the old one.

## 5. Types

jobprof ships `py.typed`: annotate hooks with the names `jobprof.plugin` exports
(`PluginSession`, `Config`, `Iteration`, `ExportContext`, `Timeline`, `Profile`, ...), and run
your type checker against the installed jobprof: it then flags anything past the contract. The built-in plugins are checked this way by `.ci/typecheck` (mypy).

## 6. When a plugin breaks

A broken plugin is **disabled** for the rest of the process, **reported once by name** on stderr
(and in `info.json`'s `messages`), and **the job continues** with the other plugins:

```
jobprof: warning: plugin 'gpu_temp' disabled: jobprof_iteration_end raised RuntimeError: sensor unplugged (gpu_temp.py:40)
```

| what | what happens |
|---|---|
| the module fails to import (`ImportError`, any exception, `SystemExit`) | `cannot import 'jobprof_gc': ModuleNotFoundError: ...`; disabled |
| a misspelled hook (`jobprof_iteration_ends`) | `implements unknown hook(s): jobprof_iteration_ends (did you mean jobprof_iteration_end?)`; disabled at load |
| an argument the hook does not have (`def jobprof_iteration_end(session, iteration, batch)`) | disabled at load |
| a hook function without `@hookimpl` | a warning that it is never called; the plugin stays active |
| an exception (or `sys.exit()`) in any hook | `<hook> raised <Type>: <message> (<file>:<line>)`; during collection its own `jobprof_session_end` runs once (best effort) so its collectors are uninstalled, then no hook of the plugin is called again; files of the iterations it finished are kept |
| a writer's `render` raises | `writer '<name>' raised ...`; disabled, its writers stop |
| an invalid schema fragment, a dangling `$ref` | disabled before the options are validated; the options are composed without it |
| records that are not JSON-serialisable | `stream '<stream>' is not JSON-serialisable: ...`; that stream is not stored and the plugin is disabled; other streams of the iteration are stored |
| a result of the wrong shape (not a dict of lists, not `WriterSpec`s), a stream named `iteration` or owned by another plugin | `<hook> returned ...`; disabled |
| two distributions register the same entry-point name | the built-in (distribution `jobprof`) wins, else the first on `sys.path`; the other is failed |

Consequence for your option keys: when your plugin is not loaded (broken before validation, or
disabled), its keys are unknown, and options that use them are invalid. As for any invalid
options, the job then runs **unprofiled**, with a message naming the plugins not loaded
(`JOBPROF_STRICT=1` makes it exit instead). `jobprof check --options '...'` shows it ahead of time.

`JOBPROF_DISABLE_PLUGINS=gc,other` disables plugins by name: they are never imported, and
`jobprof plugins` lists them as `disabled`. Remove their keys from `PROFILING_OPTIONS` too.
`jobprof plugins` shows every plugin's status with the first error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

if TYPE_CHECKING:
    from jobprof.plugin.results import DiffTable, Section
    from jobprof.plugin.session import PluginSession
    from jobprof.plugin.timeline import Timeline
    from jobprof.plugin.values import (
        JSON,
        Config,
        ExportContext,
        Iteration,
        MetricSet,
        PartSource,
        Spans,
        Streams,
        StreamsOut,
        WriterSpec,
    )
    from jobprof.plugin.views import Profile

PROJECT = "jobprof"
hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate plugin functions with this: ``@jobprof.plugin.hookspec.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)


@attrs.frozen
class Answer:
    """One implementation's non-None result, as a hook wrapper sees it: who answered, and the
    value after the hook's contract check (e.g. a generator of WriterSpec already listed)."""

    plugin: str
    value: Any


@hookspec
def jobprof_options_schema() -> Mapping[str, Any] | None:
    """Return the JSON Schema fragment for the option keys this plugin reads.

    - **When**: right after plugins are loaded, before `PROFILING_OPTIONS` is validated, in every
      process started with `PROFILING_MODE=true`, and in `jobprof check` / `jobprof plugins`.
    - **Returns**: a JSON Schema (Draft 2020-12) object fragment with `properties` (one entry per
      option key) and optionally `allOf` (cross-key rules) and `$defs`; or None (no keys). Give every
      property a `default`. A new key is added to the options; a key the core already knows (an msprof
      key such as `hccl`) is refined, and your plugin is listed as the one collecting it. You may
      reference the core's `#/$defs/switch` (`"on"`, `"off"`, `""`) and `#/$defs/level` (`"on"`,
      `"off"`, `"l0"`, `"l1"`, `"l2"`, `""`).
    - **Checked**: an invalid schema, a `$ref` that resolves to nothing, or a `$defs` entry that
      clashes with an existing one disables the plugin; the options are then composed without it, and
      the hook may be called again on the remaining plugins. Return the same fragment every time, with
      no side effects.

    ```python
    @hookimpl
    def jobprof_options_schema():
        return {"properties": {"gpu_temp": {"$ref": "#/$defs/switch", "default": "off"},
                               "gpu_temp_period_ms": {"type": "integer", "minimum": 10,
                                                      "default": 100}}}
    ```
    """


@hookspec
def jobprof_configure(config: Config) -> bool | None:
    """Decide whether the plugin takes part in this run.

    - **When**: once the options are valid, with the frozen effective `Config` (every key of the
      composed schema, defaults filled in). Also in `jobprof check`, and by the exporter (the job's
      and `jobprof export`'s, with the recorded config) to know whose writers to ask: keep it a pure
      function of `config`.
    - **Arguments**: `config.get(key)`, `config[key]`, `config.is_on(key)` (a switch or level is
      enabled), `config.level(key)` (`off`/`l0`/`l1`/`l2`, `on` meaning `l1`), `config.explicit` (keys
      the user set), `config.output`.
    - **Returns**: `False` to stay inactive in this process (no session hook is called on an inactive
      plugin, and its `jobprof_writers` is not asked); `True` or `None` means active.

    ```python
    @hookimpl
    def jobprof_configure(config):
        return config.is_on("gpu_temp")
    ```
    """


@hookspec
def jobprof_session_start(session: PluginSession) -> None:
    """Install collectors.  Called once, when the profiled program has imported torch; in
    dynamic mode (``PROFILING_MODE=dynamic``) once per capture instead, at an iteration boundary
    in the middle of the run, with a session of its own (its ``jobprof_session_end`` follows
    at the capture's end): collectors must work on objects the program made before.

    - **When**: once, when the profiled program has imported torch (right after `import torch`
      completes, on the thread that imported it). Never in a process that does not import torch.
      The `PROF_` directory does not exist yet, and `session.device_id` is still None. In
      [dynamic mode](dynamic.md) a plugin of the operator tier is started once per capture
      instead: at an iteration boundary mid-run, on the training thread, with a session of its own
      (a new `PROF_` folder), its `jobprof_session_end` at the capture's end (on a helper thread).
      So install against what the program already made (its models, optimizers, process groups
      exist) and uninstall cleanly in `jobprof_session_end`: the next capture installs again.
    - **Arguments**: the session, typed `jobprof.plugin.PluginSession` (annotate your hook
      with it: the members below are the whole plugin API, and a type checker flags anything past
      them; the runtime object has internals you must not touch): `session.config`, `session.attach(name, obj)`,
      `session.attached(name)`, `session.when_imported(name, callback)` (calls `callback(module)` once
      the program imports module `name`, at once if it already has: how a plugin hooks into a library
      without importing it first), `session.on_root_module(listener, what="")` (called with every module
      first seen as an outermost forward, including those already seen; it runs before that forward's
      timestamp and its time is recorded as jobprof's, under `what` in `info.json`'s
      `own_startup_ms` when it precedes the first iteration), `session.record_own(start_ns, end_ns,
      what="")` (any other work of yours in the job's time, monotonic ns), `session.reporter`,
      `session.anchor` (the clock pair of this process), `session.set_info(key, value)` /
      `session.get_info(key)` (a JSON-serialisable fact in `info.json`'s `jobprof` section: record
      what export needs, e.g. a calibration, or why a source is unavailable), and `session.request_ops(shapes=False, cupti_metrics=())`:
      ask for every operator of every iteration. The core runs one capture (PyTorch's own profiler
      engine, Kineto) for all plugins that asked, at the most detail any of them needs, and stores
      the core stream `ops` per iteration (in the job as Kineto's own trace files under `data/kineto/`,
      read back into `OpRecord`s whenever an iteration is read: a plugin sees the records either way);
      read it at export with `jobprof.plugin.opview.view(ctx)` (an `OpView`: the operator tree, top-level operators and the tasks `op_summary` lists; built once per
      iteration and shared by every writer). Never start `torch.profiler` yourself: Kineto allows one
      session per process. `session.request_op_memory()`: when that capture runs (whoever asked, in
      any order), also record the allocators' allocations and frees (Kineto's memory profiling: the
      core stream `op_memory`, `MemoryEvent` records read back with the iteration's `ops`) and every
      module call, whose recorder `session.module_calls()` returns (`take(iteration)`: the calls that
      started in it as `[start_ns, end_ns, native thread id, module path]`; None when not
      recording); alone it starts nothing ([task_memory](plugins/task_memory.md) uses both).
    - **Returns**: nothing. Install collectors here; they must never raise into or print from the
      training loop.

    ```python
    @hookimpl
    def jobprof_session_start(session: PluginSession) -> None:
        session.set_info("gpu_temp", {"period_ms": session.config["gpu_temp_period_ms"]})
        session.attach("gpu_temp", TemperatureSampler(period_s=session.config["gpu_temp_period_ms"] / 1000))
    ```
    """


@hookspec
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut | None:
    """Hand over the raw records collected during ``iteration``.

    - **When**: after each finished iteration, in order, on the thread that ended it (where
      `optimizer.step()`, `backward()` or `jobprof.step()` ran). Iterations found from `backward()` or
      forward calls are tentative and confirmed in bursts (up to 16 at a time) or at exit, so a call
      can come some time after the iteration ended: pick your data by time. Keep it cheap: no file
      I/O, no formatting.
    - **Arguments**: the session and an `Iteration`: `index` (1, 2, ...), `start_ns`, `end_ns`
      (`time.monotonic_ns()` of this process), `method` (`explicit`, `optimizer_step`, `backward`,
      `forward`), `fp_start_ns`, `bp_end_ns` (automatic FP Start / BP End, or None), `skipped`
      (GradScaler skipped the step), `model_id` (4294967295, step mode).
    - **Returns**: `{stream_name: [record, ...]}` with JSON-serialisable records, or None. The core
      appends them to the iteration's raw line in `device_<id>/data/` and passes them to writers.
      Return an empty list rather than nothing when "no event" is the measurement (a deferred callable,
      below, that builds an empty list stores nothing).

    ```python
    @hookimpl
    def jobprof_iteration_end(session, iteration):
        return {"gpu_temp": session.attached("gpu_temp").take(iteration.start_ns, iteration.end_ns)}
    ```

    - **Deferred records** (what every built-in does): give a zero-argument callable instead of the
      list, and the core calls it on the `jobprof-sink` thread within 0.1 s, iteration by iteration in
      order, and before `jobprof_session_end` at exit. The training thread then pays only for creating
      the callable. Your collector keeps collecting meanwhile, so the callable must select by the
      iteration's end time and be safe against the threads that feed it (append to a
      `collections.deque` on the hot path, `popleft()` what ended by `end_ns` in the callable). An
      empty list stores nothing; a callable that raises disables the plugin.

    ```python
    @hookimpl
    def jobprof_iteration_end(session, iteration):
        return {"gpu_temp": functools.partial(session.attached("gpu_temp").take_until, iteration.end_ns)}
    ```
    """


@hookspec
def jobprof_session_end(session: PluginSession) -> None:
    """Uninstall collectors.  Called once at exit, on SIGTERM or after an uncaught exception.

    - **When**: once, at exit, on SIGTERM, or after an uncaught exception (never after SIGKILL). The
      last tentative iterations are confirmed (and handed over) first; records of an unfinished
      iteration are dropped: every finished one was already handed over.
    - **Returns**: nothing. Uninstall collectors; report what the user should know once.
    - A plugin that fails mid-run ([section 4](#6-when-a-plugin-breaks)) gets its own
      `jobprof_session_end` called once, best effort, just before it is disabled (during collection),
      so its collectors do not outlive it; no hook of it is called after that. Write it so that it works from any point of the run, and keep
      whatever your collectors leave installed harmless and bounded.

    ```python
    @hookimpl
    def jobprof_session_end(session):
        sampler = session.attached("gpu_temp")
        sampler.stop()
        if sampler.errors:
            session.reporter.warning(f"gpu_temp: {sampler.errors} unreadable samples (written N/A)")
    ```
    """


@hookspec
def jobprof_writers(config: Config | None) -> Iterable[WriterSpec] | None:
    r"""Describe the per-iteration files the plugin renders from raw records.

    - **When**: by the exporter: once in the profiled process (when the first iteration ends), and by
      `jobprof export` with the config recorded in `info.json` (None if it has none); by
      `jobprof plugins` with `config=None` (list every file the plugin can write). The core asks
      `jobprof_configure(config)` first and skips the writers of a plugin that answers False, in the
      job and in `jobprof export` alike: a writer does not check its own switch.
    - **Returns**: `WriterSpec` objects (a list or any iterable), or None. A `WriterSpec(name,
      extension, render, description="")` describes one file per iteration,
      `<name>_<device>_<model>_<iteration>.<extension>`; `name` matches `^[a-z][a-z0-9_]*$`,
      `extension` is `"json"` (to `timeline/`) or `"csv"` (to `summary/`).
    - **`render(ctx)`** returns the file's text, or None to write nothing for that iteration, or
      `{model_id: text}` for one file per model (graph mode: fusion_op writes a compiled graph's file
      under the graph's Model ID instead of the iteration's `4294967295`). It runs
      on the `jobprof-sink` thread in the profiled process and in the `jobprof export` process. `ctx`
      is an `ExportContext`: `device_id`, `iteration`, `pid`, `config`, `records(stream)` (the
      iteration's raw records of any stream, `[]` if absent), `to_us(ns)`, `dur_us(start_ns, end_ns)`, `stamp(ns)`,
      `stamp_cell(ns)`, `program`, and `csv(header, rows)`, which writes a summary file the way the
      built-ins do (`\n` line ends, quoting where needed). A writer that leaves something out of a
      file on purpose (task_trace capping an op-heavy iteration's timeline at `timeline_max_events`)
      appends one sentence to `ctx.notes`: never print from a writer; the core says each distinct
      sentence once per profile with the iterations it concerns (stderr at the job's end, `jobprof
      export`'s output) and records it in `info.json`'s `jobprof.export_notes`.

    ```python
    def render_csv(ctx):
        rows = [[ctx.stamp_cell(r["t_ns"]), r["celsius"]] for r in ctx.records("gpu_temp")]
        return ctx.csv(["Time(us)", "Temperature(C)"], rows)

    @hookimpl
    def jobprof_writers(config):
        return [WriterSpec("gpu_temp", "csv", render=render_csv)]
    ```
    """


@hookspec(firstresult=True)
def jobprof_aic_metrics(name: str) -> MetricSet | None:
    """Return the metric set of the ``aic_metrics`` group called ``name``, or None.

    - **When**: once per export (the profiled process, when it writes its first iteration; `jobprof
      export`), with the group the options chose: `aic_metrics` (`PipeUtilization` when the key is
      present but empty). Called whether or not your plugin is active.
    - **Returns**: a `MetricSet` when `name` is your group, else None. The first plugin that answers
      (built-ins first) owns the group. Its `columns` are appended to every `op_summary` row and
      `values(task, machine)` returns one value per column for a task (`N/A` where you have no
      source). `task` is a `jobprof.plugin.Task`: `name`, `op_type`, `core_type`, `start`, `dur`
      (ns), `shapes`, `dtypes`, `strides`, and computed on first use `flops`, `bytes_moved` ((read,
      written) bytes) and `outputs`; `machine` is the calibration recorded in `info.json` (measured
      peak FLOP/s and memory bandwidth), empty when none was made. Set `needs_shapes` (the capture
      then records input shapes), `needs_peaks` and `sources` (column → where its value comes from).
    - A group is a plugin of its own: make it active only for its name (`jobprof_configure`), ask for
      operators with shapes in `jobprof_session_start`, and answer the hook for your name only (None
      for any other: the hook is firstresult, built-ins first). The built-in groups are one plugin,
      `aic_metrics` (`plugins/aic_metrics/`): a table `GROUPS` with one module per group. A third-party group adds
      its name to the values `aic_metrics` accepts with the fragment
      `{"properties": {"aic_metrics": {"enum": ["<group>"]}}}` (for this key an `enum` widens the
      accepted values instead of narrowing them).

    ```python
    from jobprof.plugin import NA, MetricSet, hookimpl

    GROUP = "Intensity"


    def _values(task, machine):
        moved = task.bytes_moved
        if task.flops is None or not moved or not sum(moved):
            return [NA]
        return [f"{task.flops / sum(moved):.3f}"]  # FLOPs per byte moved


    @hookimpl
    def jobprof_options_schema():
        return {"properties": {"aic_metrics": {"enum": [GROUP]}}}


    @hookimpl
    def jobprof_configure(config):
        return config.get("aic_metrics") == GROUP


    @hookimpl
    def jobprof_session_start(session):
        session.request_ops(shapes=True)


    @hookimpl
    def jobprof_aic_metrics(name):
        if name == GROUP:
            return MetricSet(GROUP, ["arith_intensity(FLOP/B)"], _values,
                             sources={"arith_intensity(FLOP/B)": "FLOPs / bytes, both from input shapes"})
    ```
    """


@hookspec
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    """Add this plugin's tracks to the iteration's master timeline, ``msprof_*.json``.

    - **When**: once per iteration, right after the writers, wherever files are rendered (the
      `jobprof-sink` thread of the profiled process, and `jobprof export`). The core owns the master
      timeline `timeline/msprof_<dev>_<model>_<iter>.json`; every plugin may add tracks to it.
    - **Arguments**: the same `ExportContext` the writers get (also `ctx.program`, the script's name),
      and a `jobprof.plugin.Timeline`: `timeline.process(name, label="CPU", sort_index=None)` returns
      the pid of that process in this file (same name → same pid, so plugins can share a process;
      `label` is `"CPU"` for host-side data or `jobprof.plugin.device_label(ctx.device_id)` for the
      device), `timeline.thread(pid, tid, name)` names a track, `timeline.add(events)` appends Chrome
      trace events (`ts` from `ctx.to_us(ns)`, `dur` from `ctx.dur_us(start_ns, end_ns)`). A plugin
      with thousands of events per iteration passes `timeline.add_text([jobprof.plugin.events_text(events)])`:
      the same events encoded together by orjson, ~4x faster than one by one (task_trace does).
    - **Returns**: nothing. Add nothing when your stream is absent. Events on one (pid, tid) must nest
      (viewers reject partial overlap): put overlapping work on separate tids —
      `jobprof.plugin.assign_lanes(spans)` gives each `(start, end)` span the lowest lane on which it
      nests, `lane_tid(track, lane)` / `lane_name(name, lane)` the tid and name of that lane (the
      msproftx and hccl plugins draw their tracks this way). Take pids only from `timeline.process`
      and keep tids below `jobprof.plugin.timeline.PID_BASE` (2³¹): OS thread ids, small numbers, and
      for a track of your own in a process that also holds OS-thread tracks, `SYNTHETIC_TID` (2³⁰) and
      up — the track rule of `core/plugin/timeline.py`, without which Perfetto puts your slices on another track.
      Flow events need an integer `id` and an `f` with `"bp": "e"`. The file is written only
      if some plugin added an event; it is validated by `schemas/timeline.json` in jobprof's tests, and
      `python tests/perfetto_check.py FILE` shows what Perfetto's own importer makes of it.

    ```python
    @hookimpl
    def jobprof_timeline(ctx, timeline):
        temps = ctx.records("gpu_temp")
        if temps:
            pid = timeline.process("GPU temperature")
            timeline.add({"name": "temp", "ph": "C", "pid": pid, "tid": 0, "ts": ctx.to_us(t["t_ns"]),
                          "args": {"C": t["celsius"]}} for t in temps)
    ```
    """


@hookspec
def jobprof_iteration_spans(iteration: Iteration, streams: Streams) -> Spans | None:
    """Return where one iteration's time went, as ``{category: [(start_ns, end_ns), ...]}``.

    - **When**: once per stored iteration, with that iteration's raw streams (`{stream: records}`):
      in the profiled job, on its exporter thread, as an iteration with operators is rendered (the
      facts file written at exit keeps the result), and by `jobprof summary` / `report` / `diff` for
      the other iterations of each selected rank. So it must be a pure function of its arguments.
    - **Returns**: `{category: [(start_ns, end_ns), ...]}` in the profiled process's
      `monotonic_ns`, or None. The core paints the iteration with every plugin's spans into six
      parts that add up to the iteration time (the core's breakdown): its own hand-over time first
      (the core's `profiler` stream), then `data_wait`, then
      communication not overlapped (`communication` minus `compute`; `communication_blocking` when no
      plugin reports `compute`), `forward_backward`, `refresh`, and `free` (the rest). A part no plugin
      reports is `N/A`. Built-ins: dp gives `data_wait`, hccl `communication` and
      `communication_blocking`, task_trace `compute`, training_trace the two phases.

    ```python
    @hookimpl
    def jobprof_iteration_spans(iteration, streams):
        waits = [(r["t0"], r["t1"]) for r in streams.get("my_loader", ())]
        return {"data_wait": waits} if "my_loader" in streams else None
    ```
    """


@hookspec
def jobprof_iteration_facts(iteration: Iteration, streams: Streams) -> JSON:
    """Return this plugin's small digest of one iteration, for its `jobprof_rank_facts`.

    The map step below `jobprof_rank_facts`, for facts that need the operator windows
    (`ops`, `op_memory`), whose decoding costs as much as rendering them: the exporter calls
    it on each iteration with operators as it renders it (in the profiled job and in `jobprof
    export`, the streams already decoded) and keeps the answer, so the facts written after
    decode no window again.  Read the digests back in `jobprof_rank_facts` with
    `profile.iteration_facts(<plugin name>, device, <this function>)`, which calls the function
    itself on an iteration nothing kept.  A pure function of its arguments; return JSON-ready
    data, a few hundred bytes (the job keeps one per iteration until it exits), or None for an
    iteration without your data.

    Example:

    ```python
    @hookimpl
    def jobprof_iteration_facts(iteration, streams):
        ops = streams.get("ops") or []
        return {"mm_ns": sum(r.dur for r in ops if r.name == "aten::mm")} if ops else None
    ```
    """


@hookspec
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    """Return this plugin's aggregates of one device, for its report sections to combine.

    - **When**: once per device, wherever that device is reduced: by the exporter at the job's exit
      and by `jobprof export` (the answer is kept in `device_<id>/data/facts.<id>.json`), or by
      `jobprof summary` / `report` for a device without a valid facts file (or with `--iterations`):
      in the command's process, in a worker process (`--jobs N`) or on a Dask worker
      (`--engine dask`). The `profile` holds that one device.
    - **Returns**: JSON-ready aggregates of that device alone (dicts with `str` keys, lists, str,
      numbers, bool, None), or None when it has none of your data. Whatever you return comes back as
      JSON gives it back (a tuple as a list, no NaN; anything else fails the plugin by name), the
      same in every process.
    - **Read it back** in `jobprof_report_sections` with `profile.facts("<your plugin name>", device,
      <your function>)`: the gathered answer when the command gathered facts, else your function
      called on the spot (a `Profile` made by hand, an older facts file from before your plugin was
      installed), so the section is one code path. Combine across devices there, in
      `profile.devices` order.
    - **Why**: at 1,000 ranks a command that reads every raw record takes tens of minutes; with
      facts it reads one small file per rank. Keep facts small (aggregates, not records): a summary
      holds every device's at once. A plugin without this hook still works: its section reads the
      raw data as before, on one core.

    ```python
    @hookimpl
    def jobprof_rank_facts(profile, device):
        temps = [r["celsius"] for r in profile.records("gpu_temp", device)]
        return {"max_c": max(temps), "samples": len(temps)} if temps else None


    @hookimpl
    def jobprof_report_sections(profile):
        per_device = {d: profile.facts("gpu_temp", d, jobprof_rank_facts) for d in profile.devices}
        hottest = max((f["max_c"] for f in per_device.values() if f), default=None)
        return None if hottest is None else [Section("GPU temperature", ["max °C"], [[hottest]], key="gpu_temp")]
    ```

    **Facts that need the operator windows.** Reading `ops` (or `op_memory`) in `jobprof_rank_facts`
    decodes every operator window again, which costs as much as rendering them, at the job's exit.
    Split such facts in two: `jobprof_iteration_facts(iteration, streams)` returns a small JSON-ready
    digest of one iteration (a pure function of its arguments, a few hundred bytes: the job keeps one
    per iteration until it exits); the exporter calls it on each iteration with operators as it
    renders it and keeps the answer. `jobprof_rank_facts` then reads the digests with
    `profile.iteration_facts("<your plugin name>", device, <that function>)`, `(iteration, digest)`
    pairs: the kept ones without reading a window, the others computed on the spot
    ([task_memory](plugins/task_memory.md) does this).

    ```python
    @hookimpl
    def jobprof_iteration_facts(iteration, streams):
        ops = streams.get("ops") or []
        return {"mm_ns": sum(r.dur for r in ops if r.name == "aten::mm")} if ops else None


    @hookimpl
    def jobprof_rank_facts(profile, device):
        per_iteration = dict(profile.iteration_facts("matmul", device, jobprof_iteration_facts))
        return {"mm_ns": sum(d["mm_ns"] for d in per_iteration.values())} if per_iteration else None
    ```
    """


@hookspec
def jobprof_report_sections(profile: Profile) -> Iterable[Section] | None:
    """Return tables describing a profile, for ``jobprof summary``, ``report`` and ``diff``.

    - **When**: once per `jobprof summary`, `jobprof report` or `jobprof diff` command.
    - **Arguments**: a `jobprof.plugin.Profile` (a protocol: what the command passes satisfies
      it), a read-only view of the `PROF_` directory that already
      follows the user's `--rank` / `--iterations`: `profile.devices`, `profile.rank(device)`,
      `profile.iterations(device)` (`Iteration` objects), `profile.records(stream, device=None)` (every
      raw record, tagged with `_device` and `_iteration`), `profile.typed(RecordType, device=None)`
      (a declared stream's records as `(device, iteration, record)`), `profile.streams(device)` (each
      iteration's streams together, for list-shaped records), `profile.summary_files(device, name)`
      (the selected iterations' rendered CSVs, read with `profile.open_text(path)`), `profile.info(device)`,
      `profile.folder(device)`, `profile.facts(...)` (3.11), `profile.problem(text)` (report a file you
      could not read, once). Read through it,
      not the raw files directly, so the selection holds; the first full pass keeps the small streams in
      memory, so several plugins reading them cost one pass. Anything you compute per device belongs in
      `jobprof_rank_facts` ([3.11](#311-jobprof_rank_factsprofile-device-reporting)): a section that reads raw records costs a pass over every rank.
    - **Returns**: `Section(title, headers, rows, notes=(), key="", findings=(), chart=())` objects, or None when
      there is nothing to show. `key` names the section in `summary --json` (a slug of the title when
      empty); column keys are slugs of the headers (`"total ms"` → `total_ms`), so keep headers stable.
      Cells may be numbers or text; `"N/A"` becomes `null` in JSON. `findings` are `Finding(key, text,
      evidence={...}, weight=1..3)`: one concrete sentence with the numbers it rests on (also in
      `evidence`, for machines); the report numbers every plugin's findings with the core's, heaviest
      first. Sections appear in `jobprof summary`, in the HTML report as tables, and in `--json`.
      `chart` names columns the report draws as lines over the first column when it holds an
      iteration number (a value per iteration).

    ```python
    @hookimpl
    def jobprof_report_sections(profile):
        temps = [r["celsius"] for r in profile.records("gpu_temp")]
        if not temps:
            return None
        hot = [Finding("gpu_hot", f"the GPU reached {max(temps)} °C", {"max_c": max(temps)}, weight=2)]
        return [Section("GPU temperature", ["max °C"], [[max(temps)]], key="gpu_temp",
                        findings=hot if max(temps) > 85 else ())]
    ```
    """


@hookspec
def jobprof_diff_tables(profile: Profile, device: int) -> Iterable[DiffTable] | None:
    """Return this plugin's tables for ``jobprof diff``: counts per key on one device.

    - **When**: once per device, wherever its facts are computed (as `jobprof_rank_facts`, [3.11](#311-jobprof_rank_factsprofile-device-reporting)): by
      the exporter at the job's exit and by `jobprof export`, which keep your tables in the device's
      facts file (the core turns them to JSON: `DiffTable.to_plain` / `from_plain`), or by `jobprof
      diff A B` for a device without a valid facts file (or with `--iterations`), in its process or a
      worker. `profile` holds that device (it follows `--rank` / `--iterations`).
    - **Returns**: `jobprof.plugin.DiffTable` objects, or None. A table has a stable `key`
      (its name in `diff --json`), its key `columns` and `headers`, and one `DiffCount(calls, time,
      bytes=None, series=None)` per key (an operator type, a collective, a kernel). The core pools the
      ranks, normalises per iteration of one rank, compares A with B (`slower` / `faster` /
      `unchanged` / `new` / `gone`) and prints the table; a key belongs to the first plugin that
      returns it. On a device without your data return the table with `present=False` and no rows,
      so the diff can say which side lacks it (`absent_note`, `one_sided_note`). The built-in tables
      come this way too: task_trace's operator types (`plugins/task_trace/diff.py`) and hccl's
      collectives (`plugins/hccl/diff.py`); the core parses no plugin's fields.

    ```python
    @hookimpl
    def jobprof_diff_tables(profile, device):
        calls, ns = {}, {}
        for r in profile.records("gpu_kernels", device):
            calls[r["name"]] = calls.get(r["name"], 0) + 1
            ns[r["name"]] = ns.get(r["name"], 0) + r["end_ns"] - r["start_ns"]
        return [DiffTable("kernels", "Kernels per iteration of one rank ({shown} of {total})",
                          ["kernel"], ["kernel"], {(k,): DiffCount(calls[k], ns[k]) for k in calls},
                          present=bool(calls), one_sided_note="only one side has kernel data")]
    ```
    """


@hookspec
def jobprof_breakdown_sources() -> Iterable[PartSource] | None:
    """Name the parts of the iteration breakdown this plugin measures.

    - **When**: by `jobprof summary` / `report`, once per command.
    - **Returns**: `jobprof.plugin.PartSource(part, unseen)` objects, one per part of the
      iteration breakdown (`data_wait`, `communication_not_overlapped`, `forward_backward`, `refresh`: section 3.9) whose spans you report through
      `jobprof_iteration_spans`, or None. When that part is N/A on a rank, the summary's "missing"
      list says why with your plugin's name: "<plugin> was off" when the run did not have it active,
      else "<plugin> was on but <unseen>".

    ```python
    @hookimpl
    def jobprof_breakdown_sources():
        return [PartSource("data_wait", "no DataLoader was seen")]
    ```
    """
