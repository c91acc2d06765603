"""Bad CLI inputs (issue 15, finding 8): every command, on a profile with one thing broken,
names the file and the problem, goes on with the rest and never shows a traceback.

One real profile is made per module (a tiny training loop, training_trace + task_trace +
kineto_trace) and its device_0 cloned as device_1, so a broken device_0 still leaves a usable
device: the command must then exit 0 with device_1's output.  Each case copies that profile
and breaks one thing.  The cases run in-process through ``jobprof.cli.main`` (fast); a few run
the installed ``jobprof`` command to prove no traceback escapes a real process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, Runner, jobprof_cli
from jobprof.cli import main as cli

OPTIONS = {"training_trace": "on", "task_trace": "on", "kineto_trace": "on"}
STEPS = 4
#: every command that reads a profile
COMMANDS = ("summary", "report", "merge", "export", "diff", "kineto")
#: the commands that read each kind of file (they must name it when it is bad)
READS_RAW = {"summary", "report", "diff", "export"}
READS_INFO = {"summary", "report", "diff", "merge", "export"}
READS_START = {"export"}
READS_END = {"summary", "report", "merge"}
READS_MASTER = {"merge"}
READS_OP_STATISTIC = {"diff"}
SEGMENT = "raw.000000001.jsonl"


# -- the profile ---------------------------------------------------------------------------------

def _clone_device(prof: Path, src: int, dst: int) -> None:
    """device_<src> copied as device_<dst>: every file named for the device, and the kineto
    rank, renamed (a second process of the same job, as far as every reader can tell)."""
    old, new = prof / f"device_{src}", prof / f"device_{dst}"
    shutil.copytree(old, new)
    for path in sorted(new.rglob("*")):
        if not path.is_file():
            continue
        name = re.sub(rf"^([a-z_]+)_{src}_(\d+_\d+\.(json|csv))$", rf"\g<1>_{dst}_\2", path.name)
        name = re.sub(rf"^((info\.json|start_info|end_info)\.){src}((\.done)?)$", rf"\g<1>{dst}\3", name)
        if name != path.name:
            path = path.rename(path.with_name(name))
        if path.name.startswith("kineto_"):
            text = path.read_text()
            path.write_text(text.replace('"distributedInfo": {"rank": 0', '"distributedInfo": {"rank": 1'))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runner = Runner(tmp_path_factory.mktemp("base"))
    runner.run(REPO / "tests" / "loops.py", OPTIONS, args=["optimizer_loop", str(STEPS)], timeout=300)
    [prof] = runner.prof_dirs()
    _clone_device(prof, 0, 1)
    return prof


@pytest.fixture
def prof(base: Path, tmp_path: Path) -> Path:
    """A fresh copy of the profile, for one case to break, without its facts files: the readers
    are under test (a facts file answers for a rendered CSV edited in place, see docs/many-ranks.md)."""
    copy = tmp_path / "out" / base.name
    shutil.copytree(base, copy)
    for facts in copy.glob("device_*/data/facts.*.json"):
        facts.unlink()
    return copy


# -- breaking one thing ------------------------------------------------------------------------

def _dev(prof: Path) -> Path:
    return prof / "device_0"


def _set(name: str, text: str | bytes) -> Callable[[Path], str]:
    def mutate(prof: Path) -> str:
        path = _dev(prof) / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return name
    return mutate


def _truncate(name: str) -> Callable[[Path], str]:
    def mutate(prof: Path) -> str:
        path = _dev(prof) / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return name
    return mutate


def _edit_json(name: str, change: Callable[[dict], None]) -> Callable[[Path], str]:
    def mutate(prof: Path) -> str:
        path = _dev(prof) / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
        return name
    return mutate


def _own(**fields: object) -> Callable[[dict], None]:
    return lambda info: info["jobprof"].update(fields)


def _line(text: str | bytes, which: int = 1) -> Callable[[Path], str]:
    """Raw line ``which`` (0-based) of device_0's segment replaced by ``text``."""
    def mutate(prof: Path) -> str:
        path = _dev(prof) / "data" / SEGMENT
        lines = path.read_bytes().splitlines(keepends=True)
        lines[which] = (text if isinstance(text, bytes) else text.encode()) + b"\n"
        path.write_bytes(b"".join(lines))
        return SEGMENT
    return mutate


def _iteration(**fields: object) -> str:
    record = {"index": 2, "start_ns": 1000, "end_ns": 2000, "method": "optimizer_step", **fields}
    return json.dumps({"index": 2, "streams": {"iteration": [record]}}, allow_nan=True)


