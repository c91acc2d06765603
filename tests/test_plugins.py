"""Third-party plugins, working and broken, found through real entry points in real jobs.

Every plugin here is a test-local distribution (tests/distributions.py) put on PYTHONPATH of a
profiled child process, so discovery, loading and the hook lifecycle are exactly those of a
pip-installed plugin.  Two jobs are shared by the tests of this module: one with working
plugins, one with a dozen plugins broken in every way we know; each test asserts one outcome.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import Runner, jobprof_cli, raw, raw_iterations
from distributions import make_dist
from jobprof.engine.manager import PluginManager
from jobprof.plugin.hookspec import Answer, hookimpl
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.values import MetricSet, WriterSpec

ITERATIONS = 5
MODEL = 4294967295
MARKER = "side_effect_imported"

JOB = f"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range({ITERATIONS}):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
print("training done")
"""

# -- working plugins -------------------------------------------------------------------------
GOOD = """
from jobprof.plugin.hookspec import hookimpl
from jobprof.plugin import WriterSpec

STREAM = "good"

@hookimpl
def jobprof_options_schema():
    return {"properties": {"good_trace": {"$ref": "#/$defs/level", "default": "off"}}}

@hookimpl
def jobprof_configure(config):
    return config.is_on("good_trace")

@hookimpl
def jobprof_session_start(session):
    session.attach(STREAM, {"iterations": 0, "mode": session.config["good_trace"]})

@hookimpl
def jobprof_iteration_end(session, iteration):
    state = session.attached(STREAM)
    state["iterations"] += 1
    return {STREAM: [{"iteration": iteration.index, "seen": state["iterations"],
                      "mode": state["mode"]}]}

@hookimpl
def jobprof_session_end(session):
    count = session.attached(STREAM)["iterations"]
    session.reporter.info(f"good: session_end after {count} iterations")

def render(ctx):
    rows = "".join(f"{r['iteration']},{r['seen']},{r['mode']}\\n" for r in ctx.records(STREAM))
    return "Iteration,Seen,Mode\\n" + rows

@hookimpl
def jobprof_writers(config):
    return [WriterSpec("good_stats", "csv", render, "one row per iteration")]
"""

# implementations that accept fewer arguments than the hook offers (pluggy semantics)
PARTIAL = """
from jobprof.plugin.hookspec import hookimpl

@hookimpl
def jobprof_configure():
    return True

@hookimpl
def jobprof_iteration_end(iteration):
    return {"partial": [{"iteration": iteration.index}]}
"""

# records built later, on the sink thread: a callable instead of the list
DEFERRED = """
import functools, threading
from jobprof.plugin.hookspec import hookimpl

def build(session, index, end_ns):
    thread = threading.current_thread().name
    session.attached("deferred")["built"].append(index)
    return [{"iteration": index, "thread": thread, "end_ns": end_ns}] if index != 2 else []

@hookimpl
def jobprof_session_start(session):
    session.attach("deferred", {"built": []})

@hookimpl
def jobprof_iteration_end(session, iteration):
    return {"deferred": functools.partial(build, session, iteration.index, iteration.end_ns)}

@hookimpl
def jobprof_session_end(session):
    session.reporter.info(f"deferred: built before session_end: {session.attached('deferred')['built']}")
"""

# a module with an import-time side effect: it must never be imported when disabled
SIDE_EFFECT = f"""
from pathlib import Path

Path.cwd().joinpath({MARKER!r}).write_text("imported")

from jobprof.plugin.hookspec import hookimpl

@hookimpl
def jobprof_options_schema():
    return {{"properties": {{"side_key": {{"$ref": "#/$defs/switch", "default": "off"}}}}}}
"""

