"""Hostile PROFILING_OPTIONS: input built to break the parser, the validator or the terminal.

Issue 15, finding 6 and the ANSI item of finding 9: nesting deep enough for a RecursionError,
integers past Python's str-conversion limit, paths past NAME_MAX / PATH_MAX, bytes that are not
UTF-8, control characters and ANSI escapes in keys, and a type confusion for every option key of
the composed schema (core and built-in plugins).  Each must end as an ordinary problem naming its
JSON path: no traceback, no raw control character reaching the terminal, the job unprofiled, and
``JOBPROF_STRICT=1`` exiting 2.  Most cases run in-process through ``options.load`` (what the
bootstrap calls); a subset runs as real profiled processes and through ``jobprof check``.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import test_options

from conftest import Runner, jobprof_cli
from jobprof.engine import configure, options
from jobprof.engine.manager import PluginManager
from jobprof.plugin.reporter import Reporter, escape

TMP = "@TMP@"  # replaced by the test's tmp_path
#: what must never reach a terminal raw: C0 controls but the line break the reporter puts
#: between lines, DEL, C1 (0x9b is a one-byte CSI), lone surrogates, bidi overrides
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def composed() -> options.Composed:
    """The schema a real job composes: core keys and every built-in plugin's fragment."""
    manager = PluginManager()
    manager.load_entry_points({})
    return configure.compose_with(manager)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path


class Hostile(NamedTuple):
    """One input: a problem line must start with ``path`` (as rendered) and contain ``needle``."""

    id: str
    options: str | dict
    path: str
    needle: str
    cwd: str = TMP  # the working directory the relative output resolves against


def deep(n: int, inner: str = "1") -> str:
    return "[" * n + inner + "]" * n


def deep_obj(n: int) -> str:
    return '{"a":' * n + "1" + "}" * n


LONG_DIR = "/".join(["d" * 200] * 21)  # 4220 bytes of directories, each name valid

