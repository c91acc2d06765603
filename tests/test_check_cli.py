"""`jobprof check [--options JSON] [--json]`: the effective config, or every problem; exit 0/1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import clean_env, jobprof_cli
from distributions import make_dist
from jobprof.engine import options

DEFAULT_SOURCE = "msprof default options (PROFILING_OPTIONS empty or unset)"


def check_json(*args: str, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> tuple[int, dict[str, Any]]:
    proc = jobprof_cli("check", "--json", *args, env=env, cwd=cwd)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("env", [{}, {"PROFILING_OPTIONS": ""}], ids=["unset", "empty"])
def test_default_options(env: dict[str, str], tmp_path: Path) -> None:
    code, result = check_json(env=env, cwd=tmp_path)
    assert code == 0 and result["valid"] is True and result["problems"] == []
    assert result["source"] == DEFAULT_SOURCE
    config = result["config"]
    # msprof's default set (docs/msprof.md section 1), output resolved against the cwd
    assert {k: config[k] for k in options.MSPROF_DEFAULT} == {
        **options.MSPROF_DEFAULT, "output": str(tmp_path.resolve())}
    assert config["l2"] == "off" and "task_time" not in config
    assert result["explicit"] == sorted(options.MSPROF_DEFAULT)
    assert result["collected_by"]["training_trace"] == "training_trace"
    assert "PROFILING_MODE is unset: a job started now would not be profiled" in result["notes"]


def test_default_table(tmp_path: Path) -> None:
    proc = jobprof_cli("check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{DEFAULT_SOURCE}: valid"
    assert lines[1].split() == ["key", "value", "from", "collected", "by"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:] if not line.startswith("note")}
    assert rows["training_trace"] == ['"on"', "set", "training_trace"]
    assert rows["l2"] == ['"off"', "default", "l2"]
    assert rows["output"] == [json.dumps(str(tmp_path.resolve())), "set", "core"]
    assert rows["aic_metrics"][0] == '"PipeUtilization"'


def test_good_options_effective_values(tmp_path: Path) -> None:
    given = {"task_trace": "l2", "task_time": "l0", "aic_metrics": "", "output": "runs/prof",
             "storage_limit": "100MB"}
    code, result = check_json("--options", json.dumps(given), cwd=tmp_path)
    assert code == 0, result
    config = result["config"]
    assert config["task_trace"] == "l0"  # task_time wins
    assert config["aic_metrics"] == "PipeUtilization"  # present but empty
    assert config["output"] == str(tmp_path.resolve() / "runs" / "prof")
    assert config["storage_limit"] == "200MB"  # raised to msprof's minimum, with a note
    assert "storage_limit '100MB' is below the minimum; using 200MB (as msprof does)" \
        in result["notes"]
    assert result["source"] == "--options"
    assert result["explicit"] == sorted(given)
    assert not (tmp_path / "runs").exists()  # checking creates nothing


BAD_OPTIONS = {"trainig_trace": "on", "host_sys_usage_freq": "10", "storage_limit": "200 MB"}
BAD_LINES = [
    '  $.host_sys_usage_freq: must be an integer (a JSON number, without quotes), not a string '
    '(got "10")',
    "  $.storage_limit: must be '<digits>MB' with no space and the unit, e.g. \"2048MB\" "
    '(got "200 MB")',
    '  $.trainig_trace: unknown option key; did you mean "training_trace"? (got "on")',
]


def test_invalid_table(tmp_path: Path) -> None:
    proc = jobprof_cli("check", "--options", json.dumps(BAD_OPTIONS), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""  # problems go to stderr, as every command's errors
    assert proc.stderr.splitlines() == ["--options: invalid (3 problem(s))", *BAD_LINES]


def test_invalid_json_from_environment(tmp_path: Path) -> None:
    code, result = check_json(env={"PROFILING_OPTIONS": json.dumps(BAD_OPTIONS)}, cwd=tmp_path)
    assert code == 1 and result["valid"] is False and result["config"] is None
    assert result["source"] == "PROFILING_OPTIONS"
    assert result["problems"] == [
        {"path": "$.host_sys_usage_freq", "value": "10",
         "message": "must be an integer (a JSON number, without quotes), not a string"},
        {"path": "$.storage_limit", "value": "200 MB",
         "message": "must be '<digits>MB' with no space and the unit, e.g. \"2048MB\""},
        {"path": "$.trainig_trace", "value": "on",
         "message": 'unknown option key; did you mean "training_trace"?'},
    ]


@pytest.mark.parametrize(("text", "line"), [
    ("[1]", '  $: must be a JSON object {...}, not an array (got [1])'),
    ('{"l2": "on" "hccl": "on"}', "  $: invalid JSON: Expecting ',' delimiter at line 1, column 13"),
])
def test_not_an_object(text: str, line: str, tmp_path: Path) -> None:
    proc = jobprof_cli("check", "--options", text, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[1].startswith(line)


def test_lookalike_mode_noted(tmp_path: Path) -> None:
    code, result = check_json(env={"PROFILING_MODE": "True"}, cwd=tmp_path)
    assert code == 0
    assert "PROFILING_MODE is 'True': a job started now would not be profiled" in result["notes"]


def _ro_mount_works(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {tmp_path} "
                            f"{tmp_path} && ! touch {tmp_path}/x"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh folder with a short path: the message below quotes the output value whole only up
    to 80 characters, and tmp_path grows by ``popen-gwN/`` under ``pytest -n``."""
    path = Path(tempfile.mkdtemp(prefix="jobprof-ro-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_output_on_read_only_filesystem(short_tmp: Path) -> None:
    """A read-only bind mount, private to one child (``unshare -m``): nothing leaks out."""
    target = short_tmp / "ro"
    target.mkdir()
    if not _ro_mount_works(target):
        pytest.skip("cannot make a read-only bind mount here (needs unshare -m and mount)")
    exe = Path(sys.executable).with_name("jobprof")
    opts = json.dumps({"output": str(target / "prof")})
    script = f"mount --bind -o ro {target} {target} && exec {exe} check --options '{opts}'"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[1] == (
        f"  $.output: is not writable: cannot create a directory in '{target}' "
        f'(Read-only file system) (got "{target / "prof"}")')
    ok = jobprof_cli("check", "--options", opts)  # the same directory outside the mount
    assert ok.returncode == 0, ok.stdout


DEMO_PLUGIN = """
from jobprof.plugin.hookspec import hookimpl

@hookimpl
def jobprof_options_schema():
    return {"properties": {"demo_rate": {"type": "integer", "minimum": 1, "default": 10}}}
"""


def test_third_party_plugin_key(tmp_path: Path) -> None:
    root = make_dist(tmp_path / "site", "jobprof-demo", {"jobprof_demo": DEMO_PLUGIN},
                     {"demo": "jobprof_demo"})
    env = {"PYTHONPATH": str(root)}
    code, result = check_json("--options", '{"demo_rate": 0}', env=env, cwd=tmp_path)
    assert code == 1
    assert result["problems"] == [
        {"path": "$.demo_rate", "message": "must be an integer >= 1", "value": 0}]
    code, result = check_json(env=env, cwd=tmp_path)
    assert code == 0
    assert result["config"]["demo_rate"] == 10  # the plugin's default is filled in
    assert result["collected_by"]["demo_rate"] == "demo"