# -- broken plugins: (module name, source, reason expected on stderr) ------------------------
BROKEN: dict[str, tuple[str, str]] = {
    "import_error": ("import jobprof_no_such_module\n",
                     "cannot import 'import_error': ModuleNotFoundError: "
                     "No module named 'jobprof_no_such_module'"),
    "exit_at_import": ("raise SystemExit(3)\n", "cannot import 'exit_at_import': SystemExit: 3"),
    "misspelled": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_iteration_ends(session, iteration):
            return {"misspelled": [{}]}
        """, "implements unknown hook(s): jobprof_iteration_ends "
             "(did you mean jobprof_iteration_end?)"),
    "extra_arg": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_iteration_end(session, iteration, batch):
            return {"extra_arg": [{}]}
        """, "Argument(s) {'batch'} are declared in the hookimpl but can not be found"),
    "iter_raises": ("""
        from jobprof.plugin.hookspec import hookimpl
        from jobprof.plugin import WriterSpec

        @hookimpl
        def jobprof_iteration_end(iteration):
            if iteration.index == 2:
                raise RuntimeError("sensor unplugged")
            return {"iter_raises": [{"iteration": iteration.index}]}

        def render(ctx):
            return "Iteration\\n" + "".join(f"{r['iteration']}\\n" for r in ctx.records("iter_raises"))

        @hookimpl
        def jobprof_writers(config):
            return [WriterSpec("iter_raises", "csv", render)]

        @hookimpl
        def jobprof_session_end(session):  # runs when the plugin is disabled mid-run
            import sys
            sys.stderr.write(f"iter_raises: cleaned up (session {session.state})\\n")
        """, "jobprof_iteration_end raised RuntimeError: sensor unplugged (iter_raises.py:"),
    "start_raises": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_session_start(session):
            raise KeyError("no such device")

        @hookimpl
        def jobprof_iteration_end(iteration):
            return {"start_raises": [{"iteration": iteration.index}]}
        """, "jobprof_session_start raised KeyError: 'no such device'"),
    "render_raises": ("""
        from jobprof.plugin.hookspec import hookimpl
        from jobprof.plugin import WriterSpec

        @hookimpl
        def jobprof_iteration_end(iteration):
            return {"render_raises": [{"iteration": iteration.index}]}

        def render(ctx):  # a different message per iteration: still reported once
            raise ValueError(f"cannot render iteration {ctx.iteration.index}")

        @hookimpl
        def jobprof_writers(config):
            return [WriterSpec("render_raises", "csv", render)]
        """, "writer 'render_raises' raised ValueError: cannot render iteration "),
    "not_json": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_iteration_end(iteration):
            return {"not_json": [{"when": object()}]}  # cannot be stored: only this stream goes
        """, "stream 'not_json' is not JSON-serialisable: Object of type object"),
    "deferred_raises": ("""
        from jobprof.plugin.hookspec import hookimpl

        def build(index):
            if index == 3:
                raise KeyError("lost the sensor")
            return [{"iteration": index}]

        @hookimpl
        def jobprof_iteration_end(iteration):
            return {"deferred_raises": lambda: build(iteration.index)}
        """, "deferred records of stream 'deferred_raises' (iteration 3): KeyError: 'lost the sensor'"),
    "end_raises": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_iteration_end(iteration):
            return {"end_raises": [{"iteration": iteration.index}]}

        @hookimpl
        def jobprof_session_end(session):
            raise OSError("cannot close")
        """, "jobprof_session_end raised OSError: cannot close"),
    "exits_in_hook": ("""
        import sys
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_iteration_end(iteration):
            if iteration.index == 3:
                sys.exit(5)
            return {"exits_in_hook": [{"iteration": iteration.index}]}
        """, "jobprof_iteration_end raised SystemExit: 5"),
    "stream_thief": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_iteration_end(iteration):
            return {"training_trace": [{"stolen": True}]}
        """, "jobprof_iteration_end returned stream 'training_trace', which belongs to "
             "plugin 'training_trace'"),
    "bad_schema": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_options_schema():
            return {"properties": {"bad_key": {"type": "no-such-type"}}}
        """, "jobprof_options_schema returned an invalid JSON Schema: "),
    "dangling_ref": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_options_schema():
            return {"$defs": {"celsius": {"type": "number"}},
                    "properties": {"temp": {"$ref": "#/$defs/celsius"},
                                   "mode": {"$ref": "#/$defs/switch"},
                                   "bad_key": {"$ref": "#/$defs/nope"}}}
        """, "jobprof_options_schema returned a schema with $ref(s) that resolve to nothing: "
             "#/$defs/nope"),
    "schema_not_mapping": ("""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_options_schema():
            return ["bad_key"]
        """, "jobprof_options_schema returned list, not a JSON Schema object"),
}


