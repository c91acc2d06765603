"""``jobprof export --layout cann8`` on a real 2-rank gloo job: mindstudio_profiler_output/ holds
the same rows as the per-iteration files (statistics re-aggregated), named as CANN 8 names them."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from conftest import Runner, check_timeline, free_port, jobprof_cli, read_csv
from jobprof.analysis import cann8
from jobprof.analysis.merge import group_of

STEPS = 6
#: docs/msprof.md section 2: <name>_<YYYYMMDDhhmmss>.csv|json, slices <name>_slice_<n>_<ts>.csv
NAME_RE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*?)(_slice_\d+)?_(?P<ts>\d{14})\.(csv|json)$")

JOB = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn

def run(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, {steps} + 1):
        model(torch.randn(8, 16)).sum().backward()
        for p in model.parameters():
            if step % 2 or p.dim() == 2:  # iterations differ: 4 or 2 all-reduces (step_trace pairs)
                dist.all_reduce(p.grad)
        dist.barrier()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
""".replace("{steps}", str(STEPS))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("cann8"))
    runner.run(JOB, {"training_trace": "on", "task_trace": "on", "hccl": "on"},
               args=[str(free_port())], timeout=300)
    [prof] = runner.prof_dirs()
    proc = jobprof_cli("export", str(prof), "--layout", "cann8")
    assert proc.returncode == 0, proc.stderr
    assert "mindstudio_profiler_output" in proc.stdout and proc.stderr == "", proc.stderr
    return prof


def per_iteration(prof: Path, folder: str, name: str) -> dict[int, list[Path]]:
    out: dict[int, list[Path]] = {}
    for device in (0, 1):
        files = [p for p in (prof / f"device_{device}" / folder).glob(f"{name}_{device}_*")
                 if re.fullmatch(rf"{name}_{device}_\d+_\d+\.(csv|json)", p.name)]
        out[device] = sorted(files, key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    return out


def assembled(prof: Path) -> dict[str, Path]:
    return {p.name: p for p in (prof / cann8.FOLDER).iterdir()}


@pytest.mark.slow
def test_names_and_one_shared_timestamp(job: Path) -> None:
    files = assembled(job)
    matches = [NAME_RE.match(name) for name in files]
    assert all(matches), files
    assert len({m["ts"] for m in matches}) == 1
    got = {(m["name"], name.rsplit(".", 1)[1]) for m, name in zip(matches, files, strict=True)}
    want = {(p.name.split(f"_{d}_")[0], p.suffix[1:]) for d in (0, 1)
            for p in (job / f"device_{d}").glob("*/*_*_*_*.*")}
    assert got == want
    assert {"op_summary", "op_statistic", "task_time", "step_trace", "communication_statistic",
            "msprof", "hccl"} <= {n for n, _ in got}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["op_summary", "task_time", "step_trace"])
def test_tables_hold_every_row_sorted_by_device_then_start(job: Path, name: str) -> None:
    [path] = [p for n, p in assembled(job).items() if n.startswith(f"{name}_") and n.endswith(".csv")]
    with open(path, newline="") as handle:
        header, *rows = list(csv.reader(handle))
    inputs = per_iteration(job, "summary", name)
    want: list[dict] = []
    headers = set()
    for files in inputs.values():
        for file in files:
            with open(file, newline="") as handle:
                file_header, *file_rows = list(csv.reader(handle))
            headers.add(tuple(file_header))
            # the file's columns are a prefix of the assembled header; the rest is N/A padding
            assert header[:len(file_header)] == file_header
            want += [tuple(r + ["N/A"] * (len(header) - len(r))) for r in file_rows]
    longest = max(headers, key=len)
    assert tuple(header) == longest
    if name == "step_trace":  # iterations with 1 and with 4 all-reduces: padded pairs
        assert len(headers) > 1 and header.count("Reduce Start(us)") == 4
    else:
        assert headers == {tuple(header)}
    assert len(rows) == len(want) == sum(len(read_csv(f)) for fs in inputs.values() for f in fs)
    if "OP State" in header:  # N/A per iteration; measured over every iteration here (test_op_state)
        at = header.index("OP State")
        assert {r[at] for r in want} == {"N/A"} and {r[at] for r in rows} <= {"static", "dynamic", "N/A"}
        assert "static" in {r[at] for r in rows}  # this job's shapes never change
        rows = [[*r[:at], "N/A", *r[at + 1:]] for r in rows]
    assert Counter(map(tuple, rows)) == Counter(want)
    devices = [int(r[0]) for r in rows]
    assert devices == sorted(devices) and set(devices) == {0, 1}
    start = next((c for c in cann8.START_COLUMNS if c in header), None)
    if name != "step_trace":
        assert start is not None
        index = header.index(start)
        for device in (0, 1):
            starts = [float(r[index]) for r in rows if int(r[0]) == device]
            assert starts == sorted(starts), device


