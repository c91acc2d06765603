"""hccl, msproftx, dp and fusion_op reduce each device to facts (``jobprof_rank_facts``) and
build their summary sections from them: the facts are small JSON, and the sections are the same
whether each device's facts come from the facts file the exporter wrote, are computed in this
process or in a worker process, or are not gathered at all (computed by the section itself).

Two real profiles, made once: a 2-rank gloo DDP job (torchrun) with collectives, markers and
ranges (shared and per-rank names, more than the section shows) and two DataLoaders, one
data-bound; and a torch.compile job (``tests/programs/compiled_job.py``, one rank) for fusion_op.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Runner, loaded_manager, torchrun
from jobprof.analysis import facts
from jobprof.analysis.profile import Profile
from jobprof.analysis.selection import Selection
from jobprof.files import rawstore
from jobprof.plugin.results import Section
from jobprof.plugins.dp import report as dp_report
from jobprof.plugins.fusion_op import report as fusion_report
from jobprof.plugins.hccl import report as hccl_report
from jobprof.plugins.msproftx import report as tx_report

STEPS = 6
#: plugin (entry-point name) -> (its rank_facts, its section function)
PLUGINS: dict[str, tuple[Callable[[Profile, int], Any], Callable[[Profile], list[Section]]]] = {
    "hccl": (hccl_report.rank_facts, hccl_report.communication_sections),
    "msproftx": (tx_report.rank_facts, tx_report.marker_sections),
    "dp": (dp_report.rank_facts, dp_report.dp_sections),
    "fusion_op": (fusion_report.rank_facts, fusion_report.compiled_sections),
}
#: a device's facts of one plugin stay below this (JSON bytes): aggregates, not records
SMALL = 16_000

DDP_JOB = f"""
import os, time, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from jobprof import mstx

class Slow(Dataset):
    def __init__(self, n, delay_ms):
        self.n, self.delay = n, delay_ms / 1000
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.randn(16), torch.randn(1)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
sub = dist.new_group([0, 1])
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)), bucket_cap_mb=0.001)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow = iter(DataLoader(Slow(4 * {STEPS}, 3), batch_size=4))  # data-bound: 12 ms per batch
fast = iter(DataLoader(Slow(2 * {STEPS}, 0), batch_size=2))
io = mstx.domain("io")
for step in range(1, {STEPS} + 1):
    with mstx.range("step"):
        with io.range("load"):
            x, y = next(slow)
            extra, _ = next(fast)
        for j in range(9):  # 18 names over both ranks, 9 of them on each
            with mstx.range(f"rank{{rank}} part {{j}}"):
                pass
        mstx.mark(f"step {{step}}")
        opt.zero_grad()
        with mstx.range("forward"):
            loss = nn.functional.mse_loss(model(x), y) + extra.sum() * 0
        loss.backward()
        opt.step()
        dist.all_reduce(loss.detach().clone())
        dist.all_reduce(torch.ones(8), group=sub)
        if step % 2:
            dist.broadcast(torch.ones(4), src=0)
dist.barrier()
dist.destroy_process_group()
"""
DDP_OPTIONS = {"training_trace": "on", "task_trace": "off", "hccl": "on", "msproftx": "on", "dp": "on"}
COMPILED_OPTIONS = {"training_trace": "on", "task_trace": "on", "msproftx": "on", "dp": "on"}


def _ddp(tmp: Path) -> Path:
    runner = Runner(tmp)
    runner.run(torchrun(runner, runner.script(DDP_JOB, "ddp.py"), 2), DDP_OPTIONS, timeout=300)
    (prof,) = runner.prof_dirs()
    return prof


def _compiled(tmp: Path) -> Path:
    runner = Runner(tmp)
    runner.run(REPO / "tests" / "programs" / "compiled_job.py", COMPILED_OPTIONS, args=["mlp"],
               env={"TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}, timeout=300)
    (prof,) = runner.prof_dirs()
    return prof


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"ddp": 2-rank profile, "compiled": 1-rank profile}, made side by side."""
    with ThreadPoolExecutor(2) as pool:
        ddp = pool.submit(_ddp, tmp_path_factory.mktemp("ddp"))
        compiled = pool.submit(_compiled, tmp_path_factory.mktemp("compiled"))
        return {"ddp": ddp.result(), "compiled": compiled.result()}