# not broken enough to fail: the plugin stays active, the forgotten decorator is reported
UNDECORATED = """
def jobprof_iteration_end(session, iteration):
    return {"undecorated": [{"iteration": iteration.index}]}
"""


def dup_module(stream: str) -> str:
    return f"""
        from jobprof.plugin.hookspec import hookimpl

        @hookimpl
        def jobprof_iteration_end(iteration):
            return {{{stream!r}: [{{"iteration": iteration.index}}]}}
        """


def build_dists(base: Path) -> dict[str, Path]:
    """Every test-local distribution, one PYTHONPATH root each (for a fixed sys.path order)."""
    return {
        "good": make_dist(base / "good", "jobprof-good-plugin",
                          {"good_plugin": GOOD, "partial_plugin": PARTIAL, "deferred_plugin": DEFERRED},
                          {"good": "good_plugin", "partial": "partial_plugin", "deferred": "deferred_plugin"},
                          version="2.3.1"),
        "side": make_dist(base / "side", "jobprof-side-effect", {"side_effect": SIDE_EFFECT},
                          {"side_effect": "side_effect"}, version="0.4"),
        "broken": make_dist(base / "broken", "jobprof-broken",
                            {"undecorated": UNDECORATED,
                             **{name: source for name, (source, _) in BROKEN.items()}},
                            # zz_alias: a second entry point to a module already registered
                            {**{name: name for name in BROKEN}, "zz_alias": "end_raises",
                             "undecorated": "undecorated"},
                            version="0.0.1"),
        # two distributions claim "dup"; the second also claims the built-in's name
        "dup_a": make_dist(base / "dup_a", "jobprof-dup-a", {"dup_a": dup_module("dup_a")},
                           {"dup": "dup_a"}),
        "dup_b": make_dist(base / "dup_b", "jobprof-dup-b", {"dup_b": dup_module("dup_b")},
                           {"dup": "dup_b", "training_trace": "dup_b"}),
    }


def pythonpath(dists: dict[str, Path], *names: str) -> str:
    return ":".join(str(dists[name]) for name in names)


def disabled_lines(stderr: str, name: str) -> list[str]:
    return [line for line in stderr.splitlines() if f"plugin '{name}' disabled: " in line]


# -- the two jobs ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_dists(tmp_path_factory.mktemp("dists"))


@pytest.fixture(scope="module")
def good_job(dists: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Runner, subprocess.CompletedProcess]:
    runner = Runner(tmp_path_factory.mktemp("good_job"))
    proc = runner.run(JOB, {"training_trace": "on", "good_trace": "l2"},
                      env={"PYTHONPATH": pythonpath(dists, "good", "side"),
                           "JOBPROF_DISABLE_PLUGINS": " side_effect , not_installed"})
    return runner, proc


@pytest.fixture(scope="module")
def broken_job(dists: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Runner, subprocess.CompletedProcess]:
    runner = Runner(tmp_path_factory.mktemp("broken_job"))
    proc = runner.run(JOB, {"training_trace": "on"},
                      env={"PYTHONPATH": pythonpath(dists, "broken", "side", "dup_a", "dup_b")})
    return runner, proc


