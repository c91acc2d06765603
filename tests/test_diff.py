"""jobprof diff on real runs: a training loop (A), the same loop again (A2), and the loop with
known extra work per step (B: one large matmul more, so one ``mm`` call more per iteration, and
one ``bmm``, an operator type A never runs), with different iteration counts; a 2-rank gloo job
with and without one extra broadcast per step for the collectives and the per-rank matching."""

from __future__ import annotations

import io
import json
import math
import random
import re
from pathlib import Path

import pytest

from conftest import Runner, free_port, jobprof_cli
from distributions import make_dist
from jobprof.analysis import diff
from jobprof.analysis.selection import Selection
from jobprof.cli.diff import render
from jobprof.engine.manager import PluginManager
from jobprof.plugin.hookspec import hookimpl
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.results import DiffCount, DiffTable

ON = {"training_trace": "on", "task_trace": "on"}
STEPS_A, STEPS_B = 16, 24

# The batches are made before the loop, so every iteration runs the same operators; "extra" adds
# torch.mm on 1280x1280 matrices (4.2 GFLOP, over 10 ms here: far above the loop's own mm calls and
# any noise) and a small torch.bmm.
JOB = """
import sys, torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
steps, extra = int(sys.argv[1]), sys.argv[2] == "extra"
model = nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(4, 10), torch.randn(4, 1)) for _ in range(steps)]
big, small = torch.randn(1280, 1280), torch.randn(2, 8, 8)
for xb, yb in data:
    opt.zero_grad()
    nn.functional.mse_loss(model(xb), yb).backward()
    if extra:
        torch.mm(big, big)
        torch.bmm(small, small)
    opt.step()
"""

DDP = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn

def run(rank, port, steps, extra):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        dist.all_reduce(torch.ones(1000))
        if extra:
            dist.broadcast(torch.ones(250_000), src=0)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "extra"), nprocs=2)
"""


def _profile(factory: pytest.TempPathFactory, name: str, body: str, options: dict, args: list[str]) -> Path:
    runner = Runner(factory.mktemp(name))
    runner.run(body, options, args=args, timeout=300)
    [prof] = runner.prof_dirs()
    return prof


# another program: a small convolutional net (its time in operators JOB never runs)
OTHER = """
import torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [torch.randn(8, 3, 32, 32) for _ in range(12)]
for xb in data:
    opt.zero_grad()
    model(xb).sum().backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {"a": _profile(tmp_path_factory, "a", JOB, ON, [str(STEPS_A), "base"]),
            "a2": _profile(tmp_path_factory, "a2", JOB, ON, [str(STEPS_A), "base"]),
            "b": _profile(tmp_path_factory, "b", JOB, ON, [str(STEPS_B), "extra"]),
            "other": _profile(tmp_path_factory, "other", OTHER, ON, [])}


def test_fail_on_regression_is_an_exit_status_a_ci_job_can_gate_on(profiles: dict[str, Path]) -> None:
    """B with a 10 ms matmul per iteration more: exit 3 and one line saying by how much; the
    other way round (faster): 0; a limit above the change: 0; a bad limit: 2."""
    a, b = (str(profiles[k]) for k in ("a", "b"))
    slower = jobprof_cli("diff", a, b, "--fail-on-regression", "5")
    assert slower.returncode == 3, slower.stderr
    [line] = [x for x in slower.stderr.splitlines() if x.startswith("jobprof: regression:")]
    pct = float(line.split(" is ")[1].split("%")[0])
    assert pct > 5 and "(limit 5%)" in line
    assert jobprof_cli("diff", a, b, "--fail-on-regression", f"{pct + 1:.0f}").returncode == 0
    assert jobprof_cli("diff", b, a, "--fail-on-regression", "5").returncode == 0
    bad = jobprof_cli("diff", a, b, "--fail-on-regression", "-1")
    assert bad.returncode == 2 and "--fail-on-regression" in bad.stderr


