"""Machine peaks measured with torch on this CPU: plausible, bounded in time, and side-effect free;
and kept per machine and setting (jobprof.ops.calcache): a hit gives the same peaks in
milliseconds, any other setting, an old or a damaged file is measured again, and no cache problem
reaches the job."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from conftest import Runner, read_csv
from jobprof.ops import calcache
from jobprof.ops.calibrate import calibrate, calibrate_cached, method_key

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cpu_result():
    threads = torch.get_num_threads()
    precision = torch.get_float32_matmul_precision()
    dtype = torch.get_default_dtype()
    result = calibrate(torch)
    # the job's torch settings are exactly as they were
    assert torch.get_num_threads() == threads
    assert torch.get_float32_matmul_precision() == precision
    assert torch.get_default_dtype() == dtype
    return result


def test_cpu_figures_are_positive_and_plausible(cpu_result):
    assert "error" not in cpu_result, cpu_result.get("error")
    assert cpu_result["device"] == "cpu"
    # only float32 on CPU; matmul beating add is likely but not guaranteed, so not asserted
    assert set(cpu_result["matmul_flops_per_s"]) == {"float32"}
    # plausible, not fast: under CI's full load a 2-core VM measured 8.8e7 vector FLOP/s once
    # (idle: ~1e9); a unit error (per ms, per µs) would be off by 1e3 or more
    assert cpu_result["matmul_flops_per_s"]["float32"] > 1e7
    assert cpu_result["vector_flops_per_s"]["float32"] > 1e7
    assert cpu_result["memory_bytes_per_s"] > 1e7
    assert cpu_result["matmul_n"]["float32"] >= 256
    assert cpu_result["memory_buffer_bytes"] >= 64 << 20
    assert "read + write" in cpu_result["memory_bytes_counted"]
    assert cpu_result["threads"] == torch.get_num_threads()


def test_cpu_calibration_is_quick_and_json_ready(cpu_result):
    assert 0 < cpu_result["seconds"] < 2
    assert json.loads(json.dumps(cpu_result)) == cpu_result


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_an_error_not_an_exception():
    result = calibrate(torch, device="cuda")
    assert result["device"] == "cuda"
    assert "CUDA is not available" in result["error"]


@pytest.mark.parametrize("device", ["meta", "no-such-device"])
def test_devices_it_cannot_measure_give_an_error(device):
    result = calibrate(torch, device=device)
    assert set(result) == {"device", "error"} and result["error"]


def test_a_broken_torch_gives_an_error():
    result = calibrate(object())
    assert result["device"] == "cpu" and "AttributeError" in result["error"]


# -- the calibration cache (jobprof.ops.calcache) ---------------------------------------------
# One real calibration, kept in a module-wide folder (each test that changes the cache works on
# a copy of it); the misses that only need to tell a miss from a hit measure with ``fake``.
PEAKS = ("matmul_flops_per_s", "vector_flops_per_s", "memory_bytes_per_s")


class Fake:
    """A measurement that counts its calls and returns fixed peaks at once."""

    def __init__(self, matmul: float = 1e9, memory: float = 1e9) -> None:
        self.calls = 0
        self.matmul, self.memory = matmul, memory

    def __call__(self, torch_: object, device: str) -> dict:
        self.calls += 1
        return {"device": device, "matmul_flops_per_s": {"float32": self.matmul},
                "matmul_n": {"float32": 256}, "vector_flops_per_s": {"float32": 1e9},
                "vector_elements": 1 << 16, "memory_bytes_per_s": self.memory,
                "memory_buffer_bytes": 64 << 20}


def lookup(folder: Path, measure=None, **kwargs) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    if measure is not None:
        kwargs["measure"] = measure
    result = calibrate_cached(torch, "cpu", warn=warnings.append, folder=folder, **kwargs)
    return result, warnings


def peaks(result: dict) -> tuple:
    return tuple(json.dumps(result[name], sort_keys=True) for name in PEAKS)


def key() -> dict:
    return calcache.machine_key(torch, "cpu", method_key())


def the_file(folder: Path) -> Path:
    return folder / calcache.file_name(key())


def edit(path: Path, change) -> None:
    entry = json.loads(path.read_text())
    change(entry)
    path.write_text(json.dumps(entry))


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(folder, result): a real calibration measured into an empty cache folder, kept as quiet
    whatever the load (the quiet rule has its own test)."""
    folder = tmp_path_factory.mktemp("cache") / "jobprof"
    result, warnings = lookup(folder, quiet_share=math.inf)
    assert not warnings, warnings
    return folder, result


