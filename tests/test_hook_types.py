"""Every hook implementation is typed, and its types are the contract's.

The hookspec (``jobprof.plugin.hookspec``) is the one place the contract is written; pluggy checks
only argument names.  This test reads every ``@hookimpl`` of every plugin jobprof loads (the
built-ins through their entry points, as a third-party plugin loads) and checks each against its
spec: every argument and the return annotated; an argument's type the spec's own; the return the
spec's or narrower (``list[Section]`` where the spec says ``Iterable[Section] | None``; never
``Any`` where the spec names a type, never a bare ``list``).  mypy (``.ci/typecheck``) then
checks each body against the annotation, so an implementation cannot drift from the spec
unseen.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from typing import Any

import pytest

import jobprof.plugin
from jobprof.engine.manager import PluginManager
from jobprof.plugin import hookspec

SPECS = {name: fn for name, fn in vars(hookspec).items()
         if name.startswith("jobprof_") and callable(fn)}


def _hints(fn: Any) -> dict[str, Any]:
    """The evaluated annotations of ``fn`` (string annotations resolved in its module, with the
    plugin API's names for those imported under ``TYPE_CHECKING``)."""
    namespace = {**vars(jobprof.plugin), **vars(typing), **vars(collections.abc),
                 **getattr(inspect.getmodule(fn), "__dict__", {})}
    return typing.get_type_hints(fn, globalns=namespace)


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def narrower(a: Any, b: Any) -> bool:
    """Whether type ``a`` may stand where the spec says ``b`` (a small, strict subtype rule:
    unions, ``None``, generic origins by subclass with the same arguments)."""
    if a == b or b is Any:
        return True
    if a is Any:
        return False
    if _is_union(a):
        return all(narrower(x, b) for x in _args(a))
    if _is_union(b):
        return any(narrower(a, y) for y in _args(b))
    if a is type(None) or b is type(None):
        return False
    a_origin, b_origin = typing.get_origin(a) or a, typing.get_origin(b) or b
    if not (isinstance(a_origin, type) and isinstance(b_origin, type) and issubclass(a_origin, b_origin)):
        return False
    a_args, b_args = _args(a), _args(b)
    if not b_args:
        return True
    if not a_args:  # a bare generic: its items are Any, narrower than nothing typed
        return all(y is Any for y in b_args)
    if issubclass(a_origin, collections.abc.Iterator) and not issubclass(b_origin, collections.abc.Iterator):
        a_args = a_args[:1]  # Generator[Y, S, R] / Iterator[Y] as an Iterable[Y]
    if len(a_args) != len(b_args):
        return False
    return all(narrower(x, y) for x, y in zip(a_args, b_args, strict=True))


def problems(impl: Any, spec: Any) -> list[str]:
    """What is wrong with ``impl``'s annotations against ``spec``'s; empty when nothing."""
    out = []
    params = inspect.signature(impl).parameters
    raw = getattr(impl, "__annotations__", {})
    missing = [p for p in [*params, "return"] if p not in raw]
    if missing:
        return [f"not annotated: {', '.join(missing)}"]
    got, want = _hints(impl), _hints(spec)
    for name in params:
        if name not in want:
            out.append(f"argument {name!r}: the hook has none")
        elif got[name] != want[name]:
            out.append(f"argument {name!r}: {got[name]} where the spec says {want[name]}")
    if not narrower(got["return"], want["return"]):
        out.append(f"returns {got['return']} where the spec says {want['return']}")
    return out


def _implementations() -> list[tuple[str, str, Any]]:
    manager = PluginManager()
    manager.load_entry_points()
    out = []
    for name, plugin in manager.list_name_plugin():
        if name is None or plugin is hookspec:
            continue
        for attr in dir(plugin):
            fn = getattr(plugin, attr, None)
            if attr.startswith("jobprof_") and getattr(fn, "jobprof_impl", None) is not None:
                out.append((name, attr, fn))
    return out


IMPLEMENTATIONS = _implementations()


def test_every_built_in_plugin_was_read() -> None:
    plugins = {name for name, _, _ in IMPLEMENTATIONS}
    assert {"training_trace", "task_trace", "hccl", "dp", "host_sys", "runtime_api"} <= plugins
    assert len(IMPLEMENTATIONS) >= 90


@pytest.mark.parametrize(("plugin", "hook", "impl"), IMPLEMENTATIONS,
                         ids=[f"{p}.{h}" for p, h, _ in IMPLEMENTATIONS])
def test_an_implementation_is_typed_as_its_spec(plugin: str, hook: str, impl: Any) -> None:
    if getattr(impl, "jobprof_impl", {}).get("wrapper"):
        pytest.skip("a wrapper's types are its generator's")
    assert hook in SPECS, f"{plugin}: no hook {hook}"
    assert problems(impl, SPECS[hook]) == []


def test_the_spec_itself_names_no_bare_container() -> None:
    """The spec is precise: no bare ``list`` / ``dict`` (``list[Any]`` says what it means)."""
    for name, spec in SPECS.items():
        for where, tp in _hints(spec).items():
            for t in [tp, *(_args(tp) if _is_union(tp) else ())]:
                assert t not in (list, dict, tuple, set), f"{name} {where}: bare {t.__name__}"


def test_the_check_fails_on_a_drifted_implementation() -> None:
    """The rule above can fail: each kind of drift is named."""
    from jobprof.plugin import Config, Profile, Section

    def untyped(config):
        return True

    def wrong_argument(config: Config | None) -> bool:
        return True

    def wrong_return(config: Config) -> str:
        return ""

    def bare_list(profile: Profile) -> list:
        return []

    def any_return(profile: Profile) -> Any:
        return []

    def narrowed(profile: Profile) -> list[Section]:
        return []

    def generator(profile: Profile) -> collections.abc.Iterator[Section]:
        yield from ()

    configure, sections = SPECS["jobprof_configure"], SPECS["jobprof_report_sections"]
    assert problems(untyped, configure) == ["not annotated: config, return"]
    assert problems(wrong_argument, configure) == [
        "argument 'config': jobprof.plugin.values.Config | None where the spec says "
        "<class 'jobprof.plugin.values.Config'>"]
    assert problems(wrong_return, configure)[0].startswith("returns <class 'str'>")
    assert problems(bare_list, sections)[0].startswith("returns <class 'list'>")
    assert problems(any_return, sections)[0].startswith("returns typing.Any")
    assert problems(narrowed, sections) == []
    assert problems(generator, sections) == []


def test_the_reference_page_is_generated_from_the_hookspec() -> None:
    """docs/hooks.md is the hookspec's docstrings, rendered: the contract is written once.
    After editing a docstring: ``python -m jobprof.engine.hookdoc > docs/hooks.md``."""
    from conftest import REPO
    from jobprof.engine import hookdoc

    page = (REPO / "docs" / "hooks.md").read_text()
    assert page == hookdoc.render(), "stale: python -m jobprof.engine.hookdoc > docs/hooks.md"
    for number, (name, _) in enumerate(hookdoc.hooks(), 1):
        assert f"### 3.{number} `{name}(" in page
    assert set(SPECS) == {name for name, _ in hookdoc.hooks()}


def test_contributings_example_plugin_is_typed_as_the_spec(tmp_path: Any) -> None:
    """The plugin CONTRIBUTING.md teaches passes the same check (and mypy, in the author's tree)."""
    import importlib.util

    from test_contributing import fenced

    source = tmp_path / "jobprof_gc_example.py"
    source.write_text(fenced("### The module: `jobprof_gc.py`", "python"))
    spec = importlib.util.spec_from_file_location("jobprof_gc_example", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hooks = [name for name in vars(module) if name.startswith("jobprof_")]
    assert len(hooks) == 6
    for name in hooks:
        assert problems(getattr(module, name), SPECS[name]) == [], name
