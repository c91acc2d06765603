"""PROFILING_OPTIONS validation: a table of bad inputs in-process, the policy in real runs.

In-process cases go through ``options.load(text, options.compose([...]))`` exactly as the
bootstrap does; the subprocess cases run real Python programs under PROFILING_MODE so the
interpreter-start path (.pth autoload, reporter, strict mode, exit codes) is what is tested.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import jobprof.plugins.training_trace as training_trace
from conftest import Runner
from distributions import make_dist
from jobprof import schemas
from jobprof.engine import options
from jobprof.plugin.reporter import Problem, Reporter, show_value

#: A third-party plugin's fragment: a new key, plus a refinement of a core key (nested allOf).
DEMO_FRAGMENT: dict[str, Any] = {
    "$defs": {"rate": {"type": "integer", "minimum": 1}},
    "properties": {
        "demo_rate": {"$ref": "#/$defs/rate", "default": 10},
        "hccl": {"enum": ["off", ""]},  # this plugin cannot collect communication
        "host_sys_usage_freq": {"maximum": 20},  # a stricter range than the core's [1, 50]
    },
}
TMP = "@TMP@"  # replaced by the test's tmp_path (a file and a directory live there)


@pytest.fixture(scope="module")
def composed() -> options.Composed:
    return options.compose([("training_trace", training_trace.jobprof_options_schema()),
                            ("demo", DEMO_FRAGMENT)])


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "out").mkdir()
    return tmp_path


def load(text: str | dict, composed: options.Composed, cwd: Path) -> options.Outcome:
    if isinstance(text, dict):
        text = json.dumps({"output": str(cwd / "out"), **text})
    return options.load(text.replace(TMP, str(cwd)), composed, cwd=str(cwd))


class Bad(NamedTuple):
    """One bad input: the problem must be at ``path`` and its line must contain ``needle``."""

    id: str
    options: str | dict
    path: str
    needle: str
    count: int = 1  # problems expected in total: no duplicate noise for one mistake


BAD: list[Bad] = [
    # -- not JSON, or not an object
    Bad("json-trailing-comma", '{"training_trace": "on",}', "$",
        "invalid JSON: Expecting property name enclosed in double quotes at line 1, column 25"),
    Bad("json-multiline", '{\n  "training_trace": "on"\n  "hccl": "on"\n}', "$",
        "Expecting ',' delimiter at line 3, column 3"),
    Bad("json-single-quotes", "{'output': './'}", "$", "invalid JSON"),
    Bad("json-unquoted-key", "{output: ./}", "$", "line 1, column 2"),
    Bad("json-truncated", '{"training_trace": "on"', "$", "invalid JSON"),
    Bad("json-nan", '{"host_sys_usage_freq": NaN}', "$", "NaN is not a JSON value"),
    Bad("json-array", "[]", "$", "must be a JSON object {...}, not an array (got [])"),
    Bad("json-string", '"on"', "$", 'not a string (got "on")'),
    Bad("json-number", "42", "$", "not a number (got 42)"),
    Bad("json-null", "null", "$", "not null (got null)"),
    # -- wrong JSON types
    Bad("switch-true", {"training_trace": True}, "$.training_trace",
        'must be a string (write switches as "on" or "off", in quotes), not a boolean (got true)'),
    Bad("switch-1", {"training_trace": 1}, "$.training_trace", "must be a string, not a number"),
    Bad("switch-null", {"hccl": None}, "$.hccl", "not null (got null)"),
    Bad("switch-list", {"l2": ["on"]}, "$.l2", 'not an array (got ["on"])'),
    Bad("freq-string", {"host_sys_usage_freq": "10"}, "$.host_sys_usage_freq",
        'must be an integer (a JSON number, without quotes), not a string (got "10")'),
    Bad("freq-fraction", {"host_sys_usage_freq": 1.5}, "$.host_sys_usage_freq",
        "not a fractional number (got 1.5)"),
    Bad("freq-bool", {"instr_profiling_freq": True}, "$.instr_profiling_freq", "not a boolean"),
    Bad("fp-point-number", {"fp_point": 3}, "$.fp_point", "must be a string"),
    Bad("output-number", {"output": 5}, "$.output", "must be a string, not a number"),
    # -- enums
    Bad("switch-upper", {"training_trace": "ON"}, "$.training_trace",
        'must be one of "on", "off" (or "" for the default) (got "ON")'),
    Bad("switch-level-on-switch", {"aicpu": "l1"}, "$.aicpu", 'must be one of "on", "off"'),
    Bad("level-l3", {"task_trace": "l3"}, "$.task_trace", '"l0", "l1", "l2"'),
    Bad("task-time-yes", {"task_time": "yes"}, "$.task_time", 'got "yes"'),
    # -- storage_limit: every malformation
    Bad("storage-gb", {"storage_limit": "100GB"}, "$.storage_limit", "'<digits>MB' with no space"),
    Bad("storage-space", {"storage_limit": "200 MB"}, "$.storage_limit", 'got "200 MB"'),
    Bad("storage-lowercase", {"storage_limit": "200mb"}, "$.storage_limit", 'got "200mb"'),
    Bad("storage-unit-only", {"storage_limit": "MB"}, "$.storage_limit", 'got "MB"'),
    Bad("storage-no-unit", {"storage_limit": "200"}, "$.storage_limit", 'got "200"'),
    Bad("storage-number", {"storage_limit": 200}, "$.storage_limit",
        "must be a string, not a number (got 200)"),
    Bad("storage-negative", {"storage_limit": "-200MB"}, "$.storage_limit", 'got "-200MB"'),
    Bad("storage-over-max", {"storage_limit": "4294967296MB"}, "$.storage_limit",
        "must be at most 4294967295MB"),
    Bad("storage-huge", {"storage_limit": "9" * 40 + "MB"}, "$.storage_limit", "at most"),
    Bad("storage-empty", {"storage_limit": ""}, "$.storage_limit", 'got ""'),
    Bad("storage-leading-space", {"storage_limit": " 200MB"}, "$.storage_limit", 'got " 200MB"'),
    Bad("storage-trailing-newline", {"storage_limit": "200MB\n"}, "$.storage_limit",
        'got "200MB\\n"'),
    Bad("storage-decimal", {"storage_limit": "200.5MB"}, "$.storage_limit", "'<digits>MB'"),
    # -- output
    Bad("output-empty", {"output": ""}, "$.output", "must not be empty"),
    *[Bad(f"output-control-{name}", {"output": f"{TMP}/o{char}ut"}, "$.output",
          "must not contain control characters")
      for name, char in [("lf", "\n"), ("ff", "\f"), ("cr", "\r"), ("bs", "\b"), ("tab", "\t"),
                         ("vt", "\v"), ("del", "\x7f"), ("nul", "\x00")]],
    Bad("output-trailing-newline", {"output": f"{TMP}/out\n"}, "$.output", '/out\\n")'),
    Bad("output-is-file", {"output": f"{TMP}/afile"}, "$.output", "is a file, not a directory"),
    Bad("output-under-file", {"output": f"{TMP}/afile/sub/dir"}, "$.output",
        "cannot be created: '@TMP@/afile' is a file"),
    # -- unknown keys
    Bad("unknown-typo", {"trainig_trace": "on"}, "$.trainig_trace",
        'unknown option key; did you mean "training_trace"? (got "on")'),
    Bad("unknown-case", {"TASK_TIME": "on"}, "$.TASK_TIME", 'did you mean "task_time"?'),
    Bad("unknown-unrelated", {"zzz": 1}, "$.zzz", "known keys: aic_metrics, aicpu"),
    # -- aic_metrics
    Bad("aic-group-case", {"aic_metrics": "pipeutilization"}, "$.aic_metrics",
        "must be one of ArithmeticUtilization, PipeUtilization"),
    Bad("aic-trailing-newline", {"aic_metrics": "Memory\n"}, "$.aic_metrics", "must be one of"),
    Bad("aic-custom-hex-high", {"aic_metrics": "Custom:0x6F"}, "$.aic_metrics",
        "register 0x6F is outside [0x1, 0x6E]"),
    Bad("aic-custom-zero", {"aic_metrics": "Custom:0x1,0"}, "$.aic_metrics", "register 0 is"),
    Bad("aic-custom-decimal-high", {"aic_metrics": "Custom:111"}, "$.aic_metrics",
        "register 111 is outside"),
    Bad("aic-custom-two-bad", {"aic_metrics": "Custom:0x70,200"}, "$.aic_metrics",
        "register 200", count=2),
    Bad("aic-custom-nine", {"aic_metrics": "Custom:" + ",".join(["1"] * 9)}, "$.aic_metrics",
        "(1-8 registers)"),
    Bad("aic-custom-empty", {"aic_metrics": "Custom:"}, "$.aic_metrics", "Custom:<reg,...>"),
    Bad("aic-custom-space", {"aic_metrics": "Custom:1, 2"}, "$.aic_metrics", "Custom:<reg,...>"),
    Bad("aic-too-long", {"aic_metrics": "Custom:" + ",".join(["0x00000001"] * 8)},
        "$.aic_metrics", "must be at most 70 characters long (this is 94)"),
    # -- host sampling
    Bad("host-sys-gpu", {"host_sys": "cpu,gpu"}, "$.host_sys", "cpu, mem, disk, network, osrt"),
    Bad("host-sys-space", {"host_sys": "cpu, mem"}, "$.host_sys", "(no spaces)"),
    Bad("host-usage-disk", {"host_sys_usage": "disk"}, "$.host_sys_usage", "cpu, mem"),
    Bad("host-freq-zero", {"host_sys_usage_freq": 0}, "$.host_sys_usage_freq",
        "must be an integer in [1, 20] (got 0)"),  # the demo plugin narrowed [1, 50]
    Bad("host-freq-refined", {"host_sys_usage_freq": 30}, "$.host_sys_usage_freq",
        "in [1, 20] (got 30)"),
    # -- instr_profiling_freq
    Bad("instr-low", {"instr_profiling_freq": 299}, "$.instr_profiling_freq",
        "must be an integer in [300, 30000] (got 299)"),
    Bad("instr-high", {"instr_profiling_freq": 30001}, "$.instr_profiling_freq", "(got 30001)"),
    Bad("instr-with-training-trace", {"instr_profiling_freq": 1000, "training_trace": "on"},
        "$.instr_profiling_freq", "cannot be combined with training_trace ("),
    Bad("instr-with-many", {"instr_profiling_freq": 1000, "task_time": "l0", "aic_metrics": "",
                            "l2": "off", "fp_point": "Net"},
        "$.instr_profiling_freq", "cannot be combined with task_time, fp_point, aic_metrics ("),
    # -- size, plugin keys
    Bad("too-long", {"fp_point": "x" * 1000, "bp_point": "y" * 1000}, "$",
        "bytes long; msprof accepts at most 2047 bytes"),
    Bad("fp-point-max-length", {"fp_point": "m" * 1025}, "$.fp_point",
        "at most 1024 characters long (this is 1025)"),
    Bad("plugin-key-below-min", {"demo_rate": 0}, "$.demo_rate",
        "must be an integer >= 1 (got 0)"),
    Bad("plugin-key-type", {"demo_rate": "fast"}, "$.demo_rate", "must be an integer"),
    Bad("plugin-refined-enum", {"hccl": "on"}, "$.hccl",
        'must be "off" (or "" for the default) (got "on")'),
]


def test_table_is_large_and_distinct() -> None:
    texts = {json.dumps(b.options) if isinstance(b.options, dict) else b.options for b in BAD}
    assert len(texts) == len(BAD) >= 30
    assert len({b.id for b in BAD}) == len(BAD)


@pytest.mark.parametrize("case", BAD, ids=[b.id for b in BAD])
def test_bad_input(case: Bad, composed: options.Composed, workdir: Path) -> None:
    outcome = load(case.options, composed, workdir)
    assert outcome.config is None
    lines = [p.render().replace(str(workdir), TMP) for p in outcome.problems]
    assert len(lines) == case.count, lines
    assert [line for line in lines if line.startswith(f"{case.path}: ") and case.needle in line], \
        lines
    for problem in outcome.problems:  # whole-document size problems have no single value
        assert problem.has_value or "bytes long" in problem.message, problem
        assert "\n" not in problem.render()  # one line each, even for control characters


def _read_only_dir() -> Path | None:
    """/proc refuses new entries whatever the permission bits say (even for root)."""
    proc = Path("/proc")
    if not (proc / "self").exists():
        return None
    return proc


def test_output_not_writable(composed: options.Composed, tmp_path: Path) -> None:
    where = _read_only_dir()
    if where is None:
        pytest.skip("/proc is not mounted: no directory that refuses writes even to root")
    outcome = load({"output": str(where / "jobprof-out")}, composed, tmp_path)
    assert outcome.config is None
    [problem] = outcome.problems
    assert problem.path == "$.output"
    assert problem.message.startswith(f"is not writable: cannot create a directory in '{where}'")


def test_output_not_writable_by_permission(composed: options.Composed, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through permission bits; covered by the /proc and ro-mount cases")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    outcome = load({"output": str(locked / "out")}, composed, tmp_path)
    assert [p.path for p in outcome.problems] == ["$.output"]


def test_write_probe_leaves_nothing(composed: options.Composed, tmp_path: Path) -> None:
    outcome = load({"output": "new/nested/out"}, composed, tmp_path)
    assert outcome.config is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # validation creates nothing


def test_all_problems_reported_at_once(composed: options.Composed, workdir: Path) -> None:
    text = {"trainig_trace": "on", "training_trace": True, "storage_limit": "200 MB",
            "output": str(workdir / "afile"), "aic_metrics": "Custom:0x99"}
    outcome = load(text, composed, workdir)
    assert [p.path for p in outcome.problems] == [
        "$.aic_metrics", "$.output", "$.storage_limit", "$.trainig_trace", "$.training_trace"]


# -- good inputs ---------------------------------------------------------------------------
def test_empty_options_mean_msprof_default(tmp_path: Path) -> None:
    composed = options.compose([("training_trace", training_trace.jobprof_options_schema())])
    for environ in ({}, {"PROFILING_OPTIONS": ""}, {"PROFILING_OPTIONS": "  \n"}):
        text, source = options.read_text(environ)
        assert json.loads(text) == options.MSPROF_DEFAULT
        assert "msprof default" in source
    outcome = options.load(text, composed, source, cwd=str(tmp_path))
    assert outcome.config is not None and outcome.problems == ()
    values = dict(outcome.config.values)
    assert {k: values[k] for k in options.MSPROF_DEFAULT if k != "output"} == {
        k: v for k, v in options.MSPROF_DEFAULT.items() if k != "output"}
    assert values["output"] == str(tmp_path.resolve())
    assert values["l2"] == "off" and values["task_memory"] == "off"  # schema defaults filled in


@pytest.mark.parametrize(("given", "effective"), [
    ({"task_trace": "l2", "task_time": "l0"}, "l0"),  # task_time wins
    ({"task_time": "off", "task_trace": "on"}, "off"),
    ({"task_time": "", "task_trace": "l2"}, "l2"),  # empty = unset: task_trace applies
    ({"task_time": "l1"}, "l1"),
    ({}, "on"),
])
def test_task_time_alias(given: dict, effective: str, composed: options.Composed,
                         tmp_path: Path) -> None:
    config = load(given, composed, tmp_path).config
    assert config is not None
    assert config["task_trace"] == effective
    assert "task_time" not in config.values


@pytest.mark.parametrize(("given", "expected"), [
    ({"aic_metrics": ""}, "PipeUtilization"),
    ({"aic_metrics": "Memory"}, "Memory"),
    ({"aic_metrics": "Custom:0x1,0x6E,110,1"}, "Custom:0x1,0x6E,110,1"),
    ({}, None),  # absent: no metrics
])
def test_aic_metrics(given: dict, expected: str | None, composed: options.Composed,
                     tmp_path: Path) -> None:
    config = load(given, composed, tmp_path).config
    assert config is not None and config.get("aic_metrics") == expected


def test_relative_output_resolved_against_cwd(composed: options.Composed, tmp_path: Path) -> None:
    config = options.load('{"output": "runs/../prof"}', composed, cwd=str(tmp_path)).config
    assert config is not None and config.output == str(tmp_path.resolve() / "prof")


@pytest.mark.parametrize(("limit", "mb", "warned"), [
    ("100MB", 200, True), ("0MB", 200, True), ("200MB", 200, False),
    ("0300MB", 300, False), ("4294967295MB", 4294967295, False),
])
def test_storage_limit(limit: str, mb: int, warned: bool, composed: options.Composed,
                       tmp_path: Path) -> None:
    outcome = load({"storage_limit": limit}, composed, tmp_path)
    assert outcome.config is not None
    assert outcome.config.storage_limit_mb == mb and outcome.config["storage_limit"] == f"{mb}MB"
    assert bool(outcome.warnings) is warned
    if warned:
        assert outcome.warnings == (
            f"storage_limit {limit!r} is below the minimum; using 200MB (as msprof does)",)


def test_instr_profiling_alone(composed: options.Composed, tmp_path: Path) -> None:
    outcome = load({"instr_profiling_freq": 1000.0, "training_trace": "off", "hccl": ""},
                   composed, tmp_path)
    config = outcome.config
    assert config is not None, outcome.problems
    assert config["instr_profiling_freq"] == 1000 and type(config["instr_profiling_freq"]) is int
    # switches left at their defaults do not run next to instruction profiling
    assert (config["task_trace"], config["hccl"], config["training_trace"]) == ("off",) * 3


def test_instr_exclusive_keys_match_schema() -> None:
    entries = schemas.load("options")["dependentSchemas"]["instr_profiling_freq"]["not"]["anyOf"]
    assert tuple(e["required"][0] for e in entries) == options.EXCLUSIVE_WITH_INSTR


def test_duplicate_key_warns_last_wins(composed: options.Composed, tmp_path: Path) -> None:
    text = '{"training_trace": "on", "training_trace": "off"}'
    outcome = options.load(text, composed, cwd=str(tmp_path))
    assert outcome.config is not None and outcome.config["training_trace"] == "off"
    assert outcome.warnings == (
        "option 'training_trace' is given more than once; the last value is used",)


def test_compose_refinements(tmp_path: Path) -> None:
    # two plugins refining one key nest allOf twice; the core default must survive
    composed = options.compose([("a", {"properties": {"hccl": {"enum": ["on", "off"]}}}),
                                ("b", {"properties": {"hccl": {"description": "b collects"}}})])
    assert options.defaults(composed.schema)["hccl"] == "off"
    assert composed.owners["hccl"] == "a"
    outcome = options.load('{"hccl": "x"}', composed, cwd=str(tmp_path))
    assert [p.render() for p in outcome.problems] == [
        '$.hccl: must be one of "on", "off" (or "" for the default) (got "x")',
        '$.hccl: must be one of "on", "off" (got "x")']


CHOICE_FRAGMENT: dict[str, Any] = {
    "properties": {"demo_mode": {"anyOf": [{"type": "integer", "minimum": 1},
                                           {"enum": ["auto", "off"]}]},
                   "demo_rate": {"type": "integer"}},
    "allOf": [{"if": {"required": ["demo_mode"]}, "then": {"required": ["demo_rate"]}}],
}


@pytest.mark.parametrize(("given", "line"), [
    ({"demo_mode": "fast", "demo_rate": 1},
     '$.demo_mode: must be an integer or "auto" or "off" (got "fast")'),
    ({"demo_mode": 0, "demo_rate": 1},
     '$.demo_mode: must be an integer >= 1 or "auto" or "off" (got 0)'),
    ({"demo_mode": "auto"}, "$.demo_rate: is required here"),
])
def test_plugin_alternatives_and_required(given: dict, line: str, tmp_path: Path) -> None:
    composed = options.compose([("demo", CHOICE_FRAGMENT)])
    outcome = load(given, composed, tmp_path)
    assert [p.render() for p in outcome.problems] == [line]


@pytest.mark.parametrize("fragment", [
    {"properties": {"x": {"type": "nonsense"}}},
    [1, 2],
    {"$defs": {"switch": {"type": "integer"}}},  # would silently change every core switch
])
def test_compose_rejects_bad_fragment(fragment: Any) -> None:
    with pytest.raises(options.SchemaProblem, match=r"^plugin 'bad': invalid options"):
        options.compose([("bad", fragment)])


# -- the reporter's format -----------------------------------------------------------------
def test_reporter_format_and_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBPROF_REPORTED_OPTIONS", raising=False)
    stream = io.StringIO()
    reporter = Reporter(stream)
    problems = [Problem("$.l2", 'must be one of "on", "off"', True, True),
                Problem("$", "is 3000 bytes long; msprof accepts at most 2047 bytes")]
    reporter.options_problems(problems, "PROFILING_OPTIONS", "the job runs unprofiled")
    reporter.options_problems(problems, "PROFILING_OPTIONS", "the job runs unprofiled")
    assert stream.getvalue() == (
        "jobprof: error: PROFILING_OPTIONS: 2 problems; the job runs unprofiled\n"
        'jobprof:   $.l2: must be one of "on", "off" (got true)\n'
        "jobprof:   $: is 3000 bytes long; msprof accepts at most 2047 bytes\n")


@pytest.mark.parametrize(("value", "shown"), [
    (None, "null"), (True, "true"), ("on", '"on"'), ([1, "a"], '[1, "a"]'),
    ("a\x7fb\nc", '"a\\u007fb\\nc"'), ("x" * 200, '"' + "x" * 76 + "..."),
])
def test_show_value(value: object, shown: str) -> None:
    assert show_value(value) == shown


# -- real runs: the policy at interpreter start --------------------------------------------
#: Prints whether a profiling session started, then exits with the code given in argv.
PROBE = """
import sys
from jobprof.runtime import _state
print("session", _state.SESSION is not None)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""
HEADER = "jobprof: error: PROFILING_OPTIONS: "
UNPROFILED = "the job runs unprofiled (set JOBPROF_STRICT=1 to fail instead)"