# -- a working third-party plugin ------------------------------------------------------------
def test_good_plugin_gets_every_hook_and_writes_raw_and_exported_files(good_job):
    runner, proc = good_job
    assert "training done" in proc.stdout
    device = runner.device_dir()
    expected = list(range(1, ITERATIONS + 1))
    for stream in ("iteration", "training_trace", "good"):
        assert raw_iterations(device, stream) == expected, stream
    for i in expected:
        records = raw(device)[i]["good"]
        # session_start ran first (state attached), iteration_end once per iteration, in order,
        # and the configured value of the plugin's own option key reached it
        assert records == [{"iteration": i, "seen": i, "mode": "l2"}]
        rows = list(csv.DictReader(io.StringIO(
            (device / "summary" / f"good_stats_0_{MODEL}_{i}.csv").read_text())))
        assert rows == [{"Iteration": str(i), "Seen": str(i), "Mode": "l2"}]
        assert (device / "summary" / f"step_trace_0_{MODEL}_{i}.csv").is_file()
        assert (device / "timeline" / f"step_trace_0_{MODEL}_{i}.json").is_file()
    assert not (device / "summary" / f"good_stats_0_{MODEL}_{ITERATIONS + 1}.csv").exists()
    # session_end ran after the last iteration; its message also lands in the metadata
    assert f"jobprof: good: session_end after {ITERATIONS} iterations" in proc.stderr
    info = json.loads((device / "info.json.0").read_text())["jobprof"]
    assert f"jobprof: good: session_end after {ITERATIONS} iterations" in info["messages"]
    assert info["options"]["good_trace"] == "l2"


def test_partial_argument_implementations_are_called(good_job):
    runner, proc = good_job
    device = runner.device_dir()
    assert raw_iterations(device, "partial") == list(range(1, ITERATIONS + 1))
    assert raw(device)[3]["partial"] == [{"iteration": 3}]
    info = json.loads((device / "info.json.0").read_text())["jobprof"]
    assert {"good", "partial", "training_trace"} <= set(info["plugins"])
    assert "side_effect" not in info["plugins"]
    assert "disabled" not in proc.stderr and "warning" not in proc.stderr


def test_deferred_records_are_built_off_the_training_thread_in_order(good_job):
    runner, proc = good_job
    device = runner.device_dir()
    # iteration 2 built an empty list: nothing stored for it
    assert raw_iterations(device, "deferred") == [1, 3, 4, 5]
    for i in (1, 3, 4, 5):
        (record,) = raw(device)[i]["deferred"]
        assert record["iteration"] == i
        assert record["end_ns"] == raw(device)[i]["iteration"][0]["end_ns"]
        # the sink thread, or the main thread settling the last ones at exit; never inline
        assert record["thread"] in ("jobprof-sink", "MainThread")
    # every deferred list was built before the plugin's session_end ran, in iteration order
    assert f"deferred: built before session_end: {list(range(1, ITERATIONS + 1))}" in proc.stderr


def test_offline_export_renders_third_party_files(good_job, dists):
    runner, _ = good_job
    device = runner.device_dir()
    produced = {p.name: p.read_text() for p in (device / "summary").glob("good_stats_*.csv")}
    assert len(produced) == ITERATIONS
    for name in produced:
        (device / "summary" / name).unlink()
    proc = jobprof_cli("export", str(device.parent))  # the plugin is not installed here
    assert proc.returncode == 0, proc.stderr
    assert not list((device / "summary").glob("good_stats_*.csv"))
    proc = jobprof_cli("export", str(device.parent), env={"PYTHONPATH": str(dists["good"])})
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_text() for p in (device / "summary").glob("good_stats_*.csv")} == produced