HOSTILE: list[Hostile] = [
    # -- nesting: json.loads recurses once per level (RecursionError near 1,000)
    Hostile("deep-brackets-100000", "[" * 100000, "$", "nested deeper than"),
    Hostile("deep-braces-100000", "{" * 100000, "$", "nested deeper than"),
    Hostile("deep-array-1000", deep(1000), "$", "nested deeper than"),
    Hostile("deep-object-1000", deep_obj(1000), "$.a", "nested deeper than"),
    Hostile("deep-mixed-3000", "[{" * 3000, "$", "nested deeper than"),
    Hostile("deep-in-output-40", '{"output": ' + deep(40) + "}", "$.output", "nested deeper than"),
    Hostile("deep-in-output-1000", '{"output": ' + deep(1000) + "}", "$.output",
            "nested deeper than"),
    Hostile("deep-in-output-50000", '{"output": ' + "[" * 50000, "$.output", "nested deeper than"),
    Hostile("deep-in-fp-point-obj", '{"fp_point": ' + deep_obj(500) + "}", "$.fp_point",
            "nested deeper than"),
    Hostile("deep-in-unknown-key", '{"l2": "on", "zzz": ' + deep(2000) + "}", "$.zzz",
            "nested deeper than"),
    Hostile("deep-after-string-brackets", '{"fp_point": "[[[[", "hccl": ' + deep(1200) + "}",
            "$.hccl", "nested deeper than"),
    Hostile("nested-within-bound", '{"output": ' + deep(20, '"x"') + "}", "$.output",
            "must be a string, not an array"),
    # -- integers past Python's int/str conversion limit (4,300 digits) and huge floats
    Hostile("int-5000-digits", '{"host_sys_usage_freq": ' + "9" * 5000 + "}",
            "$.host_sys_usage_freq", "integer has more than"),
    Hostile("int-4301-digits", '{"instr_profiling_freq": ' + "1" * 4301 + "}",
            "$.instr_profiling_freq", "integer has more than"),
    Hostile("int-100000-digits", '{"host_sys_usage_freq": ' + "7" * 100000 + "}",
            "$.host_sys_usage_freq", "integer has more than"),
    Hostile("int-negative-5000", '{"host_sys_usage_freq": -' + "9" * 5000 + "}",
            "$.host_sys_usage_freq", "integer has more than"),
    Hostile("int-in-unknown-key", '{"zzz": ' + "9" * 6000 + "}", "$.zzz", "integer has more than"),
    Hostile("int-in-array", '{"l2": [1, ' + "9" * 5000 + "]}", "$.l2[1]", "integer has more than"),
    Hostile("int-top-level", "9" * 5000, "$", "integer has more than"),
    Hostile("float-overflow", '{"host_sys_usage_freq": 1e400}', "$.host_sys_usage_freq",
            "too large"),
    Hostile("float-overflow-negative", '{"instr_profiling_freq": -1e99999}',
            "$.instr_profiling_freq", "too large"),
    Hostile("float-5000-digits", '{"host_sys_usage_freq": ' + "9" * 5000 + ".5}",
            "$.host_sys_usage_freq", "too large"),
    Hostile("infinity", '{"host_sys_usage_freq": Infinity}', "$", "Infinity is not a JSON value"),
    Hostile("minus-infinity", '{"instr_profiling_freq": -Infinity}', "$", "is not a JSON value"),
    # -- paths: a component over NAME_MAX, a whole path over PATH_MAX (with what jobprof adds)
    Hostile("component-256", {"output": f"{TMP}/out/{'c' * 256}"}, "$.output", "NAME_MAX 255"),
    Hostile("component-300", {"output": f"{TMP}/{'c' * 300}"}, "$.output", "NAME_MAX 255"),
    Hostile("component-300-middle", {"output": f"{TMP}/{'c' * 300}/x/y"}, "$.output",
            "NAME_MAX 255"),
    Hostile("component-1000", {"output": "c" * 1000}, "$.output", "NAME_MAX 255"),
    Hostile("component-multibyte", {"output": f"{TMP}/{'é' * 128}"}, "$.output",
            "256 bytes"),
    Hostile("path-3000-chars-multibyte", {"output": "/tmp/" + "/".join(["é" * 100] * 30)},
            "$.output", "PATH_MAX 4096"),
    Hostile("path-relative-long-cwd", {"output": "x"}, "$.output", "PATH_MAX 4096",
            cwd=f"{TMP}/{LONG_DIR}"),
    Hostile("path-4000-relative", {"output": "/".join(["r" * 100] * 19)}, "$.output",
            "PATH_MAX 4096", cwd=f"{TMP}/{'/'.join(['w' * 250] * 9)}"),
    Hostile("path-near-limit", {"output": "p" * 100}, "$.output", "PATH_MAX 4096",
            cwd=f"{TMP}/{'/'.join(['w' * 250] * 15)}"),
    # -- bytes that are not UTF-8 (os.environ holds \xff as the surrogate escape \udcff)
    Hostile("key-xff", '{"\udcff": "on"}', "$.\\udcff", "not valid UTF-8 at byte 0"),
    Hostile("key-xff-inside", '{"ab\udcfe": 1}', "$.ab\\udcfe", "not valid UTF-8 at byte 2"),
    Hostile("key-xff-known-prefix", '{"l2\udcc3": "on"}', "$.l2\\udcc3", "not valid UTF-8"),
    Hostile("value-xff-output", f'{{"output": "{TMP}/o\udcffut"}}', "$.output",
            "not valid UTF-8"),
    Hostile("value-xff-fp-point", '{"fp_point": "Lin\udce9ar"}', "$.fp_point",
            "not valid UTF-8 at byte 3"),
    Hostile("value-xff-nested", '{"zzz": {"k": ["\udc80"]}}', "$.zzz.k[0]", "not valid UTF-8"),
    Hostile("key-json-lone-surrogate", '{"\\ud800x": 1}', "$.\\ud800x", "lone surrogate"),
    Hostile("value-json-lone-surrogate", '{"bp_point": "\\udfff"}', "$.bp_point",
            "lone surrogate"),
    Hostile("output-json-lone-surrogate", '{"output": "\\ud83d"}', "$.output", "lone surrogate"),
    Hostile("text-xff-outside-string", '{\udcff: 1}', "$", "invalid JSON"),
    # -- control characters and escapes in unknown keys (printed as JSON escapes, never raw)
    Hostile("key-ansi-red", {"\x1b[31mred": 1}, "$.\\u001b[31mred", "unknown option key"),
    Hostile("key-ansi-clear-screen", {"\x1b[2J\x1b[H": "on"}, "$.\\u001b[2J\\u001b[H",
            "unknown option key"),
    Hostile("key-osc-title", {"\x1b]0;pwned\x07": 1}, "$.\\u001b]0;pwned\\u0007",
            "unknown option key"),
    Hostile("key-c1-csi", {"\x9b31mred": 1}, "$.\\u009b31mred", "unknown option key"),
    Hostile("key-del", {"l2\x7f": "on"}, "$.l2\\u007f", 'did you mean "l2"?'),
    Hostile("key-nul", {"a\x00b": 1}, "$.a\\u0000b", "unknown option key"),
    Hostile("key-cr", {"hccl\r": "on"}, "$.hccl\\u000d", "unknown option key"),
    Hostile("key-newline", {"fake\n  $.l2": "on"}, "$.fake\\u000a  $.l2", "unknown option key"),
    Hostile("key-bidi-override", {"\u202eon": 1}, "$.\\u202eon", "unknown option key"),
    Hostile("key-backspaces", {"zzz" + "\b" * 3 + "l2": "on"}, "$.zzz\\u0008\\u0008\\u0008l2",
            "unknown option key"),
    Hostile("key-300-chars", {"k" * 300: 1}, "$." + "k" * 91 + "...", "unknown option key"),
    Hostile("key-10000-chars", {"q" * 10000: 1}, "$." + "q" * 91 + "...", "unknown option key"),
    Hostile("key-ansi-long", {"\x1b[41m" * 500: 1}, "$." + ("\\u001b[41m" * 10)[:91] + "...",
            "unknown option key"),
    Hostile("value-ansi-unknown-key", {"zzz": "\x1b[31mred"}, "$.zzz", "unknown option key"),
    Hostile("value-ansi-known-key", {"l2": "\x1b[31mon"}, "$.l2", 'must be one of "on"'),
    # -- JSON the parser must refuse with a position
    Hostile("bom", '\ufeff{"l2": "on"}', "$", "BOM"),
    Hostile("trailing-garbage", '{"l2": "on"} \x1b[31mx', "$", "Extra data"),
    Hostile("two-documents", '{"l2": "on"}{"hccl": "on"}', "$", "Extra data"),
    Hostile("duplicate-key-last-bad", '{"l2": "on", "l2": 1}', "$.l2", "must be a string"),
    Hostile("duplicate-ansi-key", '{"\\u001b[1m": 1, "\\u001b[1m": 2}', "$.\\u001b[1m",
            "unknown option key"),
    Hostile("duplicate-long-key", '{"%s": 1, "%s": 2}' % (("\\u001b" + "d" * 3000,) * 2),
            "$." + ("\\u001b" + "d" * 100)[:91] + "...", "unknown option key"),
    Hostile("nan-in-array", '{"l2": [NaN]}', "$", "NaN is not a JSON value"),
    Hostile("nul-text", "\x00", "$", "invalid JSON"),
    Hostile("only-ansi", "\x1b[31m", "$", "invalid JSON"),
    Hostile("long-string-fp-point", {"fp_point": "f" * 100000}, "$.fp_point",
            "at most 1024 characters"),
    Hostile("long-string-output", {"output": "o" * 100000}, "$.output", "NAME_MAX 255"),
]

