"""The operator tree over operators recorded for real (in this process, through the core's
capture), and the interval arithmetic of msprof's Overlap Analysis."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch_versions  # .ci/run runs it on every torch of its legs too

import opwindow  # noqa: E402
from jobprof.plugin import opview  # noqa: E402


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[list]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)

    def work() -> None:
        with torch.autograd.profiler.record_function("step"):
            model(x).sum().backward()
            torch.mm(torch.randn(5, 3), torch.randn(3, 2))

    return opwindow.record(torch, work, tmp_path_factory.mktemp("optree"))[0]


def test_nesting_and_top_level_operators(recorded):
    view = opview.OpView(recorded)
    names = [r.name for r in recorded]
    linear = names.index("aten::linear")
    addmm = next(i for i, n in enumerate(names) if n == "aten::addmm" and view.parent[i] == linear)
    assert view.parent[addmm] == linear
    top_names = [names[i] for i in view.top]
    assert top_names.count("aten::linear") == 2 and "aten::addmm" not in top_names
    assert "aten::mm" in top_names  # called from Python: a top-level operator
    # the record_function block and the autograd frames are never operators
    assert "step" not in top_names and not any(n.startswith("autograd::") for n in top_names)
    for i in view.top:  # nothing of dispatcher kind above a top-level operator
        p = view.parent[i]
        while p >= 0:
            assert not opview.is_dispatch_op(recorded[p].name, recorded[p][4])
            p = view.parent[p]


def test_tasks_on_cpu_are_the_top_level_operators(recorded):
    view = opview.OpView(recorded)
    assert not view.has_device
    assert [t.index for t in view.tasks] == view.top
    by_stream: dict[int, list] = {}
    for task in view.tasks:
        by_stream.setdefault(task.stream, []).append(task)
        assert task.core_type == opview.CPU and task.op_type == task.name.split("::")[-1]
    for tasks in by_stream.values():
        assert [t.task_id for t in tasks] == list(range(1, len(tasks) + 1))
        for a, b in itertools.pairwise(tasks):
            assert a.end <= b.start  # tasks of one thread never overlap
    previous = None
    for task in view.tasks:  # the contract's Task Wait Time
        expected = 0 if previous is None else max(0, task.start - previous.end)
        assert task.wait == expected
        previous = task


def test_self_times_add_up_to_the_root(recorded):
    view = opview.OpView(recorded)
    for i in view.top:
        total = sum(view.self_ns(j) for j in view.subtree(i))
        assert total == recorded[i].dur


def test_records_are_in_start_order(recorded):
    starts = [r.start for r in recorded]
    assert starts == sorted(starts)


def test_union_and_subtract():
    assert opview.union([(5, 7), (1, 3), (2, 4), (7, 8), (9, 9)]) == [(1, 4), (5, 8)]
    assert opview.subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert opview.subtract([(0, 4), (6, 10)], [(3, 7)]) == [(0, 3), (7, 10)]
    assert opview.subtract([(0, 4)], []) == [(0, 4)]
    assert opview.clip([(0, 5), (8, 12)], 2, 10) == [(2, 5), (8, 10)]


def test_overlap_analysis_partitions_the_iteration():
    parts = opview.overlap(computing=[(10, 40), (60, 70)], communication=[(30, 50), (80, 85)],
                           start=0, end=100)
    assert parts["Computing"] == [(10, 40), (60, 70)]
    assert parts["Communication"] == [(30, 50), (80, 85)]
    assert parts["Communication(Not Overlapped)"] == [(40, 50), (80, 85)]
    assert parts["Free"] == [(0, 10), (50, 60), (70, 80), (85, 100)]
    length = lambda spans: sum(b - a for a, b in spans)  # noqa: E731
    assert length(parts["Computing"]) + length(parts["Communication(Not Overlapped)"]) + \
        length(parts["Free"]) == 100
