"""``jobprof plugins``: every plugin with its distribution, version, status, option keys, files.

Uses the built-in training_trace plugin and the test-local distributions of test_plugins.py,
discovered through real entry points; the table and ``--json`` must give the same records.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_plugins import BROKEN, MARKER, build_dists, pythonpath

import jobprof
from conftest import jobprof_cli

DISABLED = "side_effect"
RUNTIME_ONLY = {"deferred_raises", "iter_raises", "start_raises", "render_raises", "end_raises",
                "exits_in_hook", "stream_thief", "not_json"}  # broken only when their hooks run in a job
STEP_FILES = ["summary/step_trace_<dev>_<model>_<iter>.csv",
              "timeline/step_trace_<dev>_<model>_<iter>.json"]


@pytest.fixture(scope="module")
def listing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("plugins_cli")
    dists = build_dists(base / "dists")
    cwd = base / "cwd"
    cwd.mkdir()
    env = {"PYTHONPATH": pythonpath(dists, "good", "broken", "side", "dup_a", "dup_b"),
           "JOBPROF_DISABLE_PLUGINS": DISABLED}
    out = {form: jobprof_cli("plugins", *flags, env=env, cwd=cwd)
           for form, flags in (("json", ["--json"]), ("table", []))}
    assert not (cwd / MARKER).exists()  # the disabled plugin was never imported
    return out


@pytest.fixture(scope="module")
def records(listing: dict[str, subprocess.CompletedProcess]) -> dict[tuple[str, str], dict]:
    proc = listing["json"]
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert {tuple(r) for r in found} == {("name", "distribution", "version", "status", "error",
                                          "option_keys", "files")}
    by_key = {(r["name"], r["distribution"]): r for r in found}
    assert len(by_key) == len(found)
    return by_key


def test_builtin_plugin(records):
    record = records[("training_trace", "jobprof")]
    assert (record["version"], record["status"], record["error"]) == (jobprof.__version__, "active", "")
    assert record["option_keys"] == ["bp_point", "fp_point", "training_trace"]
    assert set(STEP_FILES) <= set(record["files"])


def test_working_third_party_plugins(records):
    good = records[("good", "jobprof-good-plugin")]
    assert (good["version"], good["status"], good["error"]) == ("2.3.1", "active", "")
    assert good["option_keys"] == ["good_trace"]
    assert good["files"] == ["summary/good_stats_<dev>_<model>_<iter>.csv"]
    partial = records[("partial", "jobprof-good-plugin")]
    assert (partial["status"], partial["option_keys"], partial["files"]) == ("active", [], [])


def test_disabled_plugin(records):
    record = records[(DISABLED, "jobprof-side-effect")]
    assert (record["version"], record["status"]) == ("0.4", "disabled")
    assert record["error"] == "listed in JOBPROF_DISABLE_PLUGINS"
    assert (record["option_keys"], record["files"]) == ([], [])  # never imported


@pytest.mark.parametrize("name", sorted(set(BROKEN) - RUNTIME_ONLY))
def test_failed_plugins_carry_their_error(records, listing, name):
    record = records[(name, "jobprof-broken")]
    assert (record["version"], record["status"]) == ("0.0.1", "failed")
    assert BROKEN[name][1] in record["error"]
    assert (record["option_keys"], record["files"]) == ([], [])
    lines = [ln for ln in listing["json"].stderr.splitlines() if f"plugin '{name}' disabled" in ln]
    assert lines == [f"jobprof: warning: plugin '{name}' disabled: {record['error']}"]


@pytest.mark.parametrize("name", [*sorted(RUNTIME_ONLY), "undecorated"])
def test_plugins_that_fail_only_at_run_time_are_listed_active(records, name):
    assert records[(name, "jobprof-broken")]["status"] == "active"


def test_alias_of_a_registered_module(records):
    record = records[("zz_alias", "jobprof-broken")]
    assert (record["status"], record["error"]) == (
        "failed", "the same object is already registered as 'end_raises'")


def test_duplicate_names(records):
    assert records[("dup", "jobprof-dup-a")]["status"] == "active"
    loser = records[("dup", "jobprof-dup-b")]
    assert loser["status"] == "failed"
    assert loser["error"] == "the name 'dup' is already taken by jobprof-dup-a 1.0"
    shadow = records[("training_trace", "jobprof-dup-b")]
    assert shadow["status"] == "failed"
    assert shadow["error"] == f"the name 'training_trace' is already taken by jobprof {jobprof.__version__}"


def test_table_lists_the_same_records(records, listing):
    proc = listing["table"]
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == [
        "plugin", "distribution", "version", "status", "option keys", "files"]
    rows = [ln for ln in lines[2:] if ln[:1].strip()]  # a row starts in column 0; wraps do not
    assert len(rows) == len(records)
    for record in records.values():
        status = record["status"] + (f": {record['error']}" if record["error"] else "")
        cells = [record["name"], record["distribution"], record["version"], status,
                 ", ".join(record["option_keys"]) or "-", (record["files"] or ["-"])[0]]
        pattern = r"\s+".join(re.escape(cell) for cell in cells)
        assert [r for r in rows if re.match(pattern + r"\s*$", r)], f"no row for {record}"
        for extra in record["files"][1:]:  # further files wrap onto lines of their own
            assert any(ln.strip() == extra for ln in lines)


def test_only_builtins_without_test_distributions(tmp_path: Path):
    proc = jobprof_cli("plugins", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert {(r["distribution"], r["status"]) for r in found} == {("jobprof", "active")}
    assert "training_trace" in {r["name"] for r in found}
    assert proc.stderr == ""
