"""CONTRIBUTING.md's example plugin, built from the document itself and run in a real job.

The example module, the pyproject.toml snippet and the example plugin test are extracted from
CONTRIBUTING.md; a test-local distribution is built from them (distribution name and entry point
taken from the snippet), a real SGD loop is profiled with the example's option on, and the files
the document promises are checked.  Editing the example so that it breaks, or changing the core so
that the example no longer works, fails here: the document cannot rot.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, Runner, jobprof_cli, read_csv
from distributions import make_dist
from jobprof.files import rawstore
from jobprof.plugin import read_raw
from jobprof.plugin.clock import ClockAnchor
from jobprof.plugin.values import STEP_MODE_MODEL_ID

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the snippet is still read by toml_strings()
    tomllib = None

DOC = REPO / "CONTRIBUTING.md"
MODULE_HEADING = "### The module: `jobprof_gc.py`"
PYPROJECT_HEADING = "### Registering it: `pyproject.toml`"
TEST_HEADING = "## 5. Testing a plugin"
STEPS = 4
CYCLES = 7  # reference cycles made per iteration: only the cycle collector can free them
MODEL = STEP_MODE_MODEL_ID

JOB = f"""
import gc

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range({STEPS}):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    for _ in range({CYCLES}):
        cycle = []
        cycle.append(cycle)
    del cycle
    gc.collect(0)
    opt.step()
print("training done")
"""


# -- reading the document ----------------------------------------------------------------------
def fenced(heading: str, lang: str) -> str:
    """The first ```lang block after the line ``heading`` of CONTRIBUTING.md."""
    text = DOC.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert heading in lines, f"CONTRIBUTING.md lost its heading {heading!r}"
    rest = "\n".join(lines[lines.index(heading) + 1:])
    match = re.search(rf"^```{re.escape(lang)}\n(.*?)^```[ \t]*$", rest, re.M | re.S)
    assert match, f"no ```{lang} block after {heading!r}"
    return match.group(1)


def toml_strings(snippet: str) -> dict[str, dict[str, str]]:
    """``{table: {key: string value}}`` of a pyproject snippet (string values only)."""
    tables: dict[str, dict[str, str]] = {}
    current = tables.setdefault("", {})
    for line in snippet.splitlines():
        line = line.split(" #", 1)[0].strip()
        if re.fullmatch(r"\[[^\[\]]+\]", line):
            current = tables.setdefault(line[1:-1].strip(), {})
        elif match := re.fullmatch(r'([A-Za-z0-9_.-]+)\s*=\s*"([^"]*)"', line):
            current[match.group(1)] = match.group(2)
    return tables


@pytest.fixture(scope="module")
def example() -> dict[str, str]:
    """The example's source, distribution name, version, plugin name and module, from the doc."""
    source = fenced(MODULE_HEADING, "python")
    snippet = fenced(PYPROJECT_HEADING, "toml")
    tables = toml_strings(snippet)
    if tomllib is not None:  # the snippet is valid TOML and says the same as the light reading
        parsed = tomllib.loads(snippet)
        assert parsed["project"]["name"] == tables["project"]["name"]
        assert parsed["project"]["entry-points"]["jobprof"] == tables["project.entry-points.jobprof"]
    [(plugin, target)] = tables["project.entry-points.jobprof"].items()
    return {"source": source, "snippet": snippet, "dist": tables["project"]["name"],
            "version": tables["project"]["version"], "plugin": plugin, "target": target,
            "module": target.split(":")[0]}