# -- JOBPROF_DISABLE_PLUGINS -----------------------------------------------------------------
def test_disabled_plugin_is_never_imported(good_job, broken_job):
    good_runner, _ = good_job
    broken_runner, _ = broken_job
    assert not (good_runner.tmp / MARKER).exists()  # disabled: never imported
    assert (broken_runner.tmp / MARKER).read_text() == "imported"  # control: not disabled


# -- broken plugins never break the job ------------------------------------------------------
def test_job_with_broken_plugins_runs_and_is_profiled(broken_job):
    runner, proc = broken_job
    assert proc.returncode == 0
    assert "training done" in proc.stdout
    device = runner.device_dir()
    expected = list(range(1, ITERATIONS + 1))
    assert raw_iterations(device, "iteration") == expected
    for i in expected:
        assert (device / "summary" / f"step_trace_0_{MODEL}_{i}.csv").is_file()
        assert (device / "timeline" / f"step_trace_0_{MODEL}_{i}.json").is_file()
    info = json.loads((device / "info.json.0").read_text())["jobprof"]
    assert info["end_reason"] == "exit"
    assert info["iterations_written"] == ITERATIONS
    # of the test-local plugins only these survive; the built-in does too
    local = set(BROKEN) | {"dup", "side_effect", "zz_alias", "undecorated"}
    assert set(info["plugins"]) & local == {"dup", "side_effect", "undecorated"}
    assert "training_trace" in info["plugins"]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_plugin_is_named_once_with_its_reason(broken_job, name):
    _, proc = broken_job
    lines = disabled_lines(proc.stderr, name)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"jobprof: warning: plugin '{name}' disabled: ")
    assert BROKEN[name][1] in lines[0]


def test_summary_lists_the_plugins_disabled_during_the_run(broken_job):
    from conftest import jobprof_cli

    runner, _ = broken_job
    proc = jobprof_cli("summary", str(runner.out))
    assert proc.returncode == 0, proc.stderr
    missing = proc.stdout.split("\nMissing\n", 1)[1]
    assert "plugin 'iter_raises' was disabled from iteration 2 on every rank: " \
           "jobprof_iteration_end raised RuntimeError: sensor unplugged" in missing, missing
    assert "plugin 'deferred_raises' was disabled" in missing


def test_failing_hooks_stop_their_plugin_only(broken_job):
    runner, proc = broken_job
    device = runner.device_dir()
    assert raw_iterations(device, "iter_raises") == [1]  # raised at 2, never called again
    # its session_end ran once, when it was disabled (not again at exit)
    assert proc.stderr.count("iter_raises: cleaned up (session collecting)") == 1
    assert raw_iterations(device, "exits_in_hook") == [1, 2]  # sys.exit at 3 was contained
    assert raw_iterations(device, "start_raises") == []  # failed before the first iteration
    assert raw_iterations(device, "end_raises") == list(range(1, ITERATIONS + 1))
    assert raw_iterations(device, "deferred_raises") == [1, 2]  # its callable raised at 3
    assert not list((device / "summary").glob("render_raises_*"))
    for never in ("misspelled", "extra_arg", "dup_b"):
        assert raw_iterations(device, never) == []


def test_stream_of_another_plugin_cannot_be_overwritten(broken_job):
    runner, _ = broken_job
    device = runner.device_dir()
    assert raw_iterations(device, "training_trace") == list(range(1, ITERATIONS + 1))
    for i in range(1, ITERATIONS + 1):
        records = raw(device)[i]["training_trace"]
        assert records and all("stolen" not in r for r in records)


def test_duplicate_entry_point_names(broken_job):
    runner, proc = broken_job
    device = runner.device_dir()
    # the first distribution on sys.path keeps "dup"; the built-in keeps "training_trace"
    assert raw_iterations(device, "dup_a") == list(range(1, ITERATIONS + 1))
    assert raw_iterations(device, "dup_b") == []
    [dup] = disabled_lines(proc.stderr, "dup (jobprof-dup-b)")
    assert "the name 'dup' is already taken by jobprof-dup-a 1.0" in dup
    [builtin] = disabled_lines(proc.stderr, "training_trace (jobprof-dup-b)")
    assert re.search(r"the name 'training_trace' is already taken by jobprof \d", builtin)


