"""An iteration of very many tiny operators (issue 29 item 10: 200k of them turned a 2.7 s job
into 123 s with the operator tier).  What it costs is measured in ``bench/`` (``bigop``); here,
what makes it cost once: each operator window is decoded once in the profiled process, and the
facts the job writes at exit are the ones the commands compute from its raw data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli

pytestmark = pytest.mark.torch_versions

# one iteration of N in-place negations between two ordinary ones; every decode of an operator
# window in this process is logged (the session's exporter and its exit-time facts alike)
BIG_ITERATION_JOB = """
import os, sys, torch
from jobprof.files import kinetotrace

log = open(os.environ["DECODE_LOG"], "a")
decode = kinetotrace.Windows._load

def counted(self, name, offset_ns, shapes):
    if name not in self._cache:
        log.write(name + "\\n"); log.flush()
    return decode(self, name, offset_ns, shapes)

kinetotrace.Windows._load = counted
n = int(sys.argv[1])
model, x = torch.nn.Linear(4, 4), torch.zeros(4)
for step in range(3):
    out = model(torch.randn(2, 4)).sum()
    if step == 1:
        for _ in range(n):
            x.neg_()
    out.backward()
print("done", float(x[0]))
"""


def test_a_big_iteration_decodes_each_window_once_and_keeps_the_same_facts(
        runner: Runner, tmp_path: Path) -> None:
    log = tmp_path / "decoded.txt"
    log.touch()
    script = runner.script(BIG_ITERATION_JOB)
    proc = runner.run(script, {"training_trace": "on", "task_trace": "on"}, args=["20000"],
                      env={"DECODE_LOG": str(log)}, timeout=300)
    assert "done" in proc.stdout
    decoded = log.read_text().split()
    assert decoded, "no operator window was read"
    # before: every window decoded again by the facts written at exit
    assert len(decoded) == len(set(decoded)), decoded
    device = runner.device_dir()
    summaries = sorted((device / "summary").glob("op_summary_*.csv"))
    assert [p.read_text().count("aten::neg_") for p in summaries] == [0, 20000, 0]
    # the facts written at exit (parts the exporter computed) = computed from the raw data
    from_facts = jobprof_cli("summary", "--json", str(device.parent))
    (device / "data" / "facts.0.json").unlink()
    from_raw = jobprof_cli("summary", "--json", str(device.parent))
    assert from_facts.returncode == from_raw.returncode == 0, from_raw.stderr
    assert json.loads(from_facts.stdout) == json.loads(from_raw.stdout)
    rows = json.loads(from_raw.stdout)["ranks"][0]
    assert rows["iterations"]["count"] == 3


def test_rendering_an_iteration_leaves_no_cycle_behind(runner: Runner, tmp_path: Path) -> None:
    """What the writers memoise refers back to the export context: before, every rendered
    iteration's operators stayed alive until Python's cyclic collector came by."""
    import gc

    from conftest import loaded_manager
    from jobprof.files import export, rawstore

    runner.run(runner.script(BIG_ITERATION_JOB), {"training_trace": "on", "task_trace": "on"},
               args=["2000"], env={"DECODE_LOG": str(tmp_path / "decoded.txt")}, timeout=300)
    device = runner.device_dir()
    meta = export.read_meta(device)
    writers = export.writers_for(loaded_manager(), meta.config)
    iterations = dict(rawstore.read(device))
    errors: list[str] = []
    # once first: the plugins import their writers and reports where first used, and an import
    # leaves the import machinery's cycles behind (once per process, not per iteration)
    assert export.render_iteration(device, meta, iterations[1], writers, lambda p, e: errors.append(e))
    streams = iterations[2]
    gc.collect()
    gc.disable()
    try:
        written = export.render_iteration(device, meta, streams, writers, lambda p, e: errors.append(e))
        found = gc.collect()
    finally:
        gc.enable()
    assert written and not errors
    assert found == 0, f"{found} objects were kept alive only by reference cycles"


# the exit-time export pauses Python's cyclic collector: what the program leaves in cycles is
# still collected (its finalizers print) exactly as unprofiled
CYCLE_AT_EXIT_JOB = """
import gc, torch

class Node:
    def __init__(self, name):
        self.name, self.peer = name, None
    def __del__(self):
        print("finalized", self.name, gc.isenabled(), flush=True)

model = torch.nn.Linear(4, 4)
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
a, b = Node("a"), Node("b")
a.peer, b.peer = b, a
del a, b
print("end of program", gc.isenabled(), flush=True)
"""


def test_the_programs_cycles_are_collected_at_exit_as_unprofiled(runner: Runner) -> None:
    script = runner.script(CYCLE_AT_EXIT_JOB)
    plain = runner.run(script, mode=None)
    profiled = runner.run(script, {"training_trace": "on", "task_trace": "on"})
    assert plain.stdout.splitlines() == ["end of program True", "finalized a True", "finalized b True"]
    assert profiled.stdout == plain.stdout