def prof_dirs(runner: Runner) -> list[Path]:
    return sorted(runner.tmp.rglob("PROF_*"))


def test_run_valid_options_profile(runner: Runner) -> None:
    """Control for the cases below: the same probe with good options does get a session."""
    proc = runner.run(PROBE, {"training_trace": "on"})
    assert proc.stdout == "session True\n" and "jobprof: error" not in proc.stderr


def test_run_all_problems_once(runner: Runner) -> None:
    (runner.tmp / "afile").write_text("")
    body = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'])\n" + PROBE
    proc = runner.run(body, {"trainig_trace": "on", "training_trace": True,
                             "storage_limit": "200 MB", "output": str(runner.tmp / "afile")},
                      check=False)
    assert proc.returncode == 0 and proc.stdout == "session False\n"
    assert proc.stderr == (  # a child process of the job does not repeat the report
        f"{HEADER}4 problems; {UNPROFILED}\n"
        f'jobprof:   $.output: is a file, not a directory (got "{runner.tmp / "afile"}")\n'
        "jobprof:   $.storage_limit: must be '<digits>MB' with no space and the unit, e.g. \"2048MB\" "
        '(got "200 MB")\n'
        'jobprof:   $.trainig_trace: unknown option key; did you mean "training_trace"? (got "on")\n'
        'jobprof:   $.training_trace: must be a string (write switches as "on" or "off", in quotes), '
        "not a boolean (got true)\n")