#: the plugins whose section each profile must have
EXPECTED = {"ddp": {"hccl", "msproftx", "dp"}, "compiled": {"msproftx", "fusion_op"}}


def _sections(profile: Profile) -> dict[str, list[Section]]:
    return {name: section(profile) for name, (_, section) in PLUGINS.items()}


def _unfactored(prof: Path, tmp: Path) -> Path:
    """A copy of ``prof`` without the facts files the exporter wrote."""
    copy = tmp / "copy" / prof.name
    shutil.copytree(prof, copy)
    for kept in copy.glob("device_*/data/facts.*.json"):
        kept.unlink()
    return copy


def _refuse(profile: Profile, device: int) -> Any:
    raise AssertionError(f"device {device}: computed although its facts were gathered")


@pytest.mark.parametrize("shape", ["ddp", "compiled"])
def test_facts_are_small_json_of_one_device(profiles: dict[str, Path], shape: str) -> None:
    prof = profiles[shape]
    answered: set[str] = set()
    for device in Profile(prof).devices:
        alone = Profile(prof, device=device)
        raw_bytes = sum(s.stat().st_size for s in rawstore.segments(alone.folder(device)))
        for name, (rank_facts, _) in PLUGINS.items():
            value = rank_facts(alone, device)
            text = json.dumps(value, allow_nan=False)
            assert json.loads(text) == value, name  # no tuple, no int key: the same after JSON
            assert len(text) < SMALL and len(text) < raw_bytes, (name, len(text), raw_bytes)
            if value is not None:
                answered.add(name)
        # the hook answers the same, through the manager's contract check
        hooked = dict(loaded_manager().rank_facts(alone, device))
        for name, (rank_facts, _) in PLUGINS.items():
            assert hooked.get(name) == rank_facts(alone, device), name
    assert answered == EXPECTED[shape]


@pytest.mark.parametrize("shape", ["ddp", "compiled"])
def test_sections_from_the_exporters_facts_files(profiles: dict[str, Path], shape: str) -> None:
    prof = profiles[shape]
    expected = _sections(Profile(prof))  # no facts attached: each section computes them
    assert {name for name, found in expected.items() if found} == EXPECTED[shape]
    gathered = Profile(prof)
    kept = facts.gather(gathered, loaded_manager(), "local", 1)
    for device, one in kept.items():
        assert set(PLUGINS) <= set(one["asked"])  # the job's exporter asked these plugins
        for name in PLUGINS:
            gathered.facts(name, device, _refuse)
    assert _sections(gathered) == expected


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("shape", ["ddp", "compiled"])
def test_sections_from_computed_facts(profiles: dict[str, Path], shape: str, jobs: int,
                                      tmp_path: Path) -> None:
    """Facts computed here (jobs=1) or in worker processes (jobs=2), no facts file to read."""
    prof = _unfactored(profiles[shape], tmp_path)
    expected = _sections(Profile(prof))
    gathered = Profile(prof)
    facts.gather(gathered, loaded_manager(), "local", jobs)
    for device in gathered.devices:
        for name in PLUGINS:
            gathered.facts(name, device, _refuse)
    assert _sections(gathered) == expected
    assert {name for name, found in expected.items() if found} == EXPECTED[shape]


@pytest.mark.parametrize("shape", ["ddp", "compiled"])
def test_sections_of_an_iteration_window(profiles: dict[str, Path], shape: str) -> None:
    """``--iterations 2-4``: facts of the window are computed (never read from the files), in a
    worker process, and give the sections the window gives."""
    prof = profiles[shape]
    window = Selection((2, 4))
    expected = _sections(Profile(prof, window))
    gathered = Profile(prof, window)
    facts.gather(gathered, loaded_manager(), "local", 2)
    assert _sections(gathered) == expected
    assert expected != _sections(Profile(prof))  # the window changes what they say


def test_one_rank_selected(profiles: dict[str, Path]) -> None:
    """Rank 1 alone: its device's facts, and no "rank N" prefix (one device shown)."""
    prof = profiles["ddp"]
    only = Selection(ranks=[1])
    expected = _sections(Profile(prof, only))
    gathered = Profile(prof, only)
    facts.gather(gathered, loaded_manager(), "local", 1)
    assert gathered.devices == [1]
    assert _sections(gathered) == expected
    assert all(row[0] == 1 for row in expected["hccl"][0].rows)
