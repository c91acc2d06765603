"""The layout of ``core/`` is the data flow, and its import graph says so.

Read from the source (``ast``), not from ``sys.modules``: every ``import`` a module executes
counts, at module level or inside a function (a lazy import is still a dependency); imports under
``if TYPE_CHECKING:`` do not (they never run).  Asserted:

* the stages of docs/architecture.md: ``plugin`` (the contract) imports no other stage;
  ``files`` and ``ops`` only ``plugin``; ``analysis`` never ``runtime``; ``imports`` (``jobprof
  import``) only ``plugin``, ``files`` and ``analysis``; ``cli`` never ``runtime``;
* the module graph has no cycle (every module can be imported on its own, in some order);
* the core never imports a plugin, and no plugin imports another plugin;
* a plugin imports from jobprof only the plugin API (the names of ``jobprof.plugin``), its own
  package, and the few mechanisms of :data:`PLUGIN_MAY_ALSO_IMPORT`, type-only imports included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

CORE, PLUGINS = REPO / "core", REPO / "plugins"
STAGES = ("plugin", "engine", "files", "ops", "runtime", "analysis", "imports", "cli")
#: stage -> the stages it may import (itself always allowed)
ALLOWED = {
    # the contract: what a plugin may import, and nothing else
    "plugin": set(),
    # the plugin manager, options and configuration: drives the contract, private to jobprof
    "engine": {"plugin"},
    "files": {"plugin", "engine"},
    "ops": {"plugin"},
    "runtime": {"plugin", "engine", "files", "ops", "analysis"},
    "analysis": {"plugin", "engine", "files", "ops"},
    # jobprof import: reads traces, writes raw data through files/, renders with the export and
    # the facts of analysis/ (never the profiled-process runtime)
    "imports": {"plugin", "engine", "files", "analysis"},
    "cli": {"plugin", "engine", "files", "analysis", "imports"},
}
#: the plugin API: the names of ``jobprof.plugin`` (its ``__all__``); every other jobprof module is
#: private to jobprof: a plugin importing one fails :func:`test_plugins_import_only_the_plugin_api`
#: unless :data:`PLUGIN_MAY_ALSO_IMPORT` names it
PUBLIC = "jobprof.plugin"


#: what a built-in plugin may import from jobprof besides ``jobprof.plugin`` and its own package:
#: mechanisms of a later stage that one plugin drives and that are no part of the contract
PLUGIN_MAY_ALSO_IMPORT = {
    "jobprof.ops.perfcounters": "l2: the CPU's cache counters (perf_event_open)",
    "jobprof.ops.calibrate": "aic_metrics: the device's measured peaks",
}


def _module_name(path: Path) -> str:
    if path.is_relative_to(CORE):
        parts = ["jobprof", *path.relative_to(CORE).with_suffix("").parts]
    else:
        parts = ["jobprof", "plugins", *path.relative_to(PLUGINS).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, name: str, known: set[str], type_only: bool = False) -> set[str]:
    """The jobprof modules ``path`` imports when it runs (``from a import b`` counts ``a.b``
    when that is a module); with ``type_only`` those under ``if TYPE_CHECKING:`` too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("jobprof"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("jobprof"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in out if m in known and m != name}


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    paths = sorted(CORE.rglob("*.py")) + sorted(PLUGINS.rglob("*.py"))
    names = {_module_name(p): p for p in paths}
    known = set(names)
    return {name: _imports(path, name, known, type_only) for name, path in names.items()}


GRAPH = _graph()
#: with the imports type checkers follow (``if TYPE_CHECKING:``) too
TYPED_GRAPH = _graph(type_only=True)


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in STAGES else None


def test_core_is_the_stages() -> None:
    """``ls core/`` shows the stages, the public API (step, mstx) and the autoload."""
    entries = {p.name for p in CORE.iterdir() if p.name != "__pycache__"}
    assert entries == {*STAGES, "__init__.py", "_autoload.py", "mstx.py", "py.typed"}, entries


@pytest.mark.parametrize("stage", STAGES)
def test_stage_imports_only_what_it_may(stage: str) -> None:
    bad = sorted(f"{module} imports {dep}" for module, deps in GRAPH.items() if _stage(module) == stage
                 for dep in deps
                 if _stage(dep) not in (None, stage) and _stage(dep) not in ALLOWED[stage])
    assert not bad, "\n".join(bad)


def test_the_core_never_imports_a_plugin() -> None:
    bad = sorted(f"{m} imports {d}" for m, deps in GRAPH.items() if not m.startswith("jobprof.plugins")
                 for d in deps if d.startswith("jobprof.plugins"))
    assert not bad, "\n".join(bad)


def test_no_plugin_imports_another() -> None:
    def plugin_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "plugins" else None

    bad = sorted(f"{m} imports {d}" for m, deps in GRAPH.items() if plugin_of(m)
                 for d in deps if plugin_of(d) and plugin_of(d) != plugin_of(m))
    assert not bad, "\n".join(bad)


def _plugin_imports(path: Path) -> list[tuple[int, str, str]]:
    """Every ``(line, module, name)`` a plugin file imports from jobprof, type-only ones too
    (``name`` is "" for ``import jobprof.x``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("jobprof"):
            out += [(node.lineno, node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "") for a in node.names if a.name.startswith("jobprof")]
    return out


def _outside_the_api(path: Path, root: Path = PLUGINS) -> list[str]:
    import jobprof.plugin

    parts = path.relative_to(root).parts
    own = "jobprof.plugins" + (f".{parts[0]}" if len(parts) > 1 else "")
    bad = []
    for line, module, name in _plugin_imports(path):
        if module == own or module.startswith(own + "."):
            continue
        if module == PUBLIC and name in jobprof.plugin.__all__:
            continue
        if module in PLUGIN_MAY_ALSO_IMPORT or f"{module}.{name}" in PLUGIN_MAY_ALSO_IMPORT:
            continue
        bad.append(f"{path.relative_to(root.parent)}:{line}: {module}" + (f" import {name}" if name else ""))
    return bad


def test_plugins_import_only_the_plugin_api() -> None:
    """Built-in plugins use what a third-party plugin can: ``from jobprof.plugin import ...``."""
    bad = [b for path in sorted(PLUGINS.rglob("*.py")) for b in _outside_the_api(path)]
    assert not bad, "\n".join(bad)


def test_the_api_rule_sees_an_internal_import(tmp_path: Path) -> None:
    """The rule above can fail: a plugin reaching into a stage, or for a name the API does not
    export, is named with its line, type-only imports too; its own package and the allowed
    mechanisms pass."""
    plugin = tmp_path / "plugins" / "mine" / "thing.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("from jobprof.plugin import hookimpl, Config\n"
                      "from jobprof.engine import manager\n"
                      "from jobprof.plugin.values import Config\n"
                      "from jobprof.ops import perfcounters\n"
                      "from jobprof.plugins.mine.other import x\n"
                      "if TYPE_CHECKING:\n    from jobprof.analysis.profile import Profile\n")
    assert _outside_the_api(plugin, tmp_path / "plugins") == [
        "plugins/mine/thing.py:2: jobprof.engine import manager",
        "plugins/mine/thing.py:3: jobprof.plugin.values import Config",
        "plugins/mine/thing.py:7: jobprof.analysis.profile import Profile"]


def test_the_contract_names_no_later_stage_even_for_types() -> None:
    """``jobprof.plugin`` imports no other stage, type-only imports included: the protocols
    (``Profile``) stand in for the classes of later stages."""
    bad = [f"{path.relative_to(REPO)}:{line}: {module}" for path in sorted((CORE / "plugin").glob("*.py"))
           for line, module, _ in _plugin_imports(path)
           if _stage(module + ".x") not in (None, "plugin")]
    assert not bad, "\n".join(bad)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    # a package's __init__ importing its own submodules is not a cycle worth reporting
    # (Python imports the package first); every other back edge is
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if dep.startswith(node + "."):
                continue
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state:
                found = dfs(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_the_import_graph_is_a_dag() -> None:
    cycle = _cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle or [])


def test_no_circle_even_through_type_only_imports() -> None:
    """A module's annotations name only modules before it: no circle through ``TYPE_CHECKING``
    imports either (the contract's hookspec names the timeline, never the engine that calls it)."""
    cycle = _cycle(TYPED_GRAPH)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_api_package_holds_only_the_contract() -> None:
    """Every module of ``jobprof.plugin`` gives the API a name (``__init__`` imports from it), or
    is a helper of one that does; the engine (manager, options, configuration) lives in
    ``jobprof.engine``, which no plugin imports."""
    api = "jobprof.plugin"
    modules = {m for m in GRAPH if m.startswith(api + ".")}
    exported = {m for m in GRAPH[api] if m in modules}
    reached = set(exported)
    todo = list(exported)
    while todo:
        for dep in GRAPH[todo.pop()]:
            if dep in modules and dep not in reached:
                reached.add(dep)
                todo.append(dep)
    assert modules == reached, sorted(modules - reached)
    for engine in ("manager", "options", "configure", "schemacheck", "moved"):
        assert f"jobprof.engine.{engine}" in GRAPH and f"{api}.{engine}" not in GRAPH
    assert not [m for m, deps in GRAPH.items() if m.startswith("jobprof.plugins")
                for d in deps if _stage(d) == "engine"]


def test_the_checker_sees_a_planted_cycle_and_a_forbidden_import() -> None:
    """The checks above can fail: a graph with a cycle is caught, and so is analysis -> runtime."""
    planted = {k: set(v) for k, v in GRAPH.items()}
    planted["jobprof.plugin.values"].add("jobprof.files.export")
    assert _cycle(planted) is not None
    assert "jobprof.runtime.session" not in GRAPH["jobprof.analysis.summary"]
    assert _stage("jobprof.runtime.session") not in ALLOWED["analysis"]


def test_old_module_paths_still_import_for_existing_plugins() -> None:
    """A plugin written before the restructure (``from jobprof.hookspec import hookimpl``) keeps
    working: the old name is the new module itself, with a DeprecationWarning naming the new path."""
    import importlib
    import sys

    import jobprof.plugin as types
    from jobprof.engine import moved

    moved.install()
    moved.install()  # idempotent
    assert sum(type(f).__name__ == "_Alias" for f in sys.meta_path) == 1
    sys.modules.pop("jobprof.types", None)
    with pytest.warns(DeprecationWarning, match="jobprof.types moved to jobprof.plugin;"):
        old = importlib.import_module("jobprof.types")
    assert old is types and old.WriterSpec is types.WriterSpec
    for name, new in moved.MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not CORE.joinpath(*name.split(".")[1:]).with_suffix(".py").exists(), name
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("jobprof.no_such_module")


def test_the_profile_class_has_every_member_of_the_protocol() -> None:
    """``jobprof.analysis.profile.Profile`` is what the ``Profile`` protocol of the plugin API
    says: every member, with the same parameters (mypy checks the types: the class is passed
    where the protocol is expected in the hook calls)."""
    import inspect

    from jobprof.analysis.profile import Profile
    from jobprof.plugin import views

    members = [m for m in vars(views.Profile) if not m.startswith("_")]
    assert {"devices", "iterations", "records", "open_text", "problem"} <= set(members)
    for member in members:
        mine, theirs = getattr(views.Profile, member), getattr(Profile, member)
        if isinstance(mine, property):
            assert isinstance(theirs, property), member
        else:
            params = [list(inspect.signature(f).parameters) for f in (mine, theirs)]
            assert params[0] == params[1], member


def test_the_documented_example_plugins_import_only_the_plugin_api(tmp_path: Path) -> None:
    """Every example plugin in CONTRIBUTING and docs/ (a python block with ``@hookimpl``)
    imports what the built-ins may: the names of ``jobprof.plugin``."""
    import re

    blocks = [(doc, block) for doc in [REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
              for block in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S) if "@hookimpl" in block]
    assert sum("from jobprof" in block for _, block in blocks) >= 2  # the examples that import
    bad = []
    for n, (doc, block) in enumerate(blocks):
        path = tmp_path / "plugins" / f"example{n}" / "__init__.py"
        path.parent.mkdir(parents=True)
        path.write_text(block)
        try:
            bad += [f"{doc.name}: {b}" for b in _outside_the_api(path, tmp_path / "plugins")]
        except SyntaxError:
            continue  # a fragment (``...``) that is not a module: it imports nothing to check
    assert not bad, "\n".join(bad)


def test_the_channel_is_api_but_imported_only_when_used() -> None:
    """``from jobprof.plugin import channel`` gives the socket channel (a name of ``__all__``), but
    importing ``jobprof.plugin``, which every profiled process does at interpreter start, does not
    import it, nor the socket modules it needs."""
    import os
    import subprocess
    import sys

    import jobprof.plugin

    assert "channel" in jobprof.plugin.__all__ and "read_raw" in jobprof.plugin.__all__
    code = ("import sys, jobprof.plugin\n"
            "heavy = ('jobprof.plugin.channel', 'socket', 'selectors', 'secrets', 'tempfile')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "from jobprof.plugin import channel\n"
            "print(channel is sys.modules['jobprof.plugin.channel'] is jobprof.plugin.channel)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFILING_", "JOBPROF_"))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "True"], proc.stdout
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        jobprof.plugin.no_such_name  # noqa: B018