@pytest.mark.slow
@pytest.mark.parametrize("name", ["op_statistic", "communication_statistic"])
def test_statistics_are_reaggregated_per_device(job: Path, name: str) -> None:
    [path] = [p for n, p in assembled(job).items() if n.startswith(f"{name}_")]
    rows = read_csv(path)
    keys = [c for c in rows[0] if c not in ("Device_id", "Count", "Total Time(us)", "Min Time(us)",
                                            "Avg Time(us)", "Max Time(us)", "Ratio(%)")]
    for device, files in per_iteration(job, "summary", name).items():
        assert len(files) == STEPS
        want: dict[tuple, list] = {}
        for file in files:
            for r in read_csv(file):
                group = want.setdefault(tuple(r[k] for k in keys), [0, 0.0, [], []])
                group[0] += int(r["Count"])
                group[1] += float(r["Total Time(us)"])
                group[2].append(float(r["Min Time(us)"]))
                group[3].append(float(r["Max Time(us)"]))
        got = {tuple(r[k] for k in keys): r for r in rows if r["Device_id"] == str(device)}
        assert set(got) == set(want)
        for key, (count, total, lows, highs) in want.items():
            row = got[key]
            assert int(row["Count"]) == count
            assert float(row["Total Time(us)"]) == pytest.approx(total, abs=0.002)
            assert float(row["Min Time(us)"]) == min(lows) and float(row["Max Time(us)"]) == max(highs)
            assert float(row["Avg Time(us)"]) == pytest.approx(total / count, abs=0.002)
        assert sum(float(r["Ratio(%)"]) for r in got.values()) == pytest.approx(100, abs=0.05)
        totals = [float(r["Total Time(us)"]) for r in rows if r["Device_id"] == str(device)]
        assert totals == sorted(totals, reverse=True)
        assert sum(int(r["Count"]) for r in got.values()) > len(files)  # summed, not one iteration's


def key(event: dict) -> tuple:
    return event["ph"], event["name"], event.get("ts"), event.get("dur")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["msprof", "step_trace", "hccl", "task_time"])
def test_timelines_hold_every_event_with_a_pid_block_per_device(job: Path, name: str) -> None:
    [path] = [p for n, p in assembled(job).items() if n.startswith(f"{name}_") and n.endswith(".json")]
    events = check_timeline(path)  # a bare array as msprof writes it: schema, nesting, flows, names
    inputs = per_iteration(job, "timeline", name)
    for device, files in inputs.items():
        assert len(files) == STEPS
        mine = [e for e in events if group_of(e["pid"]) == device]
        want = [e for f in files for e in json.loads(f.read_text())]
        # every event, but each track named once (each per-iteration file names its tracks)
        assert Counter(key(e) for e in mine if e["ph"] != "M") == \
            Counter(key(e) for e in want if e["ph"] != "M")
        metadata = [(e["pid"], e["name"], e.get("tid"), json.dumps(e["args"]))
                    for e in mine if e["ph"] == "M"]
        assert len(metadata) == len(set(metadata))
        assert {m[1] for m in metadata} == {e["name"] for e in want if e["ph"] == "M"}
        labels = {e["args"]["labels"] for e in mine if e["name"] == "process_labels"}
        assert labels <= {"CPU", f"NPU {device}"}  # (step_trace files carry no labels)
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert len({p for p, _ in names}) == len(names)  # one pid, one name