TRAIN_AND_EXIT_3 = """
import sys
import torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
sys.exit(3)
"""


@pytest.mark.parametrize("valid", [True, False], ids=["control-valid", "bad-options"])
def test_run_keeps_exit_code_and_writes_nothing(runner: Runner, valid: bool) -> None:
    proc = runner.run(TRAIN_AND_EXIT_3, {"hccl": "on" if valid else "yes"}, check=False)
    assert proc.returncode == 3, proc.stderr
    if valid:
        assert len(runner.prof_dirs()) == 1, proc.stderr  # so "no PROF_" below means something
    else:
        assert prof_dirs(runner) == []
        assert f"{HEADER}1 problem; {UNPROFILED}\n" in proc.stderr
        assert '  $.hccl: must be one of "on", "off" (or "" for the default) (got "yes")\n' \
            in proc.stderr


@pytest.mark.parametrize(("strict", "given", "code"), [
    ("1", {"l2": 1}, 2),
    ("yes", "{oops", 2),
    ("0", {"l2": 1}, 0),  # 0 means off
    ("1", {"l2": "on"}, 0),  # strict with good options: the job just runs
])
def test_run_strict(runner: Runner, strict: str, given: dict | str, code: int) -> None:
    proc = runner.run('open("ran", "w").close()\n' + PROBE, given,
                      env={"JOBPROF_STRICT": strict}, check=False)
    assert proc.returncode == code, proc.stderr
    assert (runner.tmp / "ran").exists() is (code == 0)  # strict: exits before the script
    if code == 2:
        assert proc.stderr.startswith(HEADER), proc.stderr
        assert "; exiting (JOBPROF_STRICT is set)\n" in proc.stderr
        assert proc.stdout == ""
    assert prof_dirs(runner) == []