def _all_lines_bad(prof: Path) -> str:
    path = _dev(prof) / "data" / SEGMENT
    lines = (b'{"index":%d,"streams":{"iteration":[null]}}\n' % i for i in range(1, STEPS + 1))
    path.write_bytes(b"".join(lines))
    return SEGMENT


MASTER = "timeline/msprof_0_4294967295_2.json"
OP_STATISTIC = "summary/op_statistic_0_4294967295_2.csv"

#: name -> (break device_0, the commands that must name the broken file)
CASES: dict[str, tuple[Callable[[Path], str], set[str]]] = {
    # metadata: each file truncated, [1,2,3], null, empty, wrong types, huge numbers, strings for ints
    **{f"{meta}-{kind}": (mutate, readers) for meta, readers in
       (("info.json.0", READS_INFO), ("start_info.0", READS_START), ("end_info.0", READS_END))
       for kind, mutate in (("truncated", _truncate(meta)), ("list", _set(meta, "[1,2,3]")),
                            ("null", _set(meta, "null")), ("empty", _set(meta, "")),
                            ("not-utf8", _set(meta, b'{"a": "\xff\xfe"}')))},
    "info-wrong-types": (_edit_json("info.json.0", lambda i: i.update(hostname=5, rank_id=True, pid=[1])),
                         READS_INFO),
    "info-jobprof-not-object": (_edit_json("info.json.0", lambda i: i.update(jobprof=[1])), READS_INFO),
    "info-huge-rank": (_edit_json("info.json.0", lambda i: i.update(rank_id=10**30)), READS_INFO),
    "info-huge-time-base": (_edit_json("info.json.0", _own(time_base_ns=10**40)), READS_INFO),
    "info-string-time-base": (_edit_json("info.json.0", _own(time_base_ns="abc")), READS_INFO),
    "info-explicit-not-strings": (_edit_json("info.json.0", _own(explicit=[{}], options={"x": 1})),
                                  READS_INFO),
    "info-options-not-object": (_edit_json("info.json.0", _own(options="on")), READS_INFO),
    "info-hostname-escape": (_edit_json("info.json.0", lambda i: i.update(hostname="\x1b]0;x\x07\x1b[2J")),
                             READS_INFO),
    "info-pid-huge": (_edit_json("info.json.0", lambda i: i.update(pid="9" * 40)), READS_INFO),
    "start-wrong-types": (_edit_json("start_info.0", lambda s: s.update(clockMonotonic={})), READS_START),
    "start-begin-list": (_edit_json("start_info.0", lambda s: s.update(collectionTimeBegin=[])), READS_START),
    "start-huge": (_edit_json("start_info.0", lambda s: s.update(clockMonotonic="9" * 40)), READS_START),
    "start-string-for-int": (_edit_json("start_info.0", lambda s: s.update(collectionTimeBegin="soon")),
                             READS_START),
    "start-missing-field": (_edit_json("start_info.0", lambda s: s.pop("clockMonotonic")), READS_START),
    "end-wrong-types": (_edit_json("end_info.0", lambda s: s.update(collectionTimeEnd=True)), READS_END),
    "end-huge": (_edit_json("end_info.0", lambda s: s.update(clockMonotonic=10**30)), READS_END),
    # raw lines
    "raw-negative-index": (_line('{"index":-3,"streams":{"iteration":[{}]}}'), READS_RAW),
    "raw-null-record": (_line('{"index":2,"streams":{"iteration":[null]}}'), READS_RAW),
    "raw-string-start": (_line(_iteration(start_ns="1000")), READS_RAW),
    "raw-nan-start": (_line(_iteration(start_ns=float("nan"))), READS_RAW),
    "raw-bool-end": (_line(_iteration(end_ns=True)), READS_RAW),
    "raw-huge-end": (_line(_iteration(end_ns=10**30)), READS_RAW),
    "raw-end-before-start": (_line(_iteration(start_ns=5000, end_ns=10)), READS_RAW),
    "raw-method-not-string": (_line(_iteration(method=7)), READS_RAW),
    "raw-missing-end": (_line('{"index":2,"streams":{"iteration":[{"index":2,"start_ns":1}]}}'), READS_RAW),
    "raw-not-json": (_line("{garbage"), READS_RAW),
    "raw-json-list": (_line("[1,2,3]"), READS_RAW),
    "raw-json-string": (_line('"a line"'), READS_RAW),
    "raw-no-streams": (_line('{"index":2}'), READS_RAW),
    "raw-no-index": (_line('{"streams":{"iteration":[{}]}}'), READS_RAW),
    "raw-huge-index": (_line('{"index":1000000000000000000000000000000,"streams":{}}'), READS_RAW),
    "raw-float-index": (_line('{"index":2.5,"streams":{}}'), READS_RAW),
    "raw-string-index": (_line('{"index":"2","streams":{}}'), READS_RAW),
    "raw-bool-index": (_line('{"index":true,"streams":{}}'), READS_RAW),
    "raw-infinite-index": (_line('{"index":1e400,"streams":{}}'), READS_RAW),
    "raw-streams-list": (_line('{"index":2,"streams":[1]}'), READS_RAW),
    "raw-stream-not-list": (_line('{"index":2,"streams":{"iteration":{}}}'), READS_RAW),
    "raw-records-not-dicts": (_line('{"index":2,"streams":{"iteration":[1,2]}}'), READS_RAW),
    "raw-empty-iteration": (_line('{"index":2,"streams":{"iteration":[]}}'), READS_RAW),
    "raw-bad-profiler-spans": (_line(_iteration()[:-2] + ',"profiler":[[1],"x",[5,1]]}}'), READS_RAW),
    "raw-plugin-scalars": (_line(_iteration()[:-2] + ',"ops":[5,null],"training_trace":7}}'), READS_RAW),
    "raw-deep-nesting": (_line("[" * 100_000 + "]" * 100_000), READS_RAW),
    "raw-not-utf8": (_line(b'{"index":2,"streams":{"\xff":[]}}'), READS_RAW),
    "raw-every-line-bad": (_all_lines_bad, READS_RAW),
    # per-iteration files
    "master-list-of-ints": (_set(MASTER, "[1,2,3]"), READS_MASTER),
    "master-truncated": (_truncate(MASTER), READS_MASTER),
    "master-trace-events-not-list": (_set(MASTER, '{"traceEvents": 5}'), READS_MASTER),
    "master-bad-events": (_set(MASTER, json.dumps([{"ph": "X", "ts": "soon", "pid": 1, "name": "a"},
                                                   {"ph": "X", "ts": 1, "dur": 1, "args": [], "pid": 1},
                                                   {"ph": "M", "name": "process_name"}, None])),
                          READS_MASTER),
    "master-nan-ts": (_set(MASTER, '[{"ph":"X","ts":NaN,"dur":1,"pid":1,"tid":1,"name":"a"}]'), READS_MASTER),
    "op-statistic-empty": (_set(OP_STATISTIC, ""), READS_OP_STATISTIC),
    "op-statistic-missing-columns": (_set(OP_STATISTIC, "OP Type,Core Type\nlinear,CPU\n"),
                                     READS_OP_STATISTIC),
    "op-statistic-not-utf8": (_set(OP_STATISTIC, b"\xff\xfe\x00OP Type\n"), READS_OP_STATISTIC),
    "op-statistic-bad-cells": (_set(OP_STATISTIC, "Device_id,OP Type,Core Type,Count,Total Time(us)\n"
                                                  "0,linear,CPU,many,NaN\n0,relu\n"), set()),
    "kineto-list-of-ints": (_set("timeline/kineto_0_4294967295_2.json", "[1,2,3]"), set()),
}