def test_alias_of_a_registered_module_is_failed(broken_job):
    _, proc = broken_job
    [line] = disabled_lines(proc.stderr, "zz_alias")
    assert line.endswith("the same object is already registered as 'end_raises'")


def test_forgotten_hookimpl_decorator_is_reported(broken_job):
    runner, proc = broken_job
    assert ("jobprof: warning: plugin 'undecorated': jobprof_iteration_end is not marked with "
            "@hookimpl and is never called") in proc.stderr.splitlines()
    assert raw_iterations(runner.device_dir(), "undecorated") == []


def test_invalid_schema_fragments_do_not_cost_the_options(broken_job):
    runner, proc = broken_job
    # the options were composed and validated without the two bad fragments
    info = json.loads((runner.device_dir() / "info.json.0").read_text())["jobprof"]
    assert info["options"]["training_trace"] == "on"
    assert "bad_key" not in info["options"]
    assert "internal error" not in proc.stderr


def test_writers_of_a_failed_plugin_stop(broken_job):
    runner, _ = broken_job
    files = sorted((runner.device_dir() / "summary").glob("iter_raises_*.csv"))
    assert [p.name for p in files] == [f"iter_raises_0_{MODEL}_1.csv"]


# -- the manager itself (in-process, fast) ---------------------------------------------------
def _manager() -> tuple[PluginManager, io.StringIO]:
    stream = io.StringIO()
    return PluginManager(Reporter(stream)), stream


class _Configure:
    @staticmethod
    @hookimpl
    def jobprof_configure(config: object) -> bool:
        return True


def test_fail_is_idempotent_and_keeps_the_first_error():
    manager, stream = _manager()
    manager.register(_Configure, "p")
    manager.fail("p", "first")
    manager.fail("p", "second")
    assert manager.record("p").error == "first"
    assert stream.getvalue() == "jobprof: warning: plugin 'p' disabled: first\n"
    assert manager.configure(None) == []


def test_the_writers_of_a_plugin_configured_off_are_not_asked():
    """The core asks ``jobprof_configure(config)`` before ``jobprof_writers(config)``: a plugin
    whose option is off writes nothing without checking it again; ``jobprof plugins`` (config
    None) still lists its files."""
    from jobprof.plugin.values import Config

    manager, _ = _manager()
    asked: list[str] = []

    def plugin(name: str) -> type:
        class Plugin:
            @staticmethod
            @hookimpl
            def jobprof_configure(config: Config) -> bool:
                return config.is_on(name)

            @staticmethod
            @hookimpl
            def jobprof_writers(config: Config | None) -> list:
                asked.append(name)
                return [WriterSpec(name, "csv", lambda ctx: "")]
        return Plugin

    manager.register(plugin("on_one"), "on_one")
    manager.register(plugin("off_one"), "off_one")
    config = Config({"on_one": "on", "off_one": "off"})
    assert [name for name, _ in manager.writers(config)] == ["on_one"]
    assert asked == ["on_one"]
    assert sorted(name for name, _ in manager.writers(None)) == ["off_one", "on_one"]
    assert manager.is_active("off_one")  # asked, not deactivated: the session's state is its own


def test_generator_results_are_listed_inside_the_isolation():
    manager, stream = _manager()

    class Lazy:
        @staticmethod
        @hookimpl
        def jobprof_writers(config: object):
            yield WriterSpec("lazy", "csv", lambda ctx: "")

    class Exploding:
        @staticmethod
        @hookimpl
        def jobprof_writers(config: object):
            yield WriterSpec("boom", "csv", lambda ctx: "")
            raise RuntimeError("late failure")

    manager.register(Lazy, "lazy")
    manager.register(Exploding, "exploding")
    results = manager.writers(None)
    assert [(name, [s.name for s in specs]) for name, specs in results] == [("lazy", ["lazy"])]
    assert "plugin 'exploding' disabled: jobprof_writers raised RuntimeError: late failure" \
        in stream.getvalue()
    assert manager.active() == ["lazy"]
    assert manager.is_active("lazy") and not manager.is_active("exploding")


