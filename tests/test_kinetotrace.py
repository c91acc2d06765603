"""Operator windows written by Kineto itself (jobprof.files.kinetotrace): the records read back
from Kineto's own trace file are the records Kineto's event accessors give for the same window,
a real job's raw ops stream holds references and reads back as records, and a damaged window
file loses only its operators, named."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli, raw

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

torch = pytest.importorskip("torch")

from jobprof.files import fsio, kinetotrace, rawstore  # noqa: E402


@pytest.mark.parametrize("shapes", [True, False])
def test_the_trace_file_gives_the_records_of_kinetos_own_events(tmp_path: Path, shapes: bool) -> None:
    """The file (Kineto's save) against Kineto's in-memory events of the same session, through
    the accessors every supported torch has (name, start, duration, thread, shapes, dtypes)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters())
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, record_shapes=shapes) as prof, \
            torch.autograd.profiler.record_function("step"):
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        torch.cat([torch.ones(2), torch.zeros(3)])  # a tensor-list input: nested dims and strides
        torch.randn(3)  # no tensor inputs at all
    result = prof.profiler.kineto_results
    offset = time.time_ns() - time.monotonic_ns()
    expected = sorted(([e.name(), e.start_ns() - offset, e.duration_ns(), e.device_resource_id(),
                        e.shapes() if shapes else None, e.dtypes() if shapes else None]
                       for e in result.events() if e.device_type() == torch.autograd.DeviceType.CPU),
                      key=lambda r: r[1])
    device = tmp_path / "PROF_x" / "device_0"
    fsio.make_dirs(device / "data", root=tmp_path)
    name, size = kinetotrace.save_window(result, 1, device)
    path = device / "data" / kinetotrace.FOLDER / name
    assert path.stat().st_size == size and not list(path.parent.glob(".*"))  # no scratch file left
    got = kinetotrace.Windows(device / "data").load(name, offset, shapes)
    assert len(got) == len(expected) > 100
    for mine, theirs in zip(got, expected, strict=True):
        # the trace holds microseconds with three decimals: within 1 ns of Kineto's own
        assert abs(mine.start - theirs[1]) <= 1 and abs(mine.dur - theirs[2]) <= 1, (mine, theirs)
        assert [mine.name, mine.tid, mine.shapes, mine.dtypes] == [theirs[0], *theirs[3:]], (mine, theirs)
    kinds = {r.kind for r in got}
    assert kinds == {"cpu_op", "user_annotation"}
    if shapes:
        cat = next(r for r in got if r.name == "aten::cat")
        # as Kineto's accessors give them: a tensor list's dims empty, its strides nested
        assert cat.shapes == [[], []] and cat.dtypes == ["TensorList", "Scalar"]
        assert cat.strides == [[[1], [1]], []]


JOB = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
a, b = torch.randn(24, 12), torch.randn(12, 8)
for i in range(6):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    for _ in range(3):
        torch.mm(a, b)
    opt.step()
"""


def test_a_real_job_stores_references_and_reads_back_records(runner: Runner) -> None:
    runner.run(JOB, {"task_trace": "on"})
    device = runner.device_dir()
    segment = rawstore.segments(device)[0]
    lines = [rawstore._load_line(line) for line in segment.read_bytes().splitlines()]
    assert lines and all(kinetotrace.is_reference(line["streams"]["ops"]) for line in lines)
    windows = sorted((device / "data" / kinetotrace.FOLDER).iterdir())
    assert windows and all(p.name.endswith(".json.gz") for p in windows)
    named = {r["kineto"] for line in lines for r in line["streams"]["ops"]}
    assert named <= {p.name for p in windows}
    # read back: exactly three mm of the shapes above per iteration, every iteration
    mms = {i: sum(1 for r in s["ops"] if r.name == "aten::mm" and r[8] == [[24, 12], [12, 8]])
           for i, s in raw(device).items()}
    assert mms == {i: 3 for i in range(1, 7)}


def test_a_damaged_window_loses_only_its_operators(runner: Runner) -> None:
    runner.run(JOB, {"task_trace": "on", "training_trace": "on"}, args=[])
    device = runner.device_dir()
    lines = [rawstore._load_line(line) for line in rawstore.segments(device)[0].read_bytes().splitlines()]
    naming: dict[str, set[int]] = {}
    for line in lines:
        for ref in line["streams"]["ops"]:
            naming.setdefault(ref["kineto"], set()).add(line["index"])
    victim = sorted(naming)[len(naming) // 2]
    (device / "data" / kinetotrace.FOLDER / victim).write_bytes(gzip.compress(b"{not json"))
    proc = jobprof_cli("export", str(device.parent))
    assert proc.returncode == 0, proc.stderr
    assert "operator window unreadable" in proc.stderr and "its operators are left out" in proc.stderr
    kept = raw(device)
    assert sorted(kept) == list(range(1, 7))  # the rest of every iteration stays
    assert {i for i, s in kept.items() if "ops" not in s} == naming[victim]
    assert len(list((device / "summary").glob("step_trace_*.csv"))) == 6