def test_run_invalid_json_names_line_and_column(runner: Runner) -> None:
    proc = runner.run(PROBE, '{\n "output": "prof",\n "l2": on\n}', check=False)
    assert proc.stdout == "session False\n"
    assert f"{HEADER}1 problem; {UNPROFILED}\n" in proc.stderr
    assert "  $: invalid JSON: Expecting value at line 3, column 8 (got " in proc.stderr


def test_run_too_long(runner: Runner) -> None:
    proc = runner.run(PROBE, {"fp_point": "f" * 2100}, check=False)
    assert proc.stdout == "session False\n"
    assert "  $: is 2" in proc.stderr and "bytes long; msprof accepts at most 2047 bytes" \
        in proc.stderr
    assert "  $.fp_point: must be at most 1024 characters long (this is 2100)" in proc.stderr


DEMO_PLUGIN = """
from jobprof.plugin.hookspec import hookimpl

@hookimpl
def jobprof_options_schema():
    return {"properties": {"demo_rate": {"type": "integer", "minimum": 1, "default": 10}}}
"""


def demo_dist(root: Path) -> Path:
    return make_dist(root, "jobprof-demo", {"jobprof_demo": DEMO_PLUGIN}, {"demo": "jobprof_demo"})


@pytest.mark.parametrize(("rate", "problem"), [
    (0, "jobprof:   $.demo_rate: must be an integer >= 1 (got 0)\n"),
    ("5", 'jobprof:   $.demo_rate: must be an integer (a JSON number, without quotes), not a string '
          '(got "5")\n'),
    (5, None),
])
def test_run_third_party_plugin_option(runner: Runner, rate: Any, problem: str | None) -> None:
    root = demo_dist(runner.tmp / "site")
    proc = runner.run(PROBE, {"demo_rate": rate}, env={"PYTHONPATH": str(root)}, check=False)
    assert proc.returncode == 0
    if problem is None:  # the plugin's key is known only because the plugin is installed
        assert proc.stdout == "session True\n" and "jobprof: error" not in proc.stderr
    else:
        assert proc.stdout == "session False\n"
        assert proc.stderr == f"{HEADER}1 problem; {UNPROFILED}\n{problem}"


