"""A sampled operator tier (option ``task_trace_every``: N): the operators of iterations
1, 1 + N, 1 + 2N, ... (Kineto off between them), the step tier on every iteration; operator
files for the sampled iterations only, the summary says so, the losses are the unprofiled ones.
Sampling needs iterations that end as they end (optimizer step, jobprof.step()): a job whose
iterations are found late (backward) is told once and captured whole from then on."""

from __future__ import annotations

import json

import pytest

from conftest import Runner, jobprof_cli, raw_iterations
from jobprof.files.profdir import iteration_files

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

JOB = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(int(sys.argv[1])):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    if sys.argv[2] == "optimizer":
        opt.zero_grad(); loss.backward(); opt.step()
    else:  # found by backward: a hand-written update, no optimizer
        model.zero_grad(); loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
    print(f"loss {i} {loss.item()!r}")
"""
STEPS = 23
OPTIONS = {"training_trace": "on", "task_trace": "l1", "task_trace_every": 5}


def files(runner: Runner, name: str, folder: str = "summary") -> list[int]:
    return sorted(f.iteration for f in iteration_files(runner.device_dir(), folder, name))


def test_every_fifth_iteration_has_operators_and_every_one_its_step(runner: Runner) -> None:
    script = runner.script(JOB)
    plain = runner.run(script, mode=None, args=[str(STEPS), "optimizer"])
    profiled = runner.run(script, OPTIONS, args=[str(STEPS), "optimizer"])
    assert profiled.stdout == plain.stdout  # the same losses, bit for bit
    assert "jobprof" not in profiled.stderr, profiled.stderr
    sampled = [1, 6, 11, 16, 21]
    for name in ("op_summary", "op_statistic", "task_time"):
        assert files(runner, name) == sampled, name
    assert files(runner, "step_trace") == list(range(1, STEPS + 1))
    assert raw_iterations(runner.device_dir(), "ops") == sampled
    # a sampled iteration holds its whole step: the data's, forward's, backward's and the
    # optimizer's operators (SGD's add_ on the 4 parameters), and the loss's item()
    with open(runner.device_dir() / "summary" / "op_summary_0_4294967295_6.csv") as handle:
        names = [line.split(",")[4] for line in handle]
    assert {"aten::randn", "aten::linear", "aten::mse_loss", "aten::mse_loss_backward",
            "aten::threshold_backward", "aten::item"} <= set(names), names
    assert names.count("aten::add_") == 4, names
    text = jobprof_cli("summary", str(runner.out)).stdout
    assert f"operators captured on 1 iteration in 5 (task_trace_every): 5 of {STEPS} iterations" in text, text
    assert "no op_statistic file" not in text
    info = json.loads((runner.device_dir() / "info.json.0").read_text())["jobprof"]
    assert info["options"]["task_trace_every"] == 5


def test_iterations_found_late_are_captured_whole_after_one_message(runner: Runner) -> None:
    script = runner.script(JOB)
    plain = runner.run(script, mode=None, args=[str(STEPS), "backward"])
    profiled = runner.run(script, OPTIONS, args=[str(STEPS), "backward"])
    assert profiled.stdout == plain.stdout
    said = [line for line in profiled.stderr.splitlines() if "task_trace_every" in line]
    assert len(said) == 1 and "iteration method 'backward'" in said[0], profiled.stderr
    first = int(said[0].split("captured from iteration ")[1].split()[0])
    with_ops = raw_iterations(runner.device_dir(), "ops")
    # before the message: the sampled ones; the one found late has none; then every iteration
    assert [i for i in with_ops if i < first] == [i for i in range(1, first - 1) if (i - 1) % 5 == 0]
    assert [i for i in with_ops if i >= first] == list(range(first, STEPS + 1))