# -- running a command -------------------------------------------------------------------------

def argv(command: str, prof: Path, other: Path, out: Path) -> list[str]:
    """``command`` on ``prof``; ``other``: diff's second profile; ``out``: where -o files go."""
    extra = {"report": ["-o", str(out / "report.html")], "merge": ["-o", str(out / "merged.json")],
             "kineto": ["-o", str(out / "kineto")]}.get(command, [])
    return [command, str(prof), *([str(other)] if command == "diff" else []), *extra]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def no_traceback(err: str) -> None:
    assert "Traceback" not in err, err
    assert "internal error" not in err, f"the safety net caught it, not a reader:\n{err}"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_broken_file(case: str, command: str, prof: Path, base: Path, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    mutate, readers = CASES[case]
    name = mutate(prof)
    out = tmp_path / "o"
    out.mkdir()
    code, stdout, err = run_cli(argv(command, prof, base, out), capsys)
    no_traceback(err)
    if command in readers:
        assert Path(name).name in err, f"{name} not named:\n{err}"
    # device_1 is whole: the command still has something to work on
    assert code == 0, f"exit {code}\nstdout:\n{stdout}\nstderr:\n{err}"
    if command == "summary":
        assert "device_1" not in err and re.search(r"^\s*1\*?\s+1\s", stdout, re.M), stdout
    assert "\x1b" not in stdout + err  # nothing read from a file drives the terminal


def _no_devices(prof: Path) -> Path:
    for d in prof.glob("device_*"):
        shutil.rmtree(d)
    return prof


def _zero_iterations(prof: Path) -> Path:
    for d in prof.glob("device_*"):
        for sub in ("data", "timeline", "summary"):
            shutil.rmtree(d / sub)
            (d / sub).mkdir()
    return prof


def _device_is_a_file(prof: Path) -> Path:
    for d in prof.glob("device_*"):
        shutil.rmtree(d)
        d.write_text("not a folder")
    return prof


def _empty_dir(prof: Path) -> Path:
    path = prof.parent.parent / "empty"
    path.mkdir()
    return path


def _not_prof_dir(prof: Path) -> Path:
    path = prof.parent.parent / "results"
    shutil.copytree(prof / "device_0", path / "device_0")
    return path


def _missing(prof: Path) -> Path:
    return prof.parent.parent / "no-such-folder"


def _a_file(prof: Path) -> Path:
    path = prof.parent.parent / "profile.json"
    path.write_text("{}")
    return path


def _prof_named_file(prof: Path) -> Path:
    path = prof.parent.parent / prof.name
    path.write_text("{}")
    return path


#: where nothing is usable: every command exits 1 and names the path it was given
UNUSABLE: dict[str, Callable[[Path], Path]] = {
    "empty-dir": _empty_dir, "non-prof-dir": _not_prof_dir, "nonexistent": _missing, "a-file": _a_file,
    "prof-named-file": _prof_named_file, "no-device-folders": _no_devices,
    "device-folders-are-files": _device_is_a_file, "zero-iterations": _zero_iterations,
}
#: export has nothing to do in a profile without iterations or devices: not an error
EXPORT_OK = {"no-device-folders", "device-folders-are-files", "zero-iterations"}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_nothing_usable(case: str, command: str, prof: Path, base: Path, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    target = UNUSABLE[case](prof)
    out = tmp_path / "o"
    out.mkdir()
    code, stdout, err = run_cli(argv(command, target, base, out), capsys)
    no_traceback(err)
    if command == "export" and case in EXPORT_OK:
        assert code in (0, 1), err
        return
    assert code == 1, f"exit {code}\nstdout:\n{stdout}\nstderr:\n{err}"
    assert target.name in err or target.name in stdout, err


def _spaces(prof: Path) -> Path:
    return prof.parent.parent / "my profiles" / "run 1"


def _unicode(prof: Path) -> Path:
    return prof.parent.parent / "прогон-実行-🚀"


def _long(prof: Path) -> Path:
    return prof.parent.parent.joinpath(*["x" * 200] * 5)


ODD_PATHS = {"spaces": _spaces, "unicode": _unicode, "long": _long}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(ODD_PATHS))
def test_odd_paths(case: str, command: str, prof: Path, base: Path, tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    """A whole profile under an odd folder name reads as any other (the folder holding it given)."""
    holder = ODD_PATHS[case](prof)
    holder.mkdir(parents=True)
    shutil.move(prof, holder / prof.name)
    out = tmp_path / "o"
    out.mkdir()
    code, _, err = run_cli(argv(command, holder, base, out), capsys)
    no_traceback(err)
    assert code == 0, f"exit {code}\nstderr:\n{err}"
    assert not err.strip() or "warning" not in err, err


def test_diff_error_shows_no_python_repr(prof: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 9: diff's "no iterations" error printed the selection as a Python dict."""
    code, _, err = run_cli(["diff", str(prof), str(base), "--rank", "7", "--iterations", "2-3"], capsys)
    assert code == 1 and "no iterations recorded for iterations 2-3, ranks 7" in err, err
    assert "{" not in err and "None" not in err, err


def test_control_characters_from_a_file_are_escaped(prof: Path, base: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """What a problem message quotes from a file someone else wrote cannot drive the terminal."""
    _line('{"index":"\\u001b]0;owned\\u0007\\u001b[2J","streams":{}}')(prof)
    _edit_json("info.json.0", lambda i: i.update(hostname=["\x1b[2J"]))(prof)
    for command in READS_RAW:
        code, _, err = run_cli(argv(command, prof, base, tmp_path), capsys)
        assert code == 0 and "\x1b" not in err and "\\u001b]0;owned" in err, (command, err)


# -- the safety net and real processes -----------------------------------------------------------

def test_internal_error_is_one_line(prof: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception no reader expected (here: a bug planted in the summary) is one line naming
    the command and the profile, exit 1, not a traceback."""
    from jobprof.analysis import summary

    def broken(*_a: object, **_k: object) -> None:
        raise KeyError("start_ns")

    monkeypatch.setattr(summary, "summarize", broken)
    monkeypatch.setattr("jobprof.cli.summary.summarize", broken)
    code, _, err = run_cli(["summary", str(prof)], capsys)
    assert code == 1
    assert err.strip() == (f"jobprof summary: internal error reading {prof}: KeyError: 'start_ns' "
                           "(please report)"), err


@pytest.mark.parametrize("command", COMMANDS)
def test_real_process(command: str, prof: Path, base: Path, tmp_path: Path) -> None:
    """The issue's examples through the installed command: the raw line of finding 8 and
    info.json holding [1,2,3] on device_0, a timeline holding [1,2,3]."""
    _line('{"index":-3,"streams":{"iteration":[{}]}}')(prof)
    _set("info.json.0", "[1,2,3]")(prof)
    _set(MASTER, "[1,2,3]")(prof)
    out = tmp_path / "o"
    out.mkdir()
    proc = jobprof_cli(*argv(command, prof, base, out))
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr
    if command in READS_INFO:
        assert "info.json.0: holds a list, not a JSON object" in proc.stderr, proc.stderr
    if command in READS_RAW - {"export"}:  # export stops at device_0's unusable info.json
        assert f"{SEGMENT}: 1 line(s) left out" in proc.stderr and "index is -3" in proc.stderr, proc.stderr
    if command in READS_MASTER:
        assert "msprof_0_4294967295_2.json: 3 of 3 event(s)" in proc.stderr, proc.stderr


@contextlib.contextmanager
def _read_only_mount(path: Path):
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "none", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a read-only file system (CI runs as root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.parametrize("command", ["merge", "report"])
def test_output_on_read_only_file_system(command: str, prof: Path, tmp_path: Path) -> None:
    with _read_only_mount(tmp_path / "ro") as ro:
        target = ro / ("merged.json" if command == "merge" else "report.html")
        proc = jobprof_cli(command, str(prof), "-o", str(target))
    assert "Traceback" not in proc.stderr and proc.returncode != 0, proc.stderr
    assert str(target) in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr


def test_check_bad_options_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """``check`` reads no profile; its input is the options text."""
    for text in ("[1,2,3]", "null", '{"output": 5', '"x"', '{"training_trace": [null]}'):
        code, _, err = run_cli(["check", "--options", text], capsys)
        assert "Traceback" not in err and code in (0, 1), (text, err)


def test_merge_names_a_missing_clock_anchor(prof: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """merge used to put a job-relative device at epoch 0 when its time base was unknown
    (start_info missing, info.json without time_base_ns): now it names the file and leaves the
    device out, merging the rest."""
    (_dev(prof) / "start_info.0").unlink()
    _edit_json("info.json.0", lambda i: i["jobprof"].pop("time_base_ns"))(prof)
    code, _, err = run_cli(["merge", str(prof), "-o", str(tmp_path / "m.json")], capsys)
    assert code == 0, err
    assert "start_info.0 is missing or unusable" in err and "left out" in err, err
    merged = json.loads((tmp_path / "m.json").read_text())
    assert list(merged["metadata"]["jobprof"]["ranks"]) == ["1"]


def test_ctrl_c_inside_a_lock_is_an_interruption(prof: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C that lands inside a lock's bookkeeping (``future.result()``'s Condition.wait)
    surfaces as RuntimeError("cannot release un-acquired lock") with the KeyboardInterrupt as its
    context: `summary --jobs 2` said "internal error (please report)" and exited 1 (CI run 87).
    Now it is the interruption it is (130), whatever error the interrupt left behind."""
    from jobprof.cli import summary

    def interrupted(args: object) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            # implicit context, as CPython leaves it
            raise RuntimeError("cannot release un-acquired lock")  # noqa: B904

    monkeypatch.setattr(summary, "run", interrupted)
    code, _, err = run_cli(["summary", str(prof)], capsys)
    assert (code, err.strip()) == (130, "jobprof summary: interrupted"), err

    def broken(args: object) -> int:  # the same error without an interrupt: still a bug to report
        raise RuntimeError("cannot release un-acquired lock")

    monkeypatch.setattr(summary, "run", broken)
    code, _, err = run_cli(["summary", str(prof)], capsys)
    assert code == 1 and "internal error" in err and "please report" in err, err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
