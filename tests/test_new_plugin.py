"""A new built-in plugin is one folder and one entry-point line: nothing else to register.

In a copy of the build inputs (the files git knows, tests/test_packaging.copy_sources), the test
adds ``plugins/hello/__init__.py`` (a real plugin: an option key, a record per iteration, a CSV
writer, from ``jobprof.plugin`` only) and one line to ``[project.entry-points.jobprof]``, builds a
wheel without isolation (no network), unpacks it, and runs a real SGD loop under
``PROFILING_MODE=true`` from the unpacked copy (``PYTHONPATH``: it comes before site-packages, so
the editable checkout installed there is not what runs; importlib.metadata takes the first
``jobprof`` distribution on ``sys.path``, the unpacked one with the new entry point).  The
plugin's files must be written with what it recorded, and ``jobprof plugins`` from the unpacked
copy must list it active.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_packaging import build_wheel, copy_sources, package_dirs, project, wheel_entry_points, wheel_path

from conftest import REPO, Runner, clean_env, raw

NAME = "hello"
ENTRY_POINT = f'{NAME} = "jobprof.plugins.{NAME}"'
STEPS = 3
PLUGIN = '''\
"""hello: every iteration's duration, one CSV per iteration (tests/test_new_plugin.py)."""

from jobprof.plugin import WriterSpec, hookimpl


@hookimpl
def jobprof_options_schema():
    return {"properties": {"hello": {"$ref": "#/$defs/switch", "default": "off",
                                     "description": "every iteration's duration"}}}


@hookimpl
def jobprof_configure(config):
    return config.is_on("hello")


@hookimpl
def jobprof_iteration_end(iteration):
    return {"hello": [{"index": iteration.index, "ns": iteration.end_ns - iteration.start_ns}]}


def render_csv(ctx):  # from the records only: `jobprof export` renders it again, offline
    rows = "".join(f"{r['index']},{r['ns']}\\n" for r in ctx.records("hello"))
    return "Iteration ID,Duration(ns)\\n" + rows


@hookimpl
def jobprof_writers(config):
    return [WriterSpec("hello", "csv", render_csv, "every iteration's duration")]
'''
JOB = f"""
import importlib.metadata
import json
import sys

import torch
from torch import nn

import jobprof

torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range({STEPS}):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
loaded = {{name: getattr(sys.modules.get(name), "__file__", None)
          for name in ("jobprof", "jobprof._autoload", "jobprof.plugins.{NAME}")}}
loaded["metadata"] = str(importlib.metadata.distribution("jobprof").locate_file("jobprof/__init__.py"))
print(json.dumps(loaded))
"""


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _add_entry_point(pyproject: Path) -> None:
    """Append ENTRY_POINT to the ``[project.entry-points.jobprof]`` table, as a person would."""
    lines = pyproject.read_text(encoding="utf-8").splitlines(keepends=True)
    start = lines.index("[project.entry-points.jobprof]\n")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    while not lines[end - 1].strip():  # after the table's last entry, before its blank lines
        end -= 1
    lines.insert(end, ENTRY_POINT + "\n")
    pyproject.write_text("".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tree = tmp_path_factory.mktemp("tree")
    copy_sources(tree)
    before = _digests(tree)
    (tree / "plugins" / NAME).mkdir()
    (tree / "plugins" / NAME / "__init__.py").write_text(PLUGIN, encoding="utf-8")
    _add_entry_point(tree / "pyproject.toml")
    after = _digests(tree)  # read before the build writes build/ and *.egg-info into the tree
    wheel = build_wheel(tree, tmp_path_factory.mktemp("dist"))
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        scripts = wheel_entry_points(whl, "console_scripts")
        whl.extractall(site)
    return {"tree": tree, "before": before, "after": after, "names": names, "site": site,
            "scripts": scripts}


def test_only_the_folder_and_one_line_were_added(built):
    before, after = built["before"], built["after"]
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    assert changed == [f"plugins/{NAME}/__init__.py", "pyproject.toml"]
    assert f"plugins/{NAME}/__init__.py" not in before
    tree = built["tree"]
    diff = [line for line in difflib.ndiff((REPO / "pyproject.toml").read_text().splitlines(),
                                           (tree / "pyproject.toml").read_text().splitlines())
            if line[:1] in "+-?"]
    assert diff == [f"+ {ENTRY_POINT}"]
    assert project(tree)["project"]["entry-points"]["jobprof"][NAME] == f"jobprof.plugins.{NAME}"


def test_the_wheel_ships_the_new_folder(built):
    names = built["names"]
    assert f"jobprof/plugins/{NAME}/__init__.py" in names
    # and exactly the tree's sources besides the metadata (nothing else changed)
    mapping = package_dirs(built["tree"])
    sources = {wheel_path(path, mapping) for path in built["after"]
               if path.startswith(tuple(f"{folder}/" for folder in mapping))}
    shipped = {n for n in names if ".dist-info/" not in n and n != "jobprof-autoload.pth"}
    assert shipped == sources


def test_the_new_plugin_profiles_a_real_training_loop_from_the_wheel(built, tmp_path):
    site = built["site"]
    runner = Runner(tmp_path)
    proc = runner.run(JOB, {NAME: "on", "task_trace": "off"}, env={"PYTHONPATH": str(site)})
    assert "jobprof:" not in proc.stderr, proc.stderr  # no warning, no disabled plugin
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, path in loaded.items():  # the unpacked wheel ran, not the editable checkout
        assert path and Path(path).is_relative_to(site), f"{name} came from {path}, not {site}"
    device = runner.device_dir()
    assert NAME in json.loads((device / "info.json.0").read_text())["jobprof"]["plugins"]
    records = raw(device)
    for i in range(1, STEPS + 1):
        [it] = records[i]["iteration"]
        assert records[i][NAME] == [{"index": i, "ns": it["end_ns"] - it["start_ns"]}]
        csv = device / "summary" / f"{NAME}_0_4294967295_{i}.csv"
        assert csv.read_text() == f"Iteration ID,Duration(ns)\n{i},{it['end_ns'] - it['start_ns']}\n"


def test_jobprof_plugins_lists_it_active(built, tmp_path):
    module, _, func = built["scripts"]["jobprof"].partition(":")  # the console script, as installed
    code = (f"import sys, jobprof; print(jobprof.__file__, file=sys.stderr); from {module} import {func}; "
            f"sys.argv[0] = 'jobprof'; sys.exit({func}())")
    proc = subprocess.run([sys.executable, "-c", code, "plugins", "--json"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120, env=clean_env(PYTHONPATH=str(built["site"])))
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stderr.splitlines()[0]).is_relative_to(built["site"]), proc.stderr
    records = {r["name"]: r for r in json.loads(proc.stdout)}
    record = records[NAME]
    assert (record["distribution"], record["status"], record["error"]) == ("jobprof", "active", "")
    assert record["option_keys"] == [NAME]
    assert record["files"] == [f"summary/{NAME}_<dev>_<model>_<iter>.csv"]
    failed = {name: r["error"] for name, r in records.items() if r["status"] != "active"}
    assert not failed  # every built-in loads from the wheel too
    assert not re.search(r"jobprof: (warning|error)", proc.stderr), proc.stderr