@pytest.mark.slow
def test_slicing_and_a_second_export_replaces_the_folder(job: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    prof = tmp_path / job.name
    shutil.copytree(job, prof)
    stale = prof / cann8.FOLDER / "stale_20000101000000.csv"
    stale.write_text("x\n")
    [whole] = [p for n, p in assembled(prof).items() if n.startswith("op_summary_")]
    with open(whole, newline="") as handle:
        header, *rows = list(csv.reader(handle))
    limit = len(rows) // 3 + 1
    monkeypatch.setattr(cann8, "MAX_ROWS", limit)
    result = cann8.assemble(prof, stamp="20991231235959")
    files = assembled(prof)
    assert stale.name not in files and not any("20991231235959" not in n for n in files), files
    assert sorted(p.name for p in prof.iterdir() if p.name.startswith(".")) == []  # no staging left
    slices = sorted((n for n in files if n.startswith("op_summary_slice_")),
                    key=lambda n: int(n.split("_")[3]))
    assert slices == [f"op_summary_slice_{i}_20991231235959.csv" for i in range(3)]
    joined = []
    for name in slices:
        with open(files[name], newline="") as handle:
            slice_header, *slice_rows = list(csv.reader(handle))
        assert slice_header == header and 0 < len(slice_rows) <= limit
        assert result.files[name] == len(slice_rows)
        joined += slice_rows
    assert joined == rows
    # a table under the limit is one file, without a slice number
    assert "communication_statistic_20991231235959.csv" in files


@pytest.mark.slow
def test_per_rank_export_one_prof_per_rank_with_analyze(job: Path, tmp_path: Path) -> None:
    """`--per-rank DIR`: a PROF_ per rank (device folder, CANN 8 layout, analyze/), every collective
    of the rank keyed as msprof keys it, wait + transit = elapse; an existing DIR is refused."""
    out = tmp_path / "ranks"
    proc = jobprof_cli("export", str(job), "--per-rank", str(out))
    assert proc.returncode == 0, proc.stderr
    folders = sorted(out.iterdir())
    assert [f.name[-4:] for f in folders] == ["R000", "R001"]
    for rank, folder in enumerate(folders):
        assert re.fullmatch(r"PROF_\d{6}_\d{17}_[A-Z]{12}R\d{3}", folder.name)
        assert {p.name for p in folder.iterdir()} == {f"device_{rank}", cann8.FOLDER, "analyze"}
        assert not (folder / f"device_{rank}" / "data").exists()  # raw data stays in the job's folder
        communication = json.loads((folder / "analyze" / "communication.json").read_text())
        matrix = json.loads((folder / "analyze" / "communication_matrix.json").read_text())
        calls = [e for f in per_iteration(job, "timeline", "hccl")[rank] for e in json.loads(f.read_text())
                 if e["ph"] == "X"]
        assert len(communication) == len(calls) > 0 and set(matrix) == set(communication)
        for key, info in communication.items():
            assert re.fullmatch(r"hcom_(allReduce|allGather|broadcast|barrier)__\d+_0_1@\S+", key), key
            time = info["Communication Time Info"]
            assert abs(time["Wait Time(ms)"] + time["Transit Time(ms)"] - time["Elapse Time(ms)"]) < 1e-5
            assert list(matrix[key]) == [f"{rank}-{rank}"]
    again = jobprof_cli("export", str(job), "--per-rank", str(out))
    assert again.returncode == 1 and f"--per-rank {out} exists" in again.stderr


@pytest.mark.slow
def test_per_rank_export_of_collectives_without_group_ranks(job: Path, tmp_path: Path) -> None:
    """A collective whose group ranks are N/A (written so before the capture took them when the
    group is first used) keys the rank's own link by its rank in the group, not as rank 0's."""
    from jobprof.analysis import per_rank

    prof = tmp_path / job.name
    shutil.copytree(job, prof)
    files = per_iteration(prof, "timeline", "hccl")[1]
    for file in files:
        events = json.loads(file.read_text())
        for event in events:
            if event["ph"] == "X":
                event["args"]["group ranks"] = "N/A"
        file.write_text(json.dumps(events))
    result = per_rank.split(prof, tmp_path / "ranks")
    matrix = json.loads((result.folders[1] / "analyze" / "communication_matrix.json").read_text())
    assert matrix and {link for links in matrix.values() for link in links} == {"1-1"}