@pytest.fixture(scope="module")
def dist_root(example: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dist(tmp_path_factory.mktemp("contributing") / "site", example["dist"],
                     {example["module"]: example["source"]}, {example["plugin"]: example["target"]},
                     version=example["version"])


@pytest.fixture(scope="module")
def job(dist_root: Path, tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[Runner, subprocess.CompletedProcess]:
    runner = Runner(tmp_path_factory.mktemp("contributing_job"))
    # the example alone (task_trace is on by default, and its files are not the example's)
    proc = runner.run(JOB, {"gc_trace": "on", "task_trace": "off"}, env={"PYTHONPATH": str(dist_root)})
    return runner, proc


# -- the document's claims about the example -----------------------------------------------------
def test_example_is_a_short_valid_module(example):
    source = example["source"]
    ast.parse(source)
    code_lines = [line for line in source.splitlines() if line.strip()]
    assert len(code_lines) <= 45, "section 1 promises a plugin in about 40 lines"
    assert MODULE_HEADING.endswith(f"`{example['module']}.py`")
    for hook in ("jobprof_options_schema", "jobprof_configure", "jobprof_session_start",
                 "jobprof_iteration_end", "jobprof_session_end", "jobprof_writers"):
        assert re.search(rf"@hookimpl\ndef {hook}\(", source), hook


def test_pyproject_snippet_follows_the_publishing_rules(example):
    assert example["dist"] == "jobprof-gc" and example["module"] == "jobprof_gc"
    snippet = example["snippet"]
    assert re.search(r'^dependencies = \["jobprof[^"]*"\]$', snippet, re.M)  # torch is not one
    assert re.search(r'^torch = \["torch[^"]*"\]$', snippet, re.M)  # ... but an optional extra


# -- the example in a real job -------------------------------------------------------------------
def test_example_plugin_profiles_a_real_training_loop(job, example):
    runner, proc = job
    assert "training done" in proc.stdout
    assert "jobprof:" not in proc.stderr, proc.stderr  # no warning, no disabled plugin
    device = runner.device_dir()
    info = json.loads((device / "info.json.0").read_text())["jobprof"]
    assert example["plugin"] in info["plugins"]
    assert info["options"]["gc_trace"] == "on"
    anchor = ClockAnchor.from_info(json.loads((device / "start_info.0").read_text()))
    raw = dict(read_raw(device))  # the API's reader: the core's, less its operator windows
    assert raw == dict(rawstore.read(device)) and sorted(raw) == list(range(1, STEPS + 1))
    for i in range(1, STEPS + 1):
        [it], records = raw[i]["iteration"], raw[i]["gc"]
        assert records, f"iteration {i}: gc.collect(0) ran in it, but no collection was recorded"
        for r in records:
            assert set(r) == {"start_ns", "end_ns", "generation", "collected"}
            assert it["start_ns"] <= r["start_ns"] <= r["end_ns"] <= it["end_ns"]
            assert r["generation"] in (0, 1, 2) and r["collected"] >= 0
        assert 0 in [r["generation"] for r in records]  # the loop's own gc.collect(0)
        assert sum(r["collected"] for r in records) >= CYCLES  # the cycles made in the iteration
        rows = read_csv(device / "summary" / f"gc_0_{MODEL}_{i}.csv")
        assert rows == [{"Device_id": "0", "Iteration ID": str(i), "Generation": str(r["generation"]),
                         "Start(us)": f"{anchor.stamp(r['start_ns'])}\t",
                         "Duration(us)": f"{(r['end_ns'] - r['start_ns']) / 1000:.3f}",
                         "Collected": str(r["collected"])} for r in records]
    assert sorted(p.name for p in (device / "summary").iterdir()) == sorted(
        f"gc_0_{MODEL}_{i}.csv" for i in range(1, STEPS + 1))
    assert not list(device.glob("timeline/*"))  # the example writes no timeline file


def test_offline_export_renders_the_same_files(job, dist_root):
    runner, _ = job
    summary = runner.device_dir() / "summary"
    produced = {p.name: p.read_bytes() for p in summary.glob("gc_*.csv")}
    assert len(produced) == STEPS
    for name in produced:
        (summary / name).unlink()
    proc = jobprof_cli("export", str(runner.out), env={"PYTHONPATH": str(dist_root)})
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in summary.glob("gc_*.csv")} == produced


def test_jobprof_plugins_lists_the_example(dist_root, example, tmp_path):
    proc = jobprof_cli("plugins", "--json", env={"PYTHONPATH": str(dist_root)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = {r["name"]: r for r in json.loads(proc.stdout)}[example["plugin"]]
    assert record == {"name": example["plugin"], "distribution": example["dist"],
                      "version": example["version"], "status": "active", "error": "",
                      "option_keys": ["gc_trace"], "files": ["summary/gc_<dev>_<model>_<iter>.csv"]}


def test_jobprof_check_validates_the_example_option(dist_root, example, tmp_path):
    env = {"PYTHONPATH": str(dist_root)}
    proc = jobprof_cli("check", "--json", "--options", '{"gc_trace":"on"}', env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["config"]["gc_trace"] == "on"
    assert result["collected_by"]["gc_trace"] == example["plugin"]
    proc = jobprof_cli("check", "--options", '{"gc_trace":"yes"}', env=env, cwd=tmp_path)
    assert proc.returncode == 1
    # the message section 5 of the document shows
    assert '$.gc_trace: must be one of "on", "off" (or "" for the default) (got "yes")' in proc.stderr
    assert '$.gc_trace: must be one of "on", "off" (or "" for the default) (got "yes")' in \
        DOC.read_text(encoding="utf-8")


def test_the_documented_plugin_test_passes(dist_root, tmp_path, monkeypatch):
    """Section 5's test for the plugin's own repository, run as written (in this process; its
    job runs in a subprocess that finds the plugin through PYTHONPATH, like an installed one)."""
    namespace: dict = {}
    exec(compile(_documented_test(), f"{DOC.name} (section 5)", "exec"), namespace)
    for key in [k for k in os.environ if k.startswith(("PROFILING_", "JOBPROF_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PYTHONPATH", str(dist_root))
    namespace["test_gc_plugin"](tmp_path)


def _documented_test() -> str:
    """The complete example test of section 5 (the ```python block that defines a test)."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(TEST_HEADING):text.index("## 6. Publishing")]
    blocks = re.findall(r"^```python\n(.*?)^```[ \t]*$", section, re.M | re.S)
    [test] = [b for b in blocks if re.search(r"^def test_", b, re.M)]
    return test


# -- the document sends plugin authors only to the plugin API ------------------------------------
#: a jobprof module named in the text: ``jobprof.<name>...`` or ``from jobprof import <name>``;
#: a command (``jobprof export``, ``jobprof plugins``) has a space, not a dot, and is no module
_DOTTED = re.compile(r"(?<![\w.-])jobprof\.([A-Za-z_]\w*)(?:\.\w+)*")
_FROM = re.compile(r"\bfrom jobprof import ([\w, ]+)")


def modules_outside_the_api(text: str) -> list[str]:
    """Every jobprof module ``text`` names that is not ``jobprof.plugin`` (or inside it)."""
    named = {m.group(0) for m in _DOTTED.finditer(text) if m.group(1) != "plugin"}
    named |= {f"jobprof.{name.strip()}" for m in _FROM.finditer(text) for name in m.group(1).split(",")
              if name.strip() not in ("plugin", "")}
    return sorted(named)


def test_contributing_names_only_the_plugin_api():
    """A third-party author is sent only to ``jobprof.plugin``: every other jobprof module is
    private to jobprof and may change in any release (commands like ``jobprof export`` are fine)."""
    assert modules_outside_the_api(DOC.read_text(encoding="utf-8")) == []


def test_the_api_check_sees_a_planted_module():
    """The check above can fail: a stage module, a built-in plugin and a ``from jobprof import``
    are named; the API, its submodules, commands and file names are not."""
    planted = DOC.read_text(encoding="utf-8") + (
        "\nread it with `jobprof.files.rawstore.read(device_dir)`;\n"
        "```python\nfrom jobprof import mstx\nfrom jobprof.runtime import channel\n```\n"
        "see jobprof.plugins.dp.channel.\n")
    assert modules_outside_the_api(planted) == [
        "jobprof.files.rawstore.read", "jobprof.mstx", "jobprof.plugins.dp.channel", "jobprof.runtime"]
    fine = ("`jobprof export PROF_DIR`, `from jobprof.plugin import read_raw, channel`, "
            "`jobprof.plugin.hookspec`, jobprof_gc.py, jobprof-gc, `import jobprof.plugin`")
    assert modules_outside_the_api(fine) == []