def test_run_plugin_key_unknown_without_plugin(runner: Runner) -> None:
    proc = runner.run(PROBE, {"demo_rate": 5}, check=False)
    assert proc.stdout == "session False\n"
    assert '  $.demo_rate: unknown option key; known keys: ' in proc.stderr


SPAWNS_CHILD = """
import subprocess, sys
subprocess.run([sys.executable, "-c", "print('child')"], check=True)
print("parent")
"""


@pytest.mark.parametrize(("mode", "hints"), [("True", 1), ("1", 1), ("TRUE", 1), ("false", 0)])
def test_run_profiling_mode_lookalike_hint(runner: Runner, mode: str, hints: int) -> None:
    proc = runner.run(SPAWNS_CHILD, {"training_trace": "on"}, mode=mode)
    assert proc.stdout == "child\nparent\n"
    hint = (f"jobprof: PROFILING_MODE={mode!r} does not enable profiling; "
            "set PROFILING_MODE=true (lower case, exactly) to profile this job\n")
    assert proc.stderr == hint * hints  # once per job: the child does not repeat it
    assert prof_dirs(runner) == []


def test_a_plugin_can_add_a_metric_group_name(tmp_path: Path) -> None:
    """For aic_metrics, a fragment's enum widens the accepted names (a third-party group);
    every other refinement narrows.  A name nobody declares is still refused, in words."""
    composed = options.compose([("intensity", {"properties": {"aic_metrics": {"enum": ["Intensity"]}}})])
    for group in ("Intensity", "PipeUtilization", "Custom:0x1,0x2"):
        outcome = options.load(json.dumps({"output": str(tmp_path), "aic_metrics": group}), composed)
        assert not outcome.problems and outcome.config["aic_metrics"] == group
    outcome = options.load(json.dumps({"output": str(tmp_path), "aic_metrics": "Intensty"}), composed)
    [problem] = outcome.problems
    assert problem.path == "$.aic_metrics"
    assert "PipeUtilization" in problem.message and '"Intensity"' in problem.message