def test_a_deeper_profile_is_not_a_regression_of_the_job(profiles: dict[str, Path],
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same program, A with the step tier only, B with the operator tier: B's iterations are
    longer by jobprof's own hand-over, which is never the job's time: the verdict says whose it is
    and the CI gate does not fail on it."""
    step_only = _profile(tmp_path_factory, "step_only", JOB, {"training_trace": "on", "task_trace": "off"},
                         [str(STEPS_A), "base"])
    proc = jobprof_cli("diff", str(step_only), str(profiles["a"]), "--fail-on-regression", "5")
    assert proc.returncode == 0, proc.stderr
    verdict = proc.stdout.splitlines()[3]
    assert verdict.startswith("B is ") and "slower" in verdict, verdict
    assert "in profiler (mean) (jobprof's own hand-over, not the job's" in verdict, verdict
    [note] = [x for x in proc.stderr.splitlines() if x.startswith("jobprof: note: B's median iteration")]
    assert "of the change is jobprof's own hand-over" in note and "not called a regression" in note


def test_two_different_programs_are_called_so(profiles: dict[str, Path]) -> None:
    """A convolutional net against the MLP job: a note, first, that they are not the same
    program; none for a rerun or for the same job with one more operator."""
    model = compare(profiles["a"], profiles["other"])
    assert model["notes"] and model["notes"][0].startswith("A and B do not look like the same program"), \
        model["notes"]
    # the side with the larger share in kinds the other never ran, its kinds largest first (both
    # sides are close to 100%: which one is larger depends on the run)
    note = model["notes"][0]
    assert ("of A's" in note and "linear" in note) or ("of B's" in note and "conv2d" in note), note
    for other in ("a2", "b"):
        notes = compare(profiles["a"], profiles[other])["notes"]
        assert not any("same program" in n for n in notes), notes


def compare(a: Path, b: Path, per_rank: bool = False, manager: PluginManager | None = None,
            **selection) -> dict:
    if manager is None:
        manager = PluginManager(Reporter())
        manager.load_entry_points()
    sel = Selection(**selection)
    return diff.compare(diff.load(a, sel, manager), diff.load(b, sel, manager), per_rank=per_rank)


def op(model: dict, name: str) -> dict:
    [row] = [r for r in model["operators"] if r["op_type"] == name]
    return row


def test_extra_work_is_named_with_its_calls(profiles: dict[str, Path]) -> None:
    model = compare(profiles["a"], profiles["b"])
    assert (model["a"]["iterations"], model["b"]["iterations"]) == (STEPS_A, STEPS_B)
    assert (model["a"]["op_statistic_files"], model["b"]["op_statistic_files"]) == (STEPS_A, STEPS_B)
    mm = op(model, "mm")
    # per iteration, although B ran more iterations: exactly one call more
    assert mm["delta_calls_per_iteration"] == pytest.approx(1.0)
    assert mm["a"]["calls_per_iteration"] == pytest.approx(round(mm["a"]["calls_per_iteration"]))
    assert mm["change"] == "slower" and mm["delta_ms_per_iteration"] > 0.5
    assert model["operators"][0]["op_type"] == "mm"  # the largest change comes first
    bmm = op(model, "bmm")
    assert bmm["change"] == "new" and bmm["a"] is None
    assert bmm["b"]["calls_per_iteration"] == pytest.approx(1.0)
    # the rest of the loop is the same program: same calls per iteration
    for row in model["operators"]:
        if row["op_type"] not in ("mm", "bmm"):
            assert row["a"] is not None and row["b"] is not None, row
            assert row["delta_calls_per_iteration"] == pytest.approx(0.0, abs=1e-9), row
    it = next(r for r in model["iteration"] if r["part"] == "iteration")
    assert it["change"] == "slower" and it["delta_ms"] > 0.5
    assert model["verdict"].startswith("B is ") and " slower per iteration" in model["verdict"]
    assert "top change: mm (slower)" in model["verdict"] and "→ " in model["verdict"]
    # the reverse direction reads as faster, mm's call gone per iteration, bmm gone
    back = compare(profiles["b"], profiles["a"])
    assert op(back, "mm")["change"] == "faster" and op(back, "bmm")["change"] == "gone"
    assert op(back, "mm")["delta_calls_per_iteration"] == pytest.approx(-1.0)


def test_same_program_twice_flags_nothing_large(profiles: dict[str, Path]) -> None:
    """A rerun: no operator appears or disappears, no call count moves, and nothing flagged comes
    near the size of the deliberate change (the machine is shared: small shifts may pass the
    thresholds, a change the size of B's extra matmul may not)."""
    model = compare(profiles["a"], profiles["a2"])
    deliberate = op(compare(profiles["a"], profiles["b"]), "mm")["delta_ms_per_iteration"]
    assert model["operators"]
    for row in model["operators"]:
        assert row["change"] not in ("new", "gone"), row
        assert row["delta_calls_per_iteration"] == 0, row
        if row["change"] != "unchanged":
            assert abs(row["delta_ms_per_iteration"]) < deliberate / 2, row
    assert model["ranks"] == {"matched": [0], "only_a": [], "only_b": []}


def test_cli_text_json_top_and_selection(profiles: dict[str, Path]) -> None:
    a, b = str(profiles["a"]), str(profiles["b"])
    text = jobprof_cli("diff", a, b, "--top", "3")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("A: ") and f"{STEPS_A} iteration(s)" in lines[0]
    assert lines[1].startswith("B: ") and f"{STEPS_B} iteration(s)" in lines[1]
    assert lines[3].startswith("B is ")
    assert "Iteration time (ms" in text.stdout and "Operator types per iteration" in text.stdout
    table = text.stdout.split("Operator types per iteration")[1].split("\n\n")[0].splitlines()
    assert len(table) == 3 + 3 and table[3].split()[0] == "mm"  # title, header, rule, 3 rows
    # each operator row shows its noise: both sides' median per iteration with its 95% interval
    assert "A median ms (95% CI)" in table[1] and "B median ms (95% CI)" in table[1]
    assert re.search(r"\d\.\d{3} \(\d\.\d{3}-\d\.\d{3}\)", table[3]), table[3]

    proc = jobprof_cli("diff", a, b, "--json", "--top", "2", "--iterations", "3-10", "--iterations-b", "5-")
    assert proc.returncode == 0, proc.stderr
    model = json.loads(proc.stdout)
    assert set(model) == {"schema", "a", "b", "scope", "ranks", "thresholds", "verdict", "counts",
                          "iteration", "operators", "collectives", "notes"}
    assert model["schema"] == diff.SCHEMA and model["scope"] == "all" and model["collectives"] is None
    assert set(model["a"]) == {"prof_dir", "selection", "ranks", "iterations", "iterations_per_rank",
                               "op_statistic_files", "hccl", "job"}
    assert set(model["a"]["job"]) == set(diff.JOB_KEYS)
    assert (model["a"]["iterations"], model["b"]["iterations"]) == (8, STEPS_B - 4)
    assert model["a"]["selection"]["iterations"] == "3-10" and model["b"]["selection"]["iterations"] == "5-"
    assert len(model["operators"]) == 2 and model["counts"]["operators"] > 2
    row = model["operators"][0]
    assert set(row) == {"rank", "op_type", "core_type", "a", "b", "delta_calls_per_iteration",
                        "delta_ms_per_iteration", "delta_pct", "change"}
    assert set(row["b"]) == {"calls_per_iteration", "ms_per_iteration", "median_ms_per_iteration",
                             "median_ci95_ms_per_iteration", "us_per_call"}
    for side in (row["a"], row["b"]):  # 8 and 20 iterations: each side has its median's interval
        low, high = side["median_ci95_ms_per_iteration"]
        assert low <= side["median_ms_per_iteration"] <= high
    parts = [r["part"] for r in model["iteration"]]
    assert parts == ["iteration", "profiler", "data_wait", "communication_not_overlapped",
                     "forward_backward", "refresh", "free"]
    assert set(model["iteration"][0]) == {"rank", "part", "a", "b", "delta_ms", "delta_pct",
                                          "delta_mean_ms", "change"}
    assert set(model["iteration"][0]["a"]) == {"mean", "median", "p95"}
    # no dp in these runs: data wait is unknown on both sides, not a change
    wait = model["iteration"][2]
    assert wait["a"] is None and wait["delta_ms"] is None and wait["change"] == "unchanged"


def test_bad_input_is_a_clear_error(profiles: dict[str, Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = jobprof_cli("diff", str(empty), str(profiles["a"]))
    assert proc.returncode != 0 and f"no PROF_* directory in {empty}" in proc.stderr, proc.stderr
    proc = jobprof_cli("diff", str(profiles["a"]), str(tmp_path / "missing"))
    assert proc.returncode != 0 and "missing: no such directory" in proc.stderr, proc.stderr
    proc = jobprof_cli("diff", str(profiles["a"]), str(profiles["b"]), "--rank", "7")
    assert proc.returncode != 0 and str(profiles["a"]) in proc.stderr and "ranks present: [0]" in proc.stderr
    proc = jobprof_cli("diff", str(profiles["a"]), str(profiles["b"]), "--iterations", "x")
    assert proc.returncode != 0 and "--iterations 'x'" in proc.stderr
    broken = tmp_path / "broken"
    for path in profiles["a"].rglob("*"):
        if path.is_file():
            target = broken / profiles["a"].name / path.relative_to(profiles["a"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    [stat] = list(broken.rglob("op_statistic_0_*_2.csv"))
    stat.write_text("not,a,statistic\n1,2,3\n")
    proc = jobprof_cli("diff", str(broken), str(profiles["b"]))
    # named and left out; the other iterations' files still compare (issue 15, finding 8)
    assert proc.returncode == 0 and f"{stat}: not an op_statistic file" in proc.stderr, proc.stderr
    assert "left out" in proc.stderr and "Operator types per iteration" in proc.stdout, proc.stdout


@pytest.fixture(scope="module")
def ranks2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    options = {"training_trace": "on", "hccl": "on", "task_trace": "off"}
    return {name: _profile(tmp_path_factory, f"ddp_{name}", DDP, options, [str(free_port()), "8", name])
            for name in ("base", "extra")}


@pytest.mark.slow
def test_collectives_per_rank(ranks2: dict[str, Path], profiles: dict[str, Path]) -> None:
    model = compare(ranks2["base"], ranks2["extra"], per_rank=True)
    assert model["ranks"] == {"matched": [0, 1], "only_a": [], "only_b": []}
    assert model["scope"] == "per_rank" and model["a"]["hccl"] and model["b"]["hccl"]
    assert model["operators"] == [] and any("no op_statistic files" in n for n in model["notes"])
    assert {r["rank"] for r in model["iteration"]} == {None, 0, 1}
    for rank in (0, 1):
        rows = {r["op"]: r for r in model["collectives"] if r["rank"] == rank}
        assert set(rows) == {"all_reduce", "broadcast"}, rows
        assert rows["broadcast"]["change"] == "new" and rows["broadcast"]["a"] is None
        assert rows["broadcast"]["b"]["calls_per_iteration"] == pytest.approx(1.0)
        assert rows["broadcast"]["b"]["mb_per_iteration"] == pytest.approx(1.0)  # 250,000 float32
        assert rows["all_reduce"]["delta_calls_per_iteration"] == pytest.approx(0.0)
        assert rows["all_reduce"]["a"]["mb_per_iteration"] == pytest.approx(0.004)
    # one rank only, and a one-rank profile against a two-rank one
    one = compare(ranks2["base"], ranks2["extra"], ranks=[1])
    assert one["a"]["ranks"] == [1] and one["b"]["ranks"] == [1]
    mixed = compare(ranks2["base"], profiles["a"], per_rank=True)
    assert mixed["ranks"] == {"matched": [0], "only_a": [1], "only_b": []}
    assert any(n.startswith("rank sets differ") for n in mixed["notes"])
    assert mixed["collectives"] is None and any("only one side has hccl" in n for n in mixed["notes"])


# A third-party plugin's own diff table: the iterations themselves, one row ("step"), whose time
# per iteration is therefore the mean iteration time, which the core's iteration table also
# shows; a different source for the same number.
STEPS_PLUGIN = """
from jobprof.plugin.hookspec import hookimpl
from jobprof.plugin import DiffCount, DiffTable

@hookimpl
def jobprof_diff_tables(profile, device):
    its = profile.iterations(device)
    ns = sum(it.end_ns - it.start_ns for it in its)
    return [DiffTable("steps", "Steps per iteration of one rank ({shown} of {total})", ["what"], ["what"],
                      {("step",): DiffCount(len(its), ns)}, present=bool(its),
                      one_sided_note="only one side has steps")]
"""


def test_a_third_party_plugin_adds_its_own_table(profiles: dict[str, Path], tmp_path: Path) -> None:
    root = make_dist(tmp_path / "steps", "jobprof-steps", {"jobprof_steps": STEPS_PLUGIN},
                     {"steps": "jobprof_steps"})
    a, b = str(profiles["a"]), str(profiles["b"])
    proc = jobprof_cli("diff", a, b, "--json", env={"PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    model = json.loads(proc.stdout)
    [row] = model["steps"]
    assert model["counts"]["steps"] == 1 and row["what"] == "step" and row["rank"] is None
    it = model["iteration"][0]
    assert row["a"]["calls_per_iteration"] == 1.0 and row["b"]["calls_per_iteration"] == 1.0
    assert row["a"]["ms_per_iteration"] == pytest.approx(it["a"]["mean"])
    assert row["b"]["ms_per_iteration"] == pytest.approx(it["b"]["mean"])
    assert row["change"] == "slower" and row["delta_ms_per_iteration"] == pytest.approx(it["delta_mean_ms"])
    # the built-in tables are untouched by it
    assert model["counts"]["operators"] > 2 and "top change: mm (slower)" in model["verdict"]
    text = jobprof_cli("diff", a, b, env={"PYTHONPATH": str(root)})
    assert text.returncode == 0, text.stderr
    table = text.stdout.split("Steps per iteration of one rank (1 of 1)\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split() == ["what", "A", "calls", "B", "calls", "A", "ms", "B", "ms", "Δ", "ms", "Δ", "%",
                                "change"]
    assert table[2].split()[0] == "step" and table[2].split()[-1] == "slower"
    assert "Operator types per iteration" in text.stdout


def test_plugin_tables_keep_their_owner_and_notes(profiles: dict[str, Path]) -> None:
    """A table on one side only gets its one-sided note and null; a plugin returning a built-in
    plugin's key, or a reserved one, is disabled by name and the diff goes on."""
    only_a = profiles["a"]

    class OneSided:
        @hookimpl
        def jobprof_diff_tables(self, profile, device):
            here = Path(profile.path).resolve() == only_a.resolve()
            return [DiffTable("marks", "Marks", ["mark"], ["mark"],
                              {("m",): DiffCount(1, 1000)} if here else {}, present=here,
                              one_sided_note="only one side has marks", absent_note="no marks")]

    class Thief:
        @hookimpl
        def jobprof_diff_tables(self, profile, device):
            return [DiffTable("operators", "Mine", ["x"], ["x"], {("x",): DiffCount(1, 1)})]

    class Reserved:
        @hookimpl
        def jobprof_diff_tables(self, profile, device):
            return [DiffTable("notes", "Mine", ["x"], ["x"])]

    reporter = Reporter(io.StringIO())
    manager = PluginManager(reporter)
    manager.load_entry_points()
    for name, plugin in (("one_sided", OneSided()), ("thief", Thief()), ("reserved", Reserved())):
        manager.register(plugin, name)
    model = compare(profiles["a"], profiles["b"], manager=manager)
    assert model["marks"] is None and model["counts"]["marks"] is None
    assert "only one side has marks" in model["notes"] and "B: no marks" in model["notes"]
    warnings = reporter.messages
    assert any("'thief'" in w and "table 'operators', which belongs to plugin 'task_trace'" in w
               for w in warnings), warnings
    assert any("'reserved'" in w and "DiffTable key 'notes'" in w for w in warnings), warnings
    assert op(model, "mm")["change"] == "slower" and "Mine" not in json.dumps(model)
    both = compare(profiles["a"], profiles["a2"], manager=manager)
    assert both["marks"] is None  # A2 is another profile: still one-sided
    # the same side twice: compared, and rendered as its own table with the core's columns
    sel = Selection()
    side = diff.load(profiles["a"], sel, manager)
    same = diff.compare(side, side)
    [row] = same["marks"]
    assert row["change"] == "unchanged" and row["a"] == {"calls_per_iteration": 1 / STEPS_A,
                                                         "ms_per_iteration": 0.001 / STEPS_A}
    assert "\nMarks\nmark " in render(same, diff.tables(side, side), None)


def test_a_shift_inside_the_iterations_spread_is_not_a_change() -> None:
    """Mean and median moved past both thresholds, yet the medians' 95% intervals overlap: the
    row is unchanged; apart, it is slower."""
    def side(ms: float, low: float, high: float) -> dict:
        return {"calls_per_iteration": 1.0, "ms_per_iteration": ms, "median_ms_per_iteration": ms,
                "median_ci95_ms_per_iteration": [low, high]}

    a = side(1.0, 0.6, 1.4)
    assert diff._row({}, a, side(1.3, 1.1, 1.9), "calls_per_iteration")["change"] == "unchanged"
    assert diff._row({}, a, side(1.3, 1.45, 1.9), "calls_per_iteration")["change"] == "slower"
    assert diff._row({}, a, side(0.7, 0.2, 0.55), "calls_per_iteration")["change"] == "faster"
    few = {**side(1.3, 0, 0), "median_ci95_ms_per_iteration": None}  # under 6 iterations: no interval
    assert diff._row({}, a, few, "calls_per_iteration")["change"] == "slower"


def test_the_median_interval_is_exact_and_distribution_free() -> None:
    from jobprof.analysis.stats import median_interval

    assert median_interval([1, 2, 3, 4, 5]) is None  # [min, max] covers 94%: too few
    assert median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)  # covers 1 - 2/64 = 96.9%
    assert median_interval(list(range(1, 17))) == (4, 13)  # 1 - 2 P(Bin(16, 1/2) <= 3) = 97.9%
    rng = random.Random(0)
    median = math.log(2)  # of the unit exponential
    for n in (30, 1000):  # exact below 400 values, the normal approximation above
        covered = sum(low <= median <= high for low, high in
                      (median_interval([rng.expovariate(1) for _ in range(n)]) for _ in range(400)))
        assert 0.93 <= covered / 400 <= 1.0
