"""storage_limit ageing on real files: oldest segments first, the newest always kept."""

from __future__ import annotations

import os
from pathlib import Path

from jobprof.files import rawstore
from jobprof.runtime.storage import MB, RESERVE, StorageBudget


def it(index: int) -> dict:
    """An iteration record as the core writes it (readers drop lines without one)."""
    return {"index": index, "start_ns": index * 10, "end_ns": index * 10 + 5, "method": "explicit"}


class Device:
    """A device folder written the way the sink writes it: raw lines plus exported files."""

    def __init__(self, root: Path, budget: StorageBudget) -> None:
        for sub in ("data", "summary"):
            (root / sub).mkdir(exist_ok=True)
        (root / "info.json.0").write_text("{}")  # metadata: never tracked, never aged
        self.root, self.budget = root, budget
        self.raw = rawstore.RawWriter(root)
        self.unit = 0

    def iteration(self, index: int, size: int) -> None:
        where = self.raw.append(index, {"iteration": [it(index)], "blob": ["x" * size]})
        if where.new_segment:
            self.unit = index
        self.budget.account(self.unit, where.segment, where.offset + where.length)
        exported = self.root / "summary" / f"step_trace_0_4294967295_{index}.csv"
        exported.write_text("y" * size)
        self.budget.account(self.unit, exported, size)
        self.budget.enforce()

    def exported(self) -> list[int]:
        return sorted(int(p.stem.rsplit("_", 1)[1]) for p in (self.root / "summary").iterdir())


def test_oldest_segments_go_first_and_the_newest_stays(tmp_path):
    size = 2000  # per iteration: ~2 KB raw + 2 KB exported; a segment holds 100 iterations
    budget = StorageBudget(tmp_path, RESERVE + 3 * 100 * 2 * (size + 100), max_files=10**9)
    device = Device(tmp_path, budget)
    for index in range(1, 1001):
        device.iteration(index, size)
    kept = device.exported()
    # whole segments age: what is left starts at a segment boundary and ends with the newest
    assert kept == list(range(kept[0], 1001)) and (kept[0] - 1) % 100 == 0 and kept[0] > 1
    segments = [p.name for p in rawstore.segments(tmp_path)]
    assert segments[-1] == "raw.000000901.jsonl"
    assert [i for i, _ in rawstore.read(tmp_path)] == kept  # raw and exported age together
    assert budget.total_bytes <= budget.limit_bytes - RESERVE
    assert budget.aged_units == len(range(1, kept[0], 100))
    assert (tmp_path / "info.json.0").exists()


def test_a_late_file_of_an_aged_segment_is_refused(tmp_path):
    budget = StorageBudget(tmp_path, RESERVE + 1, max_files=10**9)
    device = Device(tmp_path, budget)
    for index in range(1, 202):
        device.iteration(index, 10)
    assert not budget.alive(1) and budget.alive(201)
    assert budget.account(1, tmp_path / "summary" / "late.csv", 10) is False


def test_file_count_is_bounded_too(tmp_path):
    """A long job must not fill the inode table: the file budget ages segments as well."""
    budget = StorageBudget(tmp_path, 1 << 40, max_files=150)
    device = Device(tmp_path, budget)
    for index in range(1, 1001):
        device.iteration(index, 10)
    files = [p for sub in ("data", "summary") for p in (tmp_path / sub).iterdir()]
    assert len(files) <= 150 and budget.total_files == len(files)
    assert 1000 in device.exported()


def test_small_files_count_whole_blocks(tmp_path):
    budget = StorageBudget(tmp_path, 1 << 40, max_files=10**9, block=4096)
    device = Device(tmp_path, budget)
    device.iteration(1, 10)
    assert budget.total_bytes == 2 * 4096  # one raw segment, one exported file
    device.iteration(2, 10)  # the segment grows within its block; one more exported file
    assert budget.total_bytes == 3 * 4096


def test_default_budget_is_a_share_of_the_free_disk(tmp_path):
    stat = os.statvfs(tmp_path)
    free = stat.f_bavail * stat.f_frsize
    budget = StorageBudget.for_device(tmp_path, None)
    assert budget.limit_bytes == max(200 * MB, int(free * 0.2))
    assert StorageBudget.for_device(tmp_path, 300).limit_bytes == 300 * MB


def test_raw_reader_skips_a_torn_last_line(tmp_path):
    (tmp_path / "data").mkdir()
    writer = rawstore.RawWriter(tmp_path)
    writer.append(1, {"iteration": [it(1)]})
    writer.append(2, {"iteration": [it(2)]})
    writer.close()
    with open(rawstore.segments(tmp_path)[0], "ab") as handle:
        handle.write(b'{"index":3,"streams":{"iterat')  # a power loss mid-line
    assert [i for i, _ in rawstore.read(tmp_path)] == [1, 2]