#: every key of the composed schema, by the JSON type it takes
INT_KEYS = ("host_sys_usage_freq", "instr_profiling_freq", "task_trace_every")
OBJECT_KEYS = ("trigger",)
STRING_CONFUSIONS: list[Any] = [True, None, 7, 2.5, [], {"on": "on"}]
INT_CONFUSIONS: list[tuple[str, str]] = [  # (JSON text of the value, what the message says)
    ('"10"', "without quotes"), ("true", "not a boolean"), ("null", "not null"),
    ("[]", "not an array"), ("{}", "not an object"), ('""', "must be an integer"),
    ("-1", "must be an integer in"), ("10" + "0" * 30, "must be an integer in"),
    ("300.5", "not a fractional number"), ("1e300", "must be an integer in"),
    ("0.0", "must be an integer in"),
]
_EXISTING = {json.dumps(b.options, sort_keys=True) for b in test_options.BAD
             if isinstance(b.options, dict)}


def _type_confusions() -> list[Hostile]:
    keys = list(options.compose([]).schema["properties"])  # core keys
    keys += ["mstx_domain_include", "mstx_domain_exclude", "kineto_trace", "dp"]  # plugins'
    out = []
    for key in keys:
        if key in OBJECT_KEYS:
            for value in [*STRING_CONFUSIONS[:-1], "on"]:
                kind = "a fractional number" if value == 2.5 else options._json_type(value)
                out.append(Hostile(f"type-{key}-{json.dumps(value)}", {key: value}, f"$.{key}",
                                   f"must be an object, not {kind}"))
            out.append(Hostile(f"type-{key}-unknown", {key: {"on": "on"}}, f"$.{key}.on",
                               "unknown key; known keys: cooldown_s, iterations"))
            continue
        if key in INT_KEYS:
            for text, needle in INT_CONFUSIONS:
                out.append(Hostile(f"type-{key}-{text[:8]}", f'{{"{key}": {text}}}', f"$.{key}",
                                   needle))
            continue
        for value in STRING_CONFUSIONS:
            if json.dumps({key: value}, sort_keys=True) in _EXISTING:
                continue  # tests/test_options.py has this one
            kind = "a fractional number" if value == 2.5 else options._json_type(value)
            needle = ("must be a string (write switches" if value is True
                      else f"must be a string, not {kind}")
            out.append(Hostile(f"type-{key}-{json.dumps(value)}", {key: value}, f"$.{key}",
                               needle))
    return out