def test_a_profiled_start_with_valid_options_never_imports_jsonschema(tmp_path: Path) -> None:
    """jsonschema (0.1-1.1 s to import) explains invalid options; valid ones are checked by
    jsonschema-rs alone (jobprof.engine.schemacheck), so the job starts without it."""
    code = "import sys; print('jsonschema' in sys.modules, 'jobprof.runtime.bootstrap' in sys.modules)"
    every = {"output": str(tmp_path), "training_trace": "on", "task_trace": "l1", "aicpu": "on", "hccl": "on",
             "msproftx": "on", "aic_metrics": "PipeUtilization", "l2": "on", "kineto_trace": "on",
             "fusion_op": "on", "dp": "on", "storage_limit": "500MB"}
    env = {**os.environ, "PROFILING_MODE": "true", "PROFILING_OPTIONS": json.dumps(every)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["False", "True"], (run.stdout, run.stderr)
    env["PROFILING_OPTIONS"] = json.dumps({**every, "hccl": "maybe"})
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["True", "True"], (run.stdout, run.stderr)  # imported to explain
    assert "$.hccl: must be one of" in run.stderr and "the job runs unprofiled" in run.stderr, run.stderr


@pytest.mark.parametrize("options", [
    {"output": "./"}, {"output": ""}, {"output": "a\bb"}, {"output": "a\x7fb"}, {"output": 3},
    {"training_trace": "on"}, {"training_trace": "ON"}, {"task_trace": "l2"}, {"task_trace": "l3"},
    {"aic_metrics": "Custom:0x1,0x2"}, {"aic_metrics": "Custom:0x1\n"}, {"aic_metrics": "Nope"},
    {"storage_limit": "300MB"}, {"storage_limit": "300MB\n"}, {"storage_limit": 300},
    {"sys_hardware_mem_freq": 10}, {"sys_hardware_mem_freq": 10.5}, {"sys_hardware_mem_freq": "10"},
    {"host_sys": "cpu,mem"}, {"host_sys": "cpu,gpu"}, {"nope": 1}, {"hccl": None}, {"dp": "on"},
])
def test_the_fast_check_and_jsonschema_agree(options: dict) -> None:
    """jsonschema-rs says "valid" exactly when jsonschema does, on the composed schema of every
    built-in plugin (the fast check must never let through what jsonschema refuses)."""
    import jsonschema

    from jobprof.engine import configure, schemacheck
    from jobprof.engine.manager import PluginManager

    manager = PluginManager()
    manager.load_entry_points()
    schema = configure.compose_with(manager).schema
    assert schemacheck.jsonschema_rs is not None
    assert schemacheck.is_valid(schema, options) == jsonschema.Draft202012Validator(schema).is_valid(options)