def test_old_style_hook_wrappers_are_refused():
    manager, _ = _manager()

    class Wrapper:
        @staticmethod
        @hookimpl(hookwrapper=True)
        def jobprof_configure(config: object):
            yield

    with pytest.raises(ValueError, match=r"old-style hook wrappers .* use wrapper=True: jobprof_configure"):
        manager.register(Wrapper, "wrapper")
    assert not manager.has_plugin("wrapper")
    assert manager.record("wrapper") is None


def _writer_plugin(name: str) -> type:
    class P:
        @staticmethod
        @hookimpl
        def jobprof_writers(config: object) -> list:
            return [WriterSpec(name, "csv", lambda ctx: "")]

    return P


def test_a_wrapper_wraps_the_hook_and_sees_the_checked_answers():
    manager, stream = _manager()
    seen: list = []

    class Wrapper:
        @staticmethod
        @hookimpl(wrapper=True)
        def jobprof_writers(config: object):
            answers = yield
            seen.append(list(answers))
            # drops one answer, adds its own (a generator: checked and listed like any answer)
            mine = Answer("wrapper", (WriterSpec(n, "csv", lambda ctx: "") for n in ["extra"]))
            return [a for a in answers if a.plugin != "b"] + [mine]

    manager.register(_writer_plugin("a_file"), "a")
    manager.register(_writer_plugin("b_file"), "b")
    manager.register(Wrapper, "wrapper")
    results = manager.writers(None)
    assert [(name, [s.name for s in specs]) for name, specs in results] == \
        [("a", ["a_file"]), ("wrapper", ["extra"])]
    # the wrapper saw both implementations' answers, already listed
    # (pluggy's order: the last registered first)
    assert [(a.plugin, [s.name for s in a.value]) for a in seen[0]] == [("b", ["b_file"]), ("a", ["a_file"])]
    assert stream.getvalue() == ""


def test_a_wrapper_of_the_hand_over_takes_it_through_pluggy():
    manager, _ = _manager()
    calls: list = []

    class Temp:
        @staticmethod
        @hookimpl
        def jobprof_iteration_end(iteration: object) -> dict:
            return {"temp": [iteration]}

    class Timer:
        @staticmethod
        @hookimpl(wrapper=True)
        def jobprof_iteration_end(session: object, iteration: object):
            answers = yield
            calls.append([(a.plugin, a.value) for a in answers])
            return answers

    manager.register(Temp, "temp")
    assert manager.iteration_end(None, 1) == [("temp", {"temp": [1]})]  # the direct plan
    manager.register(Timer, "timer")
    assert manager.iteration_end(None, 2) == [("temp", {"temp": [2]})]
    assert calls == [[("temp", {"temp": [2]})]]
    manager.deactivate("timer")  # an inactive wrapper wraps nothing: back to the direct plan
    assert manager.iteration_end(None, 3) == [("temp", {"temp": [3]})]
    assert len(calls) == 1