CONFUSIONS = _type_confusions()
ALL = HOSTILE + CONFUSIONS


def _text(case: Hostile, workdir: Path) -> str:
    text = case.options
    if isinstance(text, dict):
        text = json.dumps({"output": f"{TMP}/out", **text}, ensure_ascii=False)
    return text.replace(TMP, str(workdir))


def test_table_counts() -> None:
    assert len({c.id for c in ALL}) == len(ALL)
    assert len(HOSTILE) >= 60 and len(CONFUSIONS) >= 100 and len(ALL) >= 160


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_hostile_in_process(case: Hostile, composed: options.Composed, workdir: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBPROF_REPORTED", "")  # the reporter's once-per-job marker
    outcome = options.load(_text(case, workdir), composed, cwd=case.cwd.replace(TMP, str(workdir)))
    assert outcome.config is None
    lines = [p.render().replace(str(workdir), TMP) for p in outcome.problems]
    assert [line for line in lines if line.startswith(f"{case.path}: ") and case.needle in line], \
        lines
    assert not any("internal error" in line or "Traceback" in line for line in lines), lines
    # what the user sees: the report on stderr (and the warnings) never carries a raw control
    stream = io.StringIO()
    reporter = Reporter(stream)
    reporter.options_problems(list(outcome.problems), outcome.source, "the job runs unprofiled")
    for warning in outcome.warnings:
        reporter.warning(warning)
    shown = stream.getvalue()
    assert shown.startswith("jobprof: error: PROFILING_OPTIONS: ") and case.path in shown
    assert not UNSAFE.search(shown), ascii(shown[:300])
    shown.encode("utf-8")  # strict: every line can be written to a UTF-8 terminal
    assert max(len(line) for line in shown.splitlines()) < 1000  # shortened, not 100 KB


def test_depth_bound_accepts_legal_nesting(composed: options.Composed, workdir: Path) -> None:
    """Control for the depth cases: options nested within the bound are checked as usual."""
    text = json.dumps({"output": str(workdir / "out"), "l2": "on"})
    assert options.load(text, composed, cwd=str(workdir)).config is not None
    outcome = options.load('{"zzz": ' + deep(options.MAX_DEPTH - 1) + "}", composed,
                           cwd=str(workdir))
    assert [p.path for p in outcome.problems] == ["$.zzz"]
    assert "unknown option key" in outcome.problems[0].message


def test_longest_valid_path_and_name(composed: options.Composed, workdir: Path) -> None:
    """Control for the path cases: a 255-byte name is legal, and so is a long legal path."""
    name = workdir / "out" / ("n" * 255)
    outcome = options.load(json.dumps({"output": str(name)}), composed, cwd=str(workdir))
    assert outcome.config is not None, outcome.problems
    parts = "/".join(["v" * 200] * 10)  # about 2,000 bytes plus the tmp path
    outcome = options.load(json.dumps({"output": parts}), composed, cwd=str(workdir))
    assert outcome.config is not None, outcome.problems


def test_reporter_never_raises_on_unencodable_stream() -> None:
    """A stream that cannot encode what it is given (ASCII, strict) still gets every line."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors="strict")
    Reporter(stream).error("key \udcff and é and \x1b[31m")
    stream.flush()
    assert raw.getvalue() == b"jobprof: error: key \\udcff and \\xe9 and \\u001b[31m\n"


# -- real processes: the interpreter-start path, strict mode and `jobprof check` -----------
#: one case per class, strict (exit 2 before the script) and lenient (the job runs unprofiled);
#: each real run costs an interpreter start with jobprof's imports, so the rest are marked slow
SLOW = pytest.mark.slow
PROFILED = [
    ("deep-brackets-100000", "1"), ("int-5000-digits", "1"), ("key-xff", "1"),
    ("key-ansi-red", ""), ("component-300", ""),
    *[pytest.param(case_id, strict, marks=SLOW) for case_id, strict in [
        ("deep-in-output-1000", "1"), ("component-300", "1"), ("path-3000-chars-multibyte", "1"),
        ("value-xff-fp-point", "1"), ("key-ansi-red", "1"), ("key-osc-title", "1"),
        ("key-c1-csi", "1"), ("float-overflow", "1"), ("bom", "1"), ("key-xff", ""),
        ("deep-in-output-1000", ""), ("int-5000-digits", "")]],
]
BY_ID = {c.id: c for c in ALL}
PROBE = """
import sys
from jobprof.runtime import _state
print("session", _state.SESSION is not None)
"""


def _no_leak(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    assert not UNSAFE.search(text), ascii(text[-500:])


@pytest.mark.parametrize(("case_id", "strict"), PROFILED)
def test_hostile_profiled_run(case_id: str, strict: str, runner: Runner) -> None:
    case = BY_ID[case_id]
    text = _text(case, runner.tmp)
    proc = runner.run('open("ran", "w").close()\n' + PROBE, text,
                      env={"JOBPROF_STRICT": strict} if strict else None, check=False)
    _no_leak(proc.stderr)
    # every line of the report carries the prefix (issue 29 item 10)
    assert f"\njobprof:   {case.path}: " in proc.stderr, proc.stderr[-2000:]
    if strict:
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stdout == "" and not (runner.tmp / "ran").exists()
        assert "; exiting (JOBPROF_STRICT is set)\n" in proc.stderr
    else:
        assert proc.returncode == 0 and proc.stdout == "session False\n", proc.stderr[-2000:]
        assert "the job runs unprofiled" in proc.stderr
    assert not list(runner.tmp.rglob("PROF_*"))


#: `jobprof check --options TEXT` (the table) or `jobprof check --json` reading the environment
CHECK_CLI = [
    ("deep-object-1000", "argument"), ("key-xff", "environment"),
    *[pytest.param(case_id, where, marks=SLOW) for case_id, where in [
        ("deep-brackets-100000", "argument"), ("int-5000-digits", "argument"),
        ("component-300", "argument"), ("key-ansi-clear-screen", "argument"),
        ("value-json-lone-surrogate", "argument"), ("float-overflow", "argument"),
        ("int-5000-digits", "environment"), ("key-ansi-clear-screen", "environment")]],
]


@pytest.mark.parametrize(("case_id", "where"), CHECK_CLI)
def test_hostile_check_cli(case_id: str, where: str, tmp_path: Path) -> None:
    case = BY_ID[case_id]
    (tmp_path / "out").mkdir()
    text = _text(case, tmp_path)
    if where == "argument":
        proc = jobprof_cli("check", "--options", text, cwd=tmp_path)
        assert f"\n  {case.path}: " in proc.stderr, proc.stderr[-2000:]
    else:
        proc = jobprof_cli("check", "--json", env={"PROFILING_OPTIONS": text}, cwd=tmp_path)
        result = json.loads(proc.stdout)
        assert result["valid"] is False, result
        assert case.path in [escape(p["path"]) for p in result["problems"]], result["problems"]
    _no_leak(proc.stdout + proc.stderr)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_check_cli_ascii_stdout(tmp_path: Path) -> None:
    """A terminal that takes ASCII only: the problems are printed escaped, not a traceback."""
    text = json.dumps({"\u00e9\udcff": 1}, ensure_ascii=False)
    proc = jobprof_cli("check", "--options", text, cwd=tmp_path,
                       env={"PYTHONIOENCODING": "ascii:strict"})
    _no_leak(proc.stdout + proc.stderr)
    assert proc.returncode == 1 and "unknown option key" in proc.stderr, proc.stderr


def test_environment_bytes_reach_parser_as_surrogates() -> None:
    """The premise of the \\xff cases: os.environ decodes a raw byte to a surrogate escape."""
    assert os.fsdecode(b'{"\xff": 1}') == '{"\udcff": 1}'
