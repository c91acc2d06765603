"""A profile written now has the same shape as one written before the package restructure.

Each case runs a fixed deterministic job under PROFILING_MODE=true (a subprocess: this test
imports nothing from jobprof, whose module paths change) and compares
``profile_shape.shape(output)`` (every file, header, row, timeline event, key and format, with
timestamps, durations, OS ids and other run-dependent values masked: see the rules in
tests/profile_shape.py) with the golden ``tests/data/same_output_<case>.json``.

The goldens were made from commit 71c970e, the last commit before the restructure, with that
commit's own examples/ scripts, on a CPU VM without cache counters (so l2 writes no file; a
machine with LLC counters adds l2_cache files and fails the ``l2`` case honestly).  To
regenerate one (only for an intended output change; say why in the commit):

    PROFILING_MODE=true PROFILING_OPTIONS='{"output": "/tmp/so", ...options of CASES[case]...}' \\
        python examples/train_mlp.py --steps 3 --workers 0        # or the torchrun line for ddp
    python tests/profile_shape.py --write tests/data/same_output_<case>.json /tmp/so

and check that three runs give the same file (``--print`` and diff them).

Intended changes since 71c970e, edited in by hand (only these keys; every file, row and event
is still the old version's):

- the eight ``aic_*`` metric-group plugins became one plugin, ``aic_metrics``, so info.json's
  list of active plugins names it instead of ``aic_pipe_utilization``;
- two new options appear among the effective options of info.json: ``fusion_op`` (``on``) and
  ``timeline_max_events`` (500000); the fusion_op plugin is active wherever task_trace is
  (the mlp case), though a job that compiles nothing gets no fusion_op file, stream or
  info section;
- info.json's ``export_notes`` (what writers left out, e.g. a capped timeline): ``[]`` here;
- each device's ``data/facts.<id>.json`` (the rank reduced for ``summary`` / ``report``, written
  at exit), described by rule 7 of tests/profile_shape.py: its keys and which plugins were asked
  and answered.
- issue 28 (one operator path on every torch): info.json's ``disabled`` (what stopped working
  mid-run: ``[]`` here); in the mlp case the raw ``ops`` stream holds references to Kineto's own
  window files (``data/kineto/window.<n>.json.gz``, rule 8) instead of inline records (before,
  aic_metrics' FLOP cross-check forced the in-memory path).  Every CSV and timeline is unchanged.
- issue 31 (the job ends when it ends): the new options ``export`` (``background``) and
  ``task_trace_every`` (``1``) among the effective options of info.json.
- issue 32 (memory): the new plugin ``task_memory`` answers ``jobprof_rank_facts``, so the facts
  files name it among the plugins asked (it is off here and answers nothing).
- the exporter's modules are imported at the first root forward (the exporting thread imports
  nothing): info.json's ``own_startup_ms`` gains ``exporter modules``, and in the mlp case, where
  that forward lies in iteration 1, its raw line holds one more ``profiler`` span (4, not 3).
- issue 34 (msprof's tools): info.json's ``DeviceInfo`` gains ``compute_units``, ``aiv_num`` (0),
  ``ai_core_num`` and ``aic_frequency`` (machine facts, masked by rule 3); the step_trace
  timeline's span args are in ns as CANN writes them (``Iteration Time(ns)``, ``FP_BP Time(ns)``,
  ``Iteration Refresh(ns)``; the CSV columns stay in µs).
- issue 35 (the first hour): ``aic_metrics`` answers ``jobprof_rank_facts`` (its group per
  operator type for summary/report): the facts files name it among the plugins asked, and the
  mlp case, where PipeUtilization is on, among those that answered.

- issue 47 (a huge iteration must not hold the exit): with the default export a job's operator
  windows are decoded by its background exporter, not at its exit, and how many its own thread
  rendered before depends on timing; so the mlp case sets ``export`` ``inline`` (the effective
  option in info.json reads ``inline``, and ``explicit`` names ``export``): every file is
  rendered in the job, as before.
- issue 48 (the calibration cached per machine): info.json's ``calibration`` gains where its
  peaks came from (``source``, ``cache_file``, ``measured_at``, ``cache_note``,
  ``other_cpu_share``), masked whole by rule 3 (a run measures or reads the cache by what
  ran before it).
- issue 49 (every msprof option collects): the new plugins ``host_sys`` and ``runtime_api``
  answer ``jobprof_rank_facts`` (named among the plugins asked; off here, they answer nothing),
  and ``host_sys_usage_freq`` (msprof's default, ``50``) is among the effective options.
- issue 48 (start-up measured whole): info.json's ``bootstrap_ms`` (jobprof's imports, plugins
  and options before the session began), masked by rule 3.

Cases:
- ``mlp``: examples/train_mlp.py, 3 steps, no DataLoader workers (with workers, the order of
  the workers' dp events is a race), with training_trace, task_trace, aicpu, aic_metrics
  PipeUtilization, msproftx, l2 and dp on: every tier that runs on one CPU process.
- ``ddp``: examples/train_ddp.py, 3 steps, 2 gloo ranks under torchrun, training_trace, hccl and
  msproftx on, task_trace off (with task_trace on, which gloo worker thread ran an op and the
  Overlap Analysis' Free / Communication(Not Overlapped) split differ run to run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from profile_shape import diff, dumps, shape

from conftest import REPO, Runner, torchrun

DATA = Path(__file__).resolve().parent / "data"

CASES = {
    "mlp": {
        "options": {"training_trace": "on", "task_trace": "on", "aicpu": "on",
                    "aic_metrics": "PipeUtilization", "msproftx": "on", "l2": "on", "dp": "on",
                    "export": "inline"},
        "script": "train_mlp.py", "args": ["--steps", "3", "--workers", "0"], "ranks": 0,
    },
    "ddp": {
        "options": {"training_trace": "on", "task_trace": "off", "hccl": "on", "msproftx": "on"},
        "script": "train_ddp.py", "args": ["--steps", "3"], "ranks": 2,
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_output(runner: Runner, case: str) -> None:
    spec = CASES[case]
    script = REPO / "examples" / spec["script"]
    # as JSON text: the runner adds nothing (a dict gets its "export": "inline"), so the job runs
    # with the defaults the goldens record
    options = json.dumps({"output": str(runner.out), **spec["options"]})
    if spec["ranks"]:
        script = torchrun(runner, script, spec["ranks"], *spec["args"])
        runner.run(script, options, timeout=120)
    else:
        runner.run(script, options, args=spec["args"], timeout=120)
    actual = shape(runner.out)
    golden_path = DATA / f"same_output_{case}.json"
    golden = json.loads(golden_path.read_text(encoding="utf-8"))
    if actual != golden:
        (runner.tmp / "shape.json").write_text(dumps(actual), encoding="utf-8")
        found = diff(golden, actual)
        pytest.fail(f"{case}: the profile's shape differs from {golden_path.name} (made from 71c970e); "
                    f"first differences:\n" + "\n".join(found)
                    + f"\nwhole shape of this run: {runner.tmp / 'shape.json'}", pytrace=False)
