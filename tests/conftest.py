"""Shared fixtures: run real Python programs under PROFILING_MODE and read what they wrote."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``-n 2`` (``--dist loadgroup``, pyproject): each module's tests on one worker, so its
    module-scoped fixture (most hold a real profiled job) runs once.  The compatibility matrix's
    tests share no fixture and run minutes each: they spread one by one."""
    for item in items:
        if item.path.parent.name != "compat":
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    # the matrix's rows first (``--no-loadscope-reorder`` keeps this order): the longest tests
    # (up to 5 minutes each) start while the modules fill the other worker, not as a lone tail
    items.sort(key=lambda item: item.path.parent.name != "compat")


def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """The grouping above is xdist's ``@group`` suffix on node ids; when an xdist / pytest pair
    stops writing it (pytest-xdist#1386: pytest 9.2), nothing fails, each module's fixture
    just runs on both workers and the suite takes twice as long.  Stop instead (in the
    controller, which sees the ids each worker collected)."""
    grouped = [nodeid for nodeid in ids if "/compat/" not in nodeid]  # the matrix is not grouped
    if grouped and not any("@" in nodeid for nodeid in grouped):
        raise pytest.UsageError("--dist loadgroup does not group here (pytest-xdist#1386: pytest 9.2 drops "
                                "the group tag from node ids); install the test extra's pytest (<9.2)")


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any jobprof/profiling variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PROFILING_", "JOBPROF_")) and k not in ("LOCAL_RANK", "RANK")}
    # the suite keeps both cores busy: a background exporter at nice 19 (its default) would get
    # almost no CPU while a test waits for its files
    env["JOBPROF_EXPORTER_NICE"] = "0"
    env["JOBPROF_CACHE_DIR"] = calibration_cache()
    env.update(extra)
    return env


_CACHE: list[str] = []


def calibration_cache() -> str:
    """The calibration cache folder of this test process's jobs (jobprof.ops.calcache), never the
    user's ``~/.cache/jobprof``: nothing is left behind and no earlier run decides whether a job
    measures; removed at exit."""
    if not _CACHE:
        _CACHE.append(tempfile.mkdtemp(prefix="jobprof-cache-"))
        atexit.register(shutil.rmtree, _CACHE[0], True)
    return _CACHE[0]


def wait_rendered(output: Path, timeout: float = 120) -> None:
    """Wait for the background exporters of every profile under ``output`` (a job hands what
    it did not render itself to one: option ``export``), as a user reading the
    files would (``jobprof export --wait``)."""
    from jobprof.files import handover

    for device_dir in output.glob("PROF_*/device_*"):
        assert handover.wait(device_dir, timeout), f"{device_dir}: the background exporter is still rendering"