@pytest.fixture
def copy(cached: tuple[Path, dict], tmp_path: Path) -> Path:
    """A copy of the cache holding the real calibration, for a test that changes it."""
    folder = tmp_path / "jobprof"
    shutil.copytree(cached[0], folder)
    return folder


def test_a_measurement_is_stored_privately_under_its_key(cached):
    folder, result = cached
    assert result["source"] == "measured" and "error" not in result
    assert result["cache_note"] == "miss: no cached result; stored"
    path = the_file(folder)
    assert result["cache_file"] == str(path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    entry = json.loads(path.read_text())
    # the key is in the file, compared on reading, not only digested into its name
    assert entry["key"] == key()
    assert entry["key"]["torch"]["threads"] == torch.get_num_threads()
    assert entry["quiet"] is True and entry["measurements"] == 1
    assert peaks(entry["result"]) == peaks(result)
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_hit_gives_the_same_peaks_quickly(cached):
    folder, measured = cached
    started = time.perf_counter()
    found = key()
    key_s = time.perf_counter() - started
    started = time.perf_counter()
    result, warnings = lookup(folder, measure=Fake())  # a hit never measures
    hit_s = time.perf_counter() - started
    assert not warnings
    assert result["source"] == "cache" and result["cache_note"] == "hit"
    assert peaks(result) == peaks(measured)
    assert result["measured_at"] == measured["measured_at"] and result["cache_file"] == measured["cache_file"]
    assert found and key_s < 0.05, key_s  # about 1 ms
    assert hit_s < 0.05, hit_s  # about 1 ms (the measurement: 0.3-2 s)
    assert json.loads(json.dumps(result)) == result


def test_another_thread_count_is_a_miss_and_measures_for_it(cached):
    folder, _ = cached
    threads = torch.get_num_threads()
    other = threads - 1 if threads > 1 else 2
    try:
        torch.set_num_threads(other)
        result, warnings = lookup(folder, quiet_share=math.inf)  # the real measurement
    finally:
        torch.set_num_threads(threads)
    assert not warnings
    assert result["source"] == "measured" and result["threads"] == other
    assert result["cache_note"] == "miss: no cached result; stored"  # another key: another file
    assert len(list(folder.glob("calibration-*.json"))) == 2
    again, _ = lookup(folder, measure=Fake())
    assert again["source"] == "cache" and again["threads"] == threads


@pytest.mark.parametrize("change", ["precision", "edited key", "method version"])
def test_a_changed_setting_or_key_is_a_miss(copy, change, monkeypatch):
    fake = Fake()
    if change == "precision":
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")
        try:
            result, warnings = lookup(copy, measure=fake)
        finally:
            torch.set_float32_matmul_precision(precision)
    else:
        if change == "edited key":  # same file name, another key inside: never used
            edit(the_file(copy), lambda entry: entry["key"]["torch"].update(version="0.0"))
        else:
            from jobprof.ops import calibrate as module

            monkeypatch.setattr(module, "METHOD_VERSION", module.METHOD_VERSION + 1)
        result, warnings = lookup(copy, measure=fake)
    assert not warnings
    assert fake.calls == 1 and result["source"] == "measured"
    assert result["matmul_flops_per_s"] == {"float32": 1e9}
    if change == "edited key":
        assert result["cache_note"] == "miss: cached result of another setting (torch differ); stored"
        # replaced by this measurement under the right key
        assert json.loads(the_file(copy).read_text())["key"] == key()


def test_an_expired_result_is_measured_again(copy):
    edit(the_file(copy), lambda entry: entry.update(measured_at=time.time() - calcache.MAX_AGE_S - 60))
    fake = Fake()
    result, warnings = lookup(copy, measure=fake)
    assert not warnings and fake.calls == 1
    assert result["source"] == "measured"
    assert result["cache_note"] == "miss: cached result older than 30 days; stored"
    # replaced: the fresh one is used next, not the best of it and the expired one
    again, _ = lookup(copy, measure=fake)
    assert again["source"] == "cache" and again["matmul_flops_per_s"] == {"float32": 1e9}


@pytest.mark.parametrize("content", [b"", b"\x00\xff garbage", b"[1, 2]", b'{"format": 1, "key": 7}'])
def test_a_corrupt_file_warns_once_and_measures(copy, content):
    path = the_file(copy)
    path.write_bytes(content)
    fake = Fake()
    result, warnings = lookup(copy, measure=fake)
    assert fake.calls == 1 and result["source"] == "measured"
    if content.startswith(b"{"):  # valid JSON of another shape: a plain miss
        assert not warnings
    else:
        assert len(warnings) == 1 and "unreadable JSON" in warnings[0], warnings
        assert "measured for this job" in warnings[0]
    assert result["cache_note"].endswith("; stored")
    assert lookup(copy, measure=fake)[0]["source"] == "cache"


def test_a_symlinked_file_is_not_followed_nor_replaced(copy, tmp_path):
    path = the_file(copy)
    elsewhere = tmp_path / "planted.json"
    path.rename(elsewhere)  # a valid result: only the link makes it unusable
    path.symlink_to(elsewhere)
    fake = Fake()
    result, warnings = lookup(copy, measure=fake)
    assert fake.calls == 1 and result["source"] == "measured"
    assert len(warnings) == 1 and "symbolic link: not followed" in warnings[0]
    assert result["cache_note"].endswith("not stored: the cache file is not replaced")
    assert path.is_symlink()


def test_an_unusable_folder_warns_once_and_measures(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others could plant or swap files: refused
    link = tmp_path / "link"
    link.symlink_to(shared)
    for folder, said in [(blocker / "jobprof", "cannot use the cache folder"),
                         (shared, "others may write"), (link, "others may write")]:
        fake = Fake()
        result, warnings = lookup(folder, measure=fake)
        assert fake.calls == 1 and result["source"] == "measured", folder
        assert result["cache_file"] is None
        assert result["cache_note"] == "not stored: the cache folder cannot be used"
        assert len(warnings) == 1 and said in warnings[0], warnings
    assert list(shared.iterdir()) == []


@pytest.mark.skipif(getattr(os, "geteuid", lambda: -1)() != 0, reason="needs root to give a folder away")
def test_a_folder_of_another_user_is_refused(copy):
    os.chown(copy, 65534, 65534)
    fake = Fake()
    result, warnings = lookup(copy, measure=fake)
    assert fake.calls == 1 and result["source"] == "measured"
    assert len(warnings) == 1 and "is not the user's" in warnings[0]


def test_a_disturbed_measurement_serves_briefly_and_a_quiet_one_replaces_it(tmp_path):
    folder = tmp_path / "jobprof"
    fake = Fake(matmul=1e9)
    result, _ = lookup(folder, measure=fake, quiet_share=-1.0)  # every share counts as disturbed
    share = result["other_cpu_share"]
    assert isinstance(share, float) and share >= 0  # read from /proc/stat around the measurement
    assert result["cache_note"].startswith("miss: no cached result; stored for 120 s only: other processes")
    assert json.loads(the_file(folder).read_text())["quiet"] is False
    # the job's other ranks (right after) reuse it
    hit, _ = lookup(folder, measure=fake, quiet_share=-1.0)
    assert hit["source"] == "cache" and hit["cache_note"].startswith("hit: a measurement disturbed")
    # later jobs measure again, and a quiet measurement replaces it (not the best of both)
    edit(the_file(folder), lambda entry: entry.update(measured_at=time.time() - calcache.DISTURBED_AGE_S - 1))
    quiet = Fake(matmul=5e8)
    result, _ = lookup(folder, measure=quiet, quiet_share=math.inf)
    assert quiet.calls == 1
    assert result["cache_note"] == "miss: cached result disturbed and older than 120 s; stored"
    entry = json.loads(the_file(folder).read_text())
    assert entry["quiet"] is True and entry["result"]["matmul_flops_per_s"] == {"float32": 5e8}


def racing(path: Path, theirs: Fake, quiet: bool, ours: Fake):
    """A measurement during which another process stores its own result (it did not get the lock
    in time): ``theirs``, quiet or not."""

    def measure(torch_, device):
        figures = theirs(torch_, device)
        figures["matmul_n"] = {"float32": 1024}
        path.write_text(json.dumps({"format": calcache.FORMAT, "key": key(),
                                    "measured_at": time.time(), "quiet": quiet, "other_cpu_share": 0.0,
                                    "measurements": 1, "result": figures}))
        return ours(torch_, device)

    return measure


def test_two_measurements_that_meet_keep_the_best_of_each_peak(tmp_path):
    folder = tmp_path / "jobprof"
    path = the_file(folder)
    measure = racing(path, Fake(matmul=4e9, memory=1e8), True, Fake(matmul=1e9, memory=3e9))
    result, warnings = lookup(folder, measure=measure, quiet_share=math.inf)
    assert not warnings and result["cache_note"] == "miss: no cached result; stored"
    entry = json.loads(path.read_text())
    assert entry["measurements"] == 2
    assert entry["result"]["matmul_flops_per_s"] == {"float32": 4e9}
    assert entry["result"]["matmul_n"] == {"float32": 1024}  # the size that peak was reached at
    assert entry["result"]["memory_bytes_per_s"] == 3e9


def test_a_disturbed_measurement_never_replaces_a_quiet_one(tmp_path):
    folder = tmp_path / "jobprof"
    path = the_file(folder)
    measure = racing(path, Fake(matmul=1e8), True, Fake(matmul=9e9))
    result, _ = lookup(folder, measure=measure, quiet_share=-1.0)
    assert result["matmul_flops_per_s"] == {"float32": 9e9}  # this job uses its own
    assert result["cache_note"].endswith("not stored: disturbed, and a quiet measurement is cached")
    assert json.loads(path.read_text())["result"]["matmul_flops_per_s"] == {"float32": 1e8}


def test_the_cache_folder_follows_the_environment():
    assert calcache.cache_dir({"JOBPROF_CACHE_DIR": "/x/y", "XDG_CACHE_HOME": "/c"}) == Path("/x/y")
    assert calcache.cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/jobprof")
    home = Path.home() / ".cache" / "jobprof"
    assert calcache.cache_dir({"XDG_CACHE_HOME": "relative"}) == home  # the XDG spec ignores it
    assert calcache.cache_dir({}) == home


# -- in a real job ------------------------------------------------------------------------------
JOB = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(64, 16), torch.randn(64, 1)
for step in range(3):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"loss {loss.item()!r}")
"""


def test_a_job_measures_once_and_then_reads_the_cache(tmp_path):
    """Two jobs on one cache folder: the first measures, the second reads what the first kept
    (same peaks, a start-up of milliseconds); both train exactly as unprofiled; old info.json
    files (no provenance keys) export as before."""
    from jobprof.engine.manager import PluginManager
    from jobprof.files import export

    folder = tmp_path / "cache"
    options = {"training_trace": "on", "task_trace": "on", "aic_metrics": "PipeUtilization"}
    plain = Runner(tmp_path / "plain")
    plain.tmp.mkdir()
    losses = plain.run(JOB, mode=None).stdout
    assert losses.count("loss ") == 3
    infos, devices = [], []
    for name in ("first", "second"):
        runner = Runner(tmp_path / name)
        runner.tmp.mkdir()
        proc = runner.run(JOB, options, env={"JOBPROF_CACHE_DIR": str(folder)})
        assert proc.stdout == losses  # the calibration draws nothing from the job's generators
        assert "jobprof" not in proc.stderr, proc.stderr
        devices.append(runner.device_dir())
        infos.append(json.loads((devices[-1] / "info.json.0").read_text())["jobprof"])
    first, second = (info["calibration"] for info in infos)
    assert first["source"] == "measured" and first["cache_note"].startswith("miss: no cached result; stored")
    assert second["source"] == "cache" and second["cache_note"].startswith("hit")
    assert second["cache_file"] == first["cache_file"] and Path(first["cache_file"]).parent == folder
    assert second["measured_at"] == first["measured_at"]
    assert peaks(second) == peaks(first)
    startup = [info["own_startup_ms"]["calibration"] for info in infos]
    assert startup[1] < 100, startup  # a few ms; the measurement: 300 ms or more
    assert startup[1] < startup[0], startup

    # an info.json written before the cache (no provenance keys) renders the same columns
    device = devices[1]
    mac_before = [r["mac_time(us)"] for p in sorted((device / "summary").glob("op_summary_*.csv"))
                  for r in read_csv(p)]
    info_path = device / "info.json.0"
    info = json.loads(info_path.read_text())
    for name in calcache._PROVENANCE:
        del info["jobprof"]["calibration"][name]
    info_path.write_text(json.dumps(info))
    for old in (device / "summary").glob("*.csv"):
        old.unlink()
    manager = PluginManager()
    manager.load_entry_points()
    assert not export.export_device(device, manager).problems
    mac_after = [r["mac_time(us)"] for p in sorted((device / "summary").glob("op_summary_*.csv"))
                 for r in read_csv(p)]
    assert mac_after == mac_before and any(v not in ("N/A", "0.000") for v in mac_after)

