"""storage_limit ageing on real files: oldest iterations first, newest of each stream kept."""

from __future__ import annotations

import os
from pathlib import Path

from jobprof import rawstore
from jobprof.storage import MB, RESERVE, StorageBudget


def write_iteration(root: Path, index: int, streams: tuple[str, ...], size: int) -> list:
    files = rawstore.write_iteration(root, index, {s: ["x" * size] for s in streams})
    exported = root / "summary" / f"step_trace_0_4294967295_{index}.csv"
    exported.write_text("y" * size)
    return [*files, (exported, size, None)]


def make_device(tmp_path: Path) -> Path:
    for sub in ("data", "summary"):
        (tmp_path / sub).mkdir()
    (tmp_path / "info.json.0").write_text("{}")  # metadata: never tracked, never aged
    return tmp_path


def test_oldest_iterations_go_first(tmp_path):
    root = make_device(tmp_path)
    size = 100_000
    # room for about 5 iterations of (2 raw + 1 exported) files above the 20 MB reserve
    budget = StorageBudget(root, RESERVE + 5 * 3 * (size + 10), max_files=10**9)
    for index in range(1, 21):
        budget.add(index, write_iteration(root, index, ("iteration", "training_trace"), size))
        budget.enforce()
    kept = sorted(int(p.stem.rsplit("_", 1)[1]) for p in (root / "summary").iterdir())
    assert kept == list(range(16, 21))
    raw = sorted(p.name for p in (root / "data").iterdir())
    assert raw[0] == "iteration.000000016.json"
    assert budget.aged_iterations == 15
    assert budget.total_bytes <= budget.limit_bytes - RESERVE
    assert (root / "info.json.0").exists()


def test_newest_file_of_each_stream_survives(tmp_path):
    root = make_device(tmp_path)
    size = 100_000
    budget = StorageBudget(root, RESERVE + 4 * 3 * (size + 10), max_files=10**9)
    # a stream that wrote only once, in iteration 1, must keep that file
    budget.add(1, write_iteration(root, 1, ("iteration", "rare"), size))
    for index in range(2, 15):
        budget.add(index, write_iteration(root, index, ("iteration",), size))
        budget.enforce()
    assert (root / "data" / "rare.000000001.json").exists()
    assert not (root / "data" / "iteration.000000001.json").exists()


def test_file_count_is_bounded_too(tmp_path):
    """A long job must not fill the inode table: the file budget ages iterations as well."""
    root = make_device(tmp_path)
    budget = StorageBudget(root, 1 << 40, max_files=30)
    for index in range(1, 101):
        budget.add(index, write_iteration(root, index, ("iteration", "training_trace"), 10))
        budget.enforce()
    files = [p for sub in ("data", "summary") for p in (root / sub).iterdir()]
    assert len(files) <= 30 and budget.total_files == len(files)
    assert (root / "summary" / "step_trace_0_4294967295_100.csv").exists()


def test_default_budget_is_a_share_of_the_free_disk(tmp_path):
    stat = os.statvfs(tmp_path)
    free = stat.f_bavail * stat.f_frsize
    budget = StorageBudget.for_device(tmp_path, None)
    assert budget.limit_bytes == max(200 * MB, int(free * 0.2))
    assert StorageBudget.for_device(tmp_path, 300).limit_bytes == 300 * MB


def test_small_files_count_whole_blocks(tmp_path):
    root = make_device(tmp_path)
    budget = StorageBudget(root, 1 << 40, max_files=10**9, block=4096)
    budget.add(1, write_iteration(root, 1, ("iteration",), 10))
    assert budget.total_bytes == 2 * 4096