class Runner:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.out = tmp_path / "prof"

    def script(self, body: str, name: str = "job.py") -> Path:
        path = self.tmp / name
        path.write_text(textwrap.dedent(body))
        return path

    def run(self, script: Path | str, options: dict | str | None = None, *, mode: str | None = "true",
            args: list[str] | None = None, env: dict[str, str] | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run ``script`` with PROFILING_MODE/PROFILING_OPTIONS set; output defaults to self.out."""
        if isinstance(script, str):
            script = self.script(script)
        extra: dict[str, str] = {}
        if mode is not None:
            extra["PROFILING_MODE"] = mode
        if options is not None:
            if isinstance(options, dict):
                # every file rendered before the job returns, unless the test chooses: a
                # background exporter per job costs the suite a Python start-up each (minutes
                # over the suite); the default mode has its own tests (test_background_export,
                # test_faults) and runs in the compatibility matrix
                options = json.dumps({"output": str(self.out), "export": "inline", **options})
            extra["PROFILING_OPTIONS"] = options
        extra.update(env or {})
        proc = subprocess.run([sys.executable, str(script), *(args or [])], cwd=self.tmp,
                              env=clean_env(**extra), capture_output=True, text=True, timeout=timeout)
        wait_rendered(self.out)
        if check and proc.returncode != 0:
            raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def prof_dirs(self) -> list[Path]:
        return sorted(self.out.glob("PROF_*")) if self.out.exists() else []

    def device_dir(self, device: int = 0) -> Path:
        dirs = self.prof_dirs()
        assert len(dirs) == 1, f"expected one PROF_ dir, found {dirs}"
        return dirs[0] / f"device_{device}"


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    return Runner(tmp_path)


def loaded_manager():  # -> jobprof.engine.manager.PluginManager
    """A plugin manager with every installed entry point loaded, as the CLI builds one (imported
    here, not at the top: tests/test_same_output.py imports this module and nothing of jobprof)."""
    from jobprof.engine.manager import PluginManager
    from jobprof.plugin.reporter import Reporter

    manager = PluginManager(Reporter())
    manager.load_entry_points()
    return manager


def jobprof_cli(*args: str, env: dict[str, str] | None = None,
                cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the installed ``jobprof`` command (the console script, as a user would)."""
    exe = Path(sys.executable).with_name("jobprof")
    return subprocess.run([str(exe), *args], env=clean_env(**(env or {})), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def read_csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def raw(device_dir: Path) -> dict[int, dict[str, list]]:
    """Every iteration's raw streams on disk: ``{iteration: {stream: records}}``."""
    from jobprof.files import rawstore

    return dict(rawstore.read(device_dir))


def raw_iterations(device_dir: Path, stream: str = "iteration") -> list[int]:
    """Iterations whose raw line holds ``stream``."""
    return [i for i, streams in raw(device_dir).items() if stream in streams]


def ts_ns(value: float | str) -> int:
    """A timeline ``ts``/``dur`` in integer ns as Perfetto reads it (``llround(v * 1000)``),
    asserting the value holds a whole ns (job-relative time, jobprof.plugin.clock)."""
    scaled = float(value) * 1000
    whole = round(scaled)
    assert abs(scaled - whole) < 1e-3, f"{value!r} us is not a whole ns"
    return whole


def check_timeline(path: Path) -> list[dict]:
    """Load a timeline file and assert what viewers need; returns its events.

    The file validates against ``schemas/timeline.json``; every ``ts`` and ``dur`` is a whole
    ns; X events on each (pid, tid) track nest in integer ns (no partial overlap); every flow
    start has its end; each process has name and label.
    """
    import jsonschema

    from jobprof import schemas

    events = json.loads(path.read_text(encoding="utf-8"))
    errors = sorted(jsonschema.Draft202012Validator(schemas.load("timeline")).iter_errors(events),
                    key=lambda e: list(e.absolute_path))
    assert not errors, f"{path.name}: {errors[0].json_path}: {errors[0].message}"
    tracks: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for e in events:
        if e["ph"] == "X":
            ts = ts_ns(e["ts"])
            tracks.setdefault((e["pid"], e["tid"]), []).append((ts, ts + ts_ns(e["dur"]), e["name"]))
        elif "ts" in e and e["ph"] != "M":
            ts_ns(e["ts"])
    for track, spans in tracks.items():
        open_: list[tuple[int, int, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1][1] <= start:
                open_.pop()
            assert not open_ or end <= open_[-1][1], \
                f"{path.name}: track {track}: '{name}' [{start}, {end}] ns overlaps '{open_[-1][2]}' " \
                f"[{open_[-1][0]}, {open_[-1][1]}] without nesting"
            open_.append((start, end, name))
    flows: dict[tuple[str, str], set[str]] = {}
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            flows.setdefault((e["cat"], str(e["id"])), set()).add(e["ph"])
    for key, phases in flows.items():
        assert "s" in phases and phases & {"t", "f"}, f"{path.name}: flow {key} is not paired: {phases}"
    meta = {(e["pid"], e["name"]) for e in events if e["ph"] == "M"}
    for pid in {e["pid"] for e in events}:
        if any(p == pid for p, _ in meta):
            assert (pid, "process_name") in meta, f"{path.name}: pid {pid} has no process_name"
    return events


def time_axis(device_dir: Path):  # -> jobprof.plugin.clock.TimeAxis
    """The time rule the device's timelines were written with (jobprof.plugin.clock)."""
    from jobprof.files.export import read_meta
    from jobprof.plugin.clock import TimeAxis

    meta = read_meta(device_dir)
    return TimeAxis(meta.anchor, meta.time_base_ns)


def stamp_ts(cell: str, device_dir: Path) -> Decimal:
    """A CSV's absolute stamp (epoch µs, 3 decimals) as the exact timeline ``ts`` of that instant."""
    return Decimal(cell.strip()) - Decimal(time_axis(device_dir).base_ns) / 1000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(runner: Runner, script: Path, nproc: int, *args: str) -> Path:
    """A launcher script running ``script`` (with ``args``) under torchrun with ``nproc`` local ranks."""
    return runner.script(
        "import sys, runpy\n"
        f"sys.argv = ['torchrun', '--nnodes=1', '--nproc_per_node={nproc}', '--master_addr=127.0.0.1', "
        f"'--master_port={free_port()}', {str(script)!r}, *{list(args)!r}]\n"
        "runpy.run_module('torch.distributed.run', run_name='__main__')\n", "launch.py")