@pytest.mark.parametrize("where", ["before", "after", "returns"])
def test_a_failing_wrapper_is_disabled_by_name_and_the_answers_pass(where: str):
    manager, stream = _manager()

    class Broken:
        @staticmethod
        @hookimpl(wrapper=True)
        def jobprof_writers(config: object):
            if where == "before":
                raise RuntimeError("no setup")
            yield
            if where == "after":
                raise RuntimeError("no teardown")
            return {"not": "a list"}

    manager.register(_writer_plugin("a_file"), "a")
    manager.register(Broken, "broken")
    results = manager.writers(None)
    assert [(name, [s.name for s in specs]) for name, specs in results] == [("a", ["a_file"])]
    message = {"before": "jobprof_writers raised RuntimeError: no setup (test_plugins.py:",
               "after": "jobprof_writers raised RuntimeError: no teardown (test_plugins.py:",
               "returns": "jobprof_writers wrapper returned dict, not a list of Answer"}[where]
    assert stream.getvalue().startswith(f"jobprof: warning: plugin 'broken' disabled: {message}")
    assert stream.getvalue().count("disabled") == 1
    assert manager.active() == ["a"]
    assert [name for name, _ in manager.writers(None)] == ["a"]  # the wrapper is gone for good


def test_firstresult_stops_at_the_first_answer_built_ins_first():
    manager, stream = _manager()
    manager.load_entry_points({})
    asked: list[str] = []

    def group_plugin(plugin: str, group: str) -> type:
        class P:
            @staticmethod
            @hookimpl(tryfirst=plugin == "second")  # ignored on a third-party plugin
            def jobprof_aic_metrics(name: str) -> MetricSet | None:
                asked.append(plugin)
                if name == group:
                    return MetricSet(group, [f"{plugin}_col"], values=lambda task, machine: [1])
                return None

        return P

    # registered after the built-ins (and one tryfirst): pluggy alone would ask these first
    manager.register(group_plugin("second", "PipeUtilization"), "second")
    manager.register(group_plugin("third", "Intensity"), "third")
    manager.register(group_plugin("fourth", "Intensity"), "fourth")
    plugin, metrics = manager.aic_metrics("PipeUtilization")
    assert plugin == "aic_metrics" and "second_col" not in metrics.columns
    assert asked == []  # the built-in answered: no later implementation was called
    plugin, metrics = manager.aic_metrics("Intensity")
    assert (plugin, list(metrics.columns)) == ("fourth", ["fourth_col"])
    assert asked == ["fourth"]  # the last registered first (pluggy's override order), stopped there
    assert manager.aic_metrics(None) is None
    assert "disabled" not in stream.getvalue()


def test_deactivate_leaves_a_plugin_out_of_the_session_hooks():
    manager, _ = _manager()
    started: list = []

    class P:
        @staticmethod
        @hookimpl
        def jobprof_session_start(session: object) -> None:
            started.append(session)

        @staticmethod
        @hookimpl
        def jobprof_iteration_end(iteration: object) -> dict:
            return {"p": [iteration]}

    manager.register(P, "p")
    assert manager.iteration_end(None, 1) == [("p", {"p": [1]})]
    assert manager.active_set() == {"p"}
    manager.deactivate("p")
    assert manager.inactive == {"p"} and not manager.is_active("p")
    assert manager.iteration_end(None, 2) == [] and manager.active_set() == frozenset()
    manager.session_start("s")
    assert started == []


def test_streams_belong_to_the_first_plugin_that_returns_them():
    manager, stream = _manager()

    def plugin(streams: dict) -> type:
        class P:
            @staticmethod
            @hookimpl
            def jobprof_iteration_end(iteration: object) -> dict:
                return streams

        return P

    # pluggy calls the last registered first: "first" is the first to return "temp"
    manager.register(plugin({"temp": [2]}), "second")
    manager.register(plugin({"iteration": []}), "core_thief")
    manager.register(plugin({"Bad-Name": []}), "bad_name")
    manager.register(plugin({"ok": "not a list"}), "not_list")
    manager.register(plugin({"temp": [1]}), "first")
    assert manager.iteration_end(None, None) == [("first", {"temp": [1]})]
    assert manager.stream_owner("temp") == "first"
    assert manager.active() == ["first"]
    for name in ("second", "core_thief", "bad_name", "not_list"):
        assert f"plugin '{name}' disabled: jobprof_iteration_end returned " in stream.getvalue()
