"""No jobprof frame in any traceback the program prints, whatever plugin is on (issue 47 item 2).

Before: a ``record_function`` whose name torch refuses raised from ``__enter__`` as unprofiled,
but with msproftx on its traceback gained ``File ".../plugins/msproftx/capture.py", line 44, in
__enter__``; every wrapper jobprof puts around the program's calls showed the same way (module
``__call__``, ``backward``, ``GradScaler.step``, a DataLoader's ``__next__`` / ``__init__`` /
collate / a worker's re-raised error, a collective, ``Work.wait``, the program's own SIGTERM
handler chained by jobprof).  One program raises through each of them in turn and prints each
traceback (``traceback.format_exc()``: what an uncaught error, ``print_exc`` or
``logging.exception`` print); profiled with every collector on, each must read exactly as
unprofiled.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, clean_env, free_port

PROGRAM = r'''
import os, signal, sys, traceback

def handler(signum, frame):  # installed before torch: jobprof chains it
    raise RuntimeError("the program's SIGTERM handler")

signal.signal(signal.SIGTERM, handler)

import torch
import torch.distributed as dist

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):  # the session is live: capture started, iterations found
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[1]}")

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class Boom(torch.nn.Module):
    def forward(self, x):
        raise ValueError("forward")


class BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("backward")


class BadOptimizer(torch.optim.SGD):
    def step(self, closure=None):
        raise ValueError("optimizer")


class BadData(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        raise ValueError("dataset")


def bad_collate(batch):
    raise ValueError("collate")


@case
def record_function_refused_name():
    with torch.autograd.profiler.record_function("\udcff\ud800"):
        pass


@case
def record_function_body():
    with torch.autograd.profiler.record_function("block"):
        raise ValueError("inside a block")


@case
def module_call():
    Boom()(torch.zeros(1))


@case
def nested_module_call():
    torch.nn.Sequential(torch.nn.Identity(), Boom())(torch.zeros(1))


@case
def backward():
    BadGrad.apply(torch.ones(2, requires_grad=True)).sum().backward()


@case
def backward_refused():
    torch.ones(2).sum().backward()


@case
def optimizer_step():
    BadOptimizer(model.parameters(), lr=0.1).step()


@case
def grad_scaler_step():
    torch.amp.GradScaler("cpu").step(BadOptimizer(model.parameters(), lr=0.1))


@case
def dataloader_next():
    next(iter(torch.utils.data.DataLoader(BadData())))


@case
def dataloader_collate():
    next(iter(torch.utils.data.DataLoader(range(4), batch_size=2, collate_fn=bad_collate)))


@case
def dataloader_worker():
    next(iter(torch.utils.data.DataLoader(BadData(), num_workers=1)))


@case
def dataloader_init():
    iter(torch.utils.data.DataLoader(BadData(), num_workers=1, prefetch_factor=-1))


@case
def collective():
    dist.broadcast(torch.zeros(2), src=3)


@case
def work_wait():
    work = dist.all_to_all_single(torch.zeros(3), torch.zeros(2), async_op=True)
    work.wait()  # gloo's worker found the sizes wrong: raised here


@case
def sigterm_handler():  # last: jobprof's session ends at the signal
    os.kill(os.getpid(), signal.SIGTERM)


for name, fn in CASES.items():
    print(f"=== {name}", flush=True)
    try:
        fn()
        print("no error")
    except BaseException:
        print(traceback.format_exc(), flush=True)
'''
#: every collector that wraps something (the operator capture with shapes, msproftx's ranges,
#: hccl's collectives, dp's loaders, the step detector), rendered in the job
EVERYTHING = {"training_trace": "on", "task_trace": "on", "msproftx": "on", "aicpu": "on", "hccl": "on",
              "task_memory": "on", "runtime_api": "on", "export": "inline"}
CASES = ("record_function_refused_name", "record_function_body", "module_call", "nested_module_call",
         "backward", "backward_refused", "optimizer_step", "grad_scaler_step", "dataloader_next",
         "dataloader_collate", "dataloader_worker", "dataloader_init", "collective", "work_wait",
         "sigterm_handler")


def _sections(stdout: str) -> dict[str, str]:
    parts = stdout.split("=== ")[1:]
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] for part in parts}


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Each case's traceback, unprofiled and profiled (same program, same paths)."""
    tmp = tmp_path_factory.mktemp("tracebacks")
    script = tmp / "program.py"
    script.write_text(PROGRAM)
    runs = {}
    for mode in ("unprofiled", "profiled"):
        env = clean_env()
        if mode == "profiled":
            env = clean_env(PROFILING_MODE="true",
                            PROFILING_OPTIONS=json.dumps({"output": str(tmp / "prof"), **EVERYTHING}))
        proc = subprocess.run([sys.executable, str(script), str(free_port())], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        runs[mode] = _sections(proc.stdout)
        assert sorted(runs[mode]) == sorted(CASES), proc.stdout
    if not list((tmp / "prof").glob("PROF_*/device_0/timeline/msprof_*.json")):
        raise AssertionError("the profiled run rendered nothing: its collectors were not on")
    return runs


def test_the_program_raises_in_every_case(printed: dict[str, dict[str, str]]) -> None:
    for name, text in printed["unprofiled"].items():
        assert text.startswith("Traceback (most recent call last):"), (name, text)


@pytest.mark.parametrize("case", CASES)
def test_no_jobprof_frame_in_the_traceback(printed: dict[str, dict[str, str]], case: str) -> None:
    profiled, unprofiled = printed["profiled"][case], printed["unprofiled"][case]
    ours = [str(REPO / "core"), str(REPO / "plugins"), "/jobprof/"]
    assert not [line for line in profiled.splitlines() if any(p in line for p in ours)], profiled
    assert profiled == unprofiled
