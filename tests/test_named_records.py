"""Plugins read records by name: no positional or raw-key read of a record in ``plugins/``.

A plugin's raw streams stay compact on the wire (lists, one-letter keys: the hot path writes
them), and are decoded into named records (``attrs`` frozen classes, ``NamedTuple``) in ONE
place per stream: the declaration in ``jobprof.plugin`` (``from_raw``, :func:`records_of`) or
the plugin's own ``records.py``.  Every other reader uses attribute names.

The rule, read from the source (``ast``) of every ``plugins/**/*.py``, function by function:

* a **record collection** is what a stream read gives: ``ctx.records(...)``,
  ``profile.records(...)``, ``profile.typed(...)``, ``records_of(...)``, ``streams[...]`` /
  ``streams.get(...)`` (also ``ctx.streams``), ``view.records``; a parameter or variable
  annotated as a container of heterogeneous rows or of records (``list[list[Any]]``,
  ``Sequence[tuple[Any, ...]]``, ``list[OpRecord]``: not ``list[dict[...]]``, a plugin's own
  facts, nor ``list[list[int]]``, a list of lists); ``sorted`` / ``list`` / a slice / a
  filtering comprehension of one;
* a **record** is an item of one: a ``for`` / comprehension target over it (also through
  ``enumerate``, ``zip``, ``pairwise``), ``coll[i]``, ``max`` / ``min`` / ``next`` of it, the
  parameter of a ``key=`` lambda ordering it;
* a plugin's **facts** read back (``profile.facts(...)``, the digests of
  ``profile.iteration_facts(...)``, what their string keys hold) are JSON the plugin wrote,
  read by their descriptive keys; an item of one (iterated, ``[i]``, ordered by a ``key=``
  lambda) is a **facts row**: read by name too (decoded, or unpacked), never by position;
* across functions (to a fixpoint over every plugin module): a call of a plugin function that
  returns a collection or a record gives one, and a function given one (at any call site)
  holds one in that parameter.  A call resolves by name to the module's own function, else to
  the plugin module it is imported from, else (a method call) to every plugin function of
  that name;
* counted: (a) **positional reads**: a record or facts row subscripted by an integer constant,
  an ALL_CAPS index constant (``r[R_START]``, ``r[R_VALUES + 1]``) or a slice of those;
  (b) **raw-key reads**: a record subscripted by a string constant, its ``.get("k")``,
  ``"k" in record``.

Exempt: the decoders, i.e. every ``plugins/*/records.py`` and every ``from_raw``.  What a
plugin builds and reads back itself (accumulators, the rows it writes, its facts' descriptive
keys, regex matches, ``/proc`` fields, the hot path's own pending records) is not a record
collection by this rule, so the allow-list is empty; a finding is almost always a record to
decode, not an entry to add.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO

PLUGINS = REPO / "plugins"

#: (file relative to plugins/, function, source text of the read) -> why it is not a record read;
#: keep it short: a finding here is usually a record to decode
ALLOW: dict[tuple[str, str, str], str] = {}

#: a record collection; a collection of tuples whose last item is a record (``profile.typed``'s
#: ``(device, iteration, record)``); a record
COLL, TAGGED, REC = "coll", "tagged", "rec"
#: a plugin's facts read back (``profile.facts``, a digest of ``profile.iteration_facts``, and
#: what they hold: JSON the plugin wrote, keyed by descriptive names); one of their rows, which
#: is read by name too (a ``SeriesRow``), never by position
FACTS, DIGESTS, ROW = "facts", "digests", "row"
#: containers whose item annotation can make a parameter / variable a record collection
_CONTAINERS = {"list", "List", "Sequence", "Iterable", "Iterator", "Collection", "deque"}
#: a heterogeneous row (``list[Any]``, ``tuple[Any, ...]``): a record in disguise
_ROWS = {"list", "List", "Sequence", "tuple", "Tuple"}
_CAPS = re.compile(r"^[A-Z][A-Z0-9_]*$")
_CAMEL = re.compile(r"^_?[A-Z][a-z0-9]+[A-Za-z0-9]*$")
_COMPREHENSIONS = (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
#: builtins that keep a collection a collection / give one of its items
_KEEP = {"sorted", "list", "reversed", "tuple", "iter", "filter"}
_PICK = {"max", "min", "next"}


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _record_class(node: ast.AST) -> bool:
    name = _name_of(node)
    return name is not None and name != "Any" and bool(_CAMEL.match(name))


def _annotated(node: ast.AST | None) -> str | None:
    """:data:`COLL` for a container of rows or records (``list[list[Any]]``,
    ``Sequence[tuple[Any, ...]]``, ``list[OpRecord]``, ``X | None`` of one), :data:`TAGGED` for
    one of tuples ending in a record (``Iterator[tuple[int, BatchRecord]]``).  Not
    ``list[dict[...]]`` (a plugin's own facts keyed by descriptive names: a stream of dicts is
    found from the stream read), nor a homogeneous ``list[list[int]]`` (a list of lists)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _join(_annotated(node.left), _annotated(node.right))
    if not (isinstance(node, ast.Subscript) and _name_of(node.value) in _CONTAINERS):
        return None
    item = node.slice
    if isinstance(item, ast.Subscript) and _name_of(item.value) in _ROWS:
        args = item.slice.elts if isinstance(item.slice, ast.Tuple) else [item.slice]
        if _name_of(args[0]) == "Any":
            return COLL
        return TAGGED if _name_of(item.value) in ("tuple", "Tuple") and _record_class(args[-1]) else None
    return COLL if _record_class(item) else None


def _is_streams(node: ast.AST) -> bool:
    """``streams`` or ``<x>.streams``: an iteration's raw streams by name."""
    return _name_of(node) == "streams"


def _index_like(node: ast.AST) -> bool:
    """An integer constant, an ALL_CAPS constant, or arithmetic / a slice of those."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return bool(_CAPS.match(node.id))
    if isinstance(node, ast.UnaryOp):
        return _index_like(node.operand)
    if isinstance(node, ast.BinOp):
        return _index_like(node.left) and _index_like(node.right)
    if isinstance(node, ast.Slice):
        bounds = [b for b in (node.lower, node.upper) if b is not None]
        return bool(bounds) and all(_index_like(b) for b in bounds)
    return False


def _str_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _join(*kinds: str | None) -> str | None:
    return next((k for k in (COLL, TAGGED, REC, DIGESTS, FACTS, ROW) if k in kinds), None)


def _own_nodes(root: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``root``'s body, not those of nested functions and classes."""
    stack = list(ast.iter_child_nodes(root))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (*_DEFS, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


class _Program:
    """What the plugin functions return, and what their callers pass them.  A call resolves by
    name: to the module's own function, else to the one it imports from a plugin module, else
    (a method) to every plugin function of that name."""

    def __init__(self, trees: dict[Path, ast.Module]) -> None:
        self.returns: dict[int, str] = {}  # id(def) -> kind
        self.params: dict[int, dict[str, str]] = {}  # id(def) -> parameter -> kind
        self.defs: dict[str, list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]] = {}
        self.imports: dict[Path, dict[str, Path]] = {}
        for path, tree in trees.items():
            for node in ast.walk(tree):
                if isinstance(node, _DEFS):
                    self.defs.setdefault(node.name, []).append((path, node))
                elif isinstance(node, ast.ClassDef):  # Cls(...) calls its __init__
                    for item in node.body:
                        if isinstance(item, _DEFS) and item.name == "__init__":
                            self.defs.setdefault(node.name, []).append((path, item))
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jobprof.plugins."):
                    source = Path(*node.module.split(".")[2:]).with_suffix(".py")  # type: ignore[union-attr]
                    for alias in node.names:
                        self.imports.setdefault(path, {})[alias.asname or alias.name] = source

    def resolve(self, path: Path, func: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        name = _name_of(func) or ""
        found = self.defs.get(name, [])
        own = [d for p, d in found if p == path]
        if own:
            return own
        source = self.imports.get(path, {}).get(name)
        if source is not None:
            return [d for p, d in found if p == source]
        return [d for _, d in found] if isinstance(func, ast.Attribute) else []

    def returned(self, path: Path, func: ast.AST) -> str | None:
        return _join(*(self.returns.get(id(d)) for d in self.resolve(path, func)))

    def note_return(self, node: ast.AST, kind: str | None) -> bool:
        new = _join(self.returns.get(id(node)), kind)
        changed = new != self.returns.get(id(node))
        if new is not None:
            self.returns[id(node)] = new
        return changed

    def note_call(self, path: Path, call: ast.Call, kinds: list[str | None],
                  keywords: dict[str, str | None]) -> bool:
        changed = False
        for d in self.resolve(path, call.func):
            params = [*d.args.posonlyargs, *d.args.args]
            offset = 1 if params and params[0].arg in ("self", "cls") else 0
            named = [(params[offset + i].arg, k) for i, k in enumerate(kinds) if offset + i < len(params)]
            for param, kind in [*named, *keywords.items()]:
                if kind is None:
                    continue
                known = self.params.setdefault(id(d), {})
                new = _join(known.get(param), kind)
                if new != known.get(param):
                    known[param] = new  # type: ignore[assignment]
                    changed = True
        return changed


class _Function:
    """The record kinds of one function's names (flow-insensitive: a name is a record
    collection or a record when any binding makes it one; comprehensions and lambdas scope
    their own targets; a nested function sees its parent's names)."""

    def __init__(self, path: Path, node: ast.AST, program: _Program,
                 outer: dict[str, str] | None = None) -> None:
        self.path = path
        self.node = node
        self.program = program
        self.env: dict[str, str] = dict(outer or {})
        if isinstance(node, _DEFS):
            given = program.params.get(id(node), {})
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                self.env.pop(arg.arg, None)
                kind = _annotated(arg.annotation) or given.get(arg.arg)
                if kind is not None:
                    self.env[arg.arg] = kind
        self.key_owner: dict[int, ast.AST] = {}  # id(key= lambda) -> the collection it orders
        for n in _own_nodes(node):
            if isinstance(n, ast.Call):
                for kw in n.keywords:
                    if kw.arg == "key" and isinstance(kw.value, ast.Lambda):
                        if isinstance(n.func, ast.Attribute) and n.func.attr == "sort":
                            self.key_owner[id(kw.value)] = n.func.value
                        elif n.args:
                            self.key_owner[id(kw.value)] = n.args[0]
        for _ in range(3):  # bindings that depend on later ones
            self._bind()

    # -- kinds of expressions --------------------------------------------------------------------
    def kind(self, node: ast.AST | None, env: dict[str, str]) -> str | None:
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute):
            return COLL if node.attr == "records" else None  # an OpView's records
        if isinstance(node, ast.Subscript):
            if _is_streams(node.value):
                return COLL
            outer = self.kind(node.value, env)
            if outer in (COLL, FACTS):
                if isinstance(node.slice, ast.Slice):
                    return outer
                return FACTS if outer == FACTS and _str_key(node.slice) else REC if outer == COLL else ROW
            return None
        if isinstance(node, ast.Call):
            return self._call_kind(node, env)
        if isinstance(node, ast.IfExp):
            return _join(self.kind(node.body, env), self.kind(node.orelse, env))
        if isinstance(node, ast.BoolOp):
            return _join(*(self.kind(v, env) for v in node.values))
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            inner = self._comprehension_env(node.generators, env)
            if isinstance(node.elt, ast.Name) and inner.get(node.elt.id) in (REC, ROW):
                return COLL if inner.get(node.elt.id) == REC else FACTS  # a filter of a collection is one
        return None

    def _call_kind(self, node: ast.Call, env: dict[str, str]) -> str | None:
        func, name = node.func, _name_of(node.func)
        if isinstance(func, ast.Attribute) and func.attr == "typed":
            return TAGGED
        if isinstance(func, ast.Attribute) and func.attr == "facts":
            return FACTS
        if isinstance(func, ast.Attribute) and func.attr == "iteration_facts":
            return DIGESTS
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args and _str_key(node.args[0]) \
                and self.kind(func.value, env) == FACTS:
            return FACTS
        if isinstance(func, ast.Attribute) and (func.attr == "records"
                                                or (func.attr == "get" and _is_streams(func.value))):
            return COLL
        if name == "records_of":
            return COLL
        if isinstance(func, ast.Name) and name in _KEEP | _PICK:
            first = self.kind(node.args[0], env) if node.args else None
            if first in (COLL, FACTS):
                return first if name in _KEEP else REC if first == COLL else ROW
            return first if first == TAGGED and name in _KEEP else None
        return self.program.returned(self.path, func)

    # -- bindings --------------------------------------------------------------------------------
    def _comprehension_env(self, generators: list[ast.comprehension], env: dict[str, str]) -> dict[str, str]:
        inner = dict(env)
        for gen in generators:
            for target in ast.walk(gen.target):
                if isinstance(target, ast.Name):
                    inner.pop(target.id, None)
            self._bind_target(gen.target, gen.iter, inner)
        return inner

    def _bind_target(self, target: ast.AST, iterable: ast.AST, env: dict[str, str]) -> None:
        """``target`` iterates ``iterable``: an item of a collection is a record, also through
        ``enumerate``, ``zip`` and ``pairwise``; the last name of a tagged one's tuple is."""
        if isinstance(target, ast.Name):
            kind = self.kind(iterable, env)
            if kind in (COLL, FACTS):
                env[target.id] = REC if kind == COLL else ROW
            return
        if isinstance(target, ast.Tuple) and isinstance(target.elts[-1], ast.Name) \
                and self.kind(iterable, env) in (TAGGED, DIGESTS):
            env[target.elts[-1].id] = REC if self.kind(iterable, env) == TAGGED else FACTS
            return
        if not isinstance(target, ast.Tuple) or not isinstance(iterable, ast.Call):
            return
        name, args = _name_of(iterable.func), iterable.args
        items: list[ast.AST | None] = []
        if name == "enumerate" and args:
            items = [None, args[0]]
        elif name == "zip":
            items = list(args)
        elif name == "pairwise" and args:
            items = [args[0], args[0]]
        for elt, source in zip(target.elts, items, strict=False):
            if isinstance(elt, ast.Name) and source is not None and self.kind(source, env) == COLL:
                env[elt.id] = REC

    def _bind(self) -> None:
        env = self.env
        for node in _own_nodes(self.node):
            if isinstance(node, ast.Assign):
                kind = self.kind(node.value, env)
                for target in node.targets:
                    if isinstance(target, ast.Name) and kind is not None:
                        env[target.id] = kind
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                kind = _annotated(node.annotation) or self.kind(node.value, env)
                if kind is not None:
                    env[node.target.id] = kind
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                self._bind_target(node.target, node.iter, env)

    # -- the function's nodes, each with the names it sees --------------------------------------
    def visit(self) -> Iterator[tuple[ast.AST, dict[str, str]]]:
        """(node, names) of the function's own body, its comprehensions and lambdas included
        (nested functions are functions of their own)."""
        yield from self._visit(self.node, self.env)

    def _visit(self, root: ast.AST, env: dict[str, str]) -> Iterator[tuple[ast.AST, dict[str, str]]]:
        for child in ast.iter_child_nodes(root):
            if isinstance(child, (*_DEFS, ast.ClassDef)):
                continue
            yield child, env
            if isinstance(child, _COMPREHENSIONS):
                yield from self._visit(child, self._comprehension_env(child.generators, env))
            elif isinstance(child, ast.Lambda):
                inner = dict(env)
                for arg in child.args.args:
                    inner.pop(arg.arg, None)
                owner = self.key_owner.get(id(child))
                ordered = self.kind(owner, env) if owner is not None and child.args.args else None
                if ordered in (COLL, FACTS):
                    inner[child.args.args[0].arg] = REC if ordered == COLL else ROW
                yield from self._visit(child, inner)
            else:
                yield from self._visit(child, env)

    def return_kind(self) -> str | None:
        if not isinstance(self.node, _DEFS):
            return None
        if _annotated(self.node.returns):
            return _annotated(self.node.returns)
        returned = [n.value for n in _own_nodes(self.node) if isinstance(n, ast.Return)]
        return _join(*(self.kind(value, self.env) for value in returned))

    def note_calls(self) -> bool:
        changed = False
        for node, env in self.visit():
            if isinstance(node, ast.Call):
                kinds = [None if isinstance(a, ast.Starred) else self.kind(a, env) for a in node.args]
                keywords = {kw.arg: self.kind(kw.value, env) for kw in node.keywords if kw.arg}
                changed |= self.program.note_call(self.path, node, kinds, keywords)
        return changed

    def reads(self) -> Iterator[tuple[ast.AST, str]]:
        """(node, what) of each positional or raw-key read of a record."""
        for node, env in self.visit():
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and self.kind(node.value, env) in (REC, ROW):
                if _index_like(node.slice):
                    yield node, "positional"
                elif _str_key(node.slice) and self.kind(node.value, env) == REC:
                    yield node, "raw key"
            elif self._raw_get(node, env) or self._raw_in(node, env):
                yield node, "raw key"

    def _raw_get(self, node: ast.AST, env: dict[str, str]) -> bool:
        """``record.get("k", ...)``"""
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "get" and bool(node.args) and _str_key(node.args[0]) \
            and self.kind(node.func.value, env) == REC

    def _raw_in(self, node: ast.AST, env: dict[str, str]) -> bool:
        """``"k" in record``"""
        return isinstance(node, ast.Compare) and _str_key(node.left) \
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
            and any(self.kind(c, env) == REC for c in node.comparators)


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST, ast.AST]]:
    """(qualified name, node, enclosing function or module) of the module and every function,
    parents first."""
    yield "<module>", tree, tree

    def walk(node: ast.AST, prefix: str, parent: ast.AST) -> Iterator[tuple[str, ast.AST, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _DEFS):
                yield f"{prefix}{child.name}", child, parent
                yield from walk(child, f"{prefix}{child.name}.", child)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.", parent)
            else:
                yield from walk(child, prefix, parent)

    yield from walk(tree, "", tree)


def _exempt(path: Path, qualname: str) -> bool:
    """The decoders: a plugin's records module, and any ``from_raw``."""
    return path.name == "records.py" or qualname.split(".")[-1] == "from_raw"


def _analyse(sources: dict[Path, str]) -> list[tuple[str, int, str, str, str]]:
    """(file, line, function, what, source text) of every record read the rule counts."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    program = _Program(trees)

    def functions() -> Iterator[tuple[Path, str, _Function]]:
        envs: dict[int, dict[str, str]] = {}
        for path, tree in trees.items():
            for qualname, node, parent in _functions(tree):
                fn = _Function(path, node, program, envs.get(id(parent)))
                envs[id(node)] = fn.env
                yield path, qualname, fn

    for _ in range(8):  # to a fixpoint: what a function returns and is given depends on others
        changed = False
        for _path, _qualname, fn in functions():
            if isinstance(fn.node, _DEFS):
                changed |= program.note_return(fn.node, fn.return_kind())
            changed |= fn.note_calls()
        if not changed:
            break
    found = []
    for path, qualname, fn in functions():
        if not _exempt(path, qualname):
            found += [(str(path), n.lineno, qualname, what, ast.unparse(n)) for n, what in fn.reads()]
    return found


def _plugin_sources() -> dict[Path, str]:
    return {p.relative_to(PLUGINS): p.read_text(encoding="utf-8") for p in sorted(PLUGINS.rglob("*.py"))}


def _violations(sources: dict[Path, str]) -> list[str]:
    out = []
    for file, line, function, what, text in _analyse(sources):
        if (file, function, text) not in ALLOW:
            out.append(f"plugins/{file}:{line} {function}: {what} read {text}")
    return out


def test_plugins_read_records_by_name() -> None:
    found = _violations(_plugin_sources())
    assert not found, "records read by position or raw key (decode them once, in the stream's " \
                      "records module, and read attributes):\n" + "\n".join(found)


def test_allow_list_is_used() -> None:
    """Every allow-list entry still matches a read (a stale one would hide the next)."""
    seen = {(file, function, text) for file, _, function, _, text in _analyse(_plugin_sources())}
    assert not set(ALLOW) - seen


@pytest.mark.parametrize("snippet, count", [
    # the patterns the issue names, and their named counterparts
    ("def f(ctx):\n    return [r[0] for r in ctx.records('x')]", 1),
    ("R_START = 0\ndef f(records: list[list[Any]]):\n    return [r[R_START] for r in records]", 1),
    ("def f(streams):\n    return [r[R_VALUES + 1] for r in streams.get('l2', ())]", 1),
    ("def f(profile):\n    for rec in profile.records('dp', 0):\n        x = rec['t1'] - rec.get('t0')", 2),
    ("def f(ctx):\n    meta = ctx.records('m')\n    return meta[0].get('source')", 1),
    ("def f(series: list[list[Any]]):\n    return max(series, key=lambda r: r[1])", 1),
    ("def f(streams):\n    return ['k' in r for r in streams['dp']]", 1),
    ("def f(streams):\n    s = streams['s']\n    for a, b in pairwise(s):\n        x = b['ns'] - a['ns']", 2),
    ("def f(ctx):\n    return [r.start for r in ctx.records('x')]", 0),
    ("def f(ctx):\n    agg = [0, 0]\n    agg[0] += 1\n    return agg[1]", 0),
    ("def f(facts):\n    return facts['top'][0]", 0),
    ("def f(rows: list[dict[str, Any]], stack: list[list[int]]):\n    return rows[0]['a'], stack[0][-1]", 0),
    ("def f(ctx):\n    return g(ctx.records('x')[0])\ndef g(raw):\n    return raw['k']", 1),
    ("def f(profile):\n    return [r[0] for _, _, r in profile.typed(TxRecord)]", 1),
    ("def f(p) -> Iterator[tuple[int, BatchRecord]]:\n    yield from p\ndef g(p):\n"
     "    return [r['t1'] for i, r in f(p)]", 1),
    # facts: descriptive keys are fine, positions in their rows are not
    ("def f(profile):\n    facts = profile.facts('m', 0, g)\n    return [r[0] for r in facts['series']]", 1),
    ("def f(profile):\n    peak = profile.facts('m', 0, g).get('peak') or {}\n"
     "    return (peak.get('holders') or [])[0][1]", 1),
    ("def f(profile):\n    return sorted(profile.facts('h', 0, g)['ops'], key=lambda e: -e[3])", 1),
    ("def f(profile):\n    for i, d in profile.iteration_facts('m', 0, g):\n        x = d.get('rss')\n"
     "    return [f['loader'] for f in profile.facts('dp', 0, g)]", 0),
])
def test_rule(snippet: str, count: int) -> None:
    assert len(_analyse({Path("x.py"): snippet})) == count


def test_rule_across_functions() -> None:
    """A helper that returns a stream's records makes its callers' items records."""
    sources = {
        Path("a/writer.py"): "def samples(streams):\n    return [s for s in streams.get('m', ()) if s]\n",
        Path("a/report.py"): "from jobprof.plugins.a.writer import samples\n\n"
                             "def f(streams):\n    return max(s['rss'] for s in samples(streams))\n",
        Path("a/records.py"): "def decode(raw):\n    return raw['rss']\n",
    }
    assert [(f, w) for f, _, _, w, _ in _analyse(sources)] == [("a/report.py", "raw key")]


# -- each converted stream: a raw row as the job writes it decodes to the named record ------------
# (rows taken from a real profiled run of examples/train_mlp.py with task_memory, task_trace, l2
# (software events), dp (2 workers), host_sys and host_sys_usage on)


def test_task_memory_records() -> None:
    from jobprof.plugins.task_memory.records import (
        Holder,
        MemorySample,
        ModuleCall,
        SeriesRow,
        memory_samples,
        module_calls,
    )

    raw = [{"ns": 32011320662113, "rss": 355483648, "hwm": 355196928, "before": True},
           {"ns": 32011329938599, "rss": 355749888, "hwm": 355459072},
           {"ns": 5, "rss": 1, "hwm": 1, "allocated": 20, "reserved": 40, "max_allocated": 90, "device": 0},
           {"rss": 1}, "foreign"]
    first, second, cuda = memory_samples(raw)
    assert first == MemorySample(32011320662113, 355483648, 355196928, before=True)
    assert (second.ns, second.rss, second.hwm, second.allocated, second.before) == \
        (32011329938599, 355749888, 355459072, None, False)
    assert (cuda.allocated, cuda.reserved, cuda.max_allocated, cuda.device) == (20, 40, 90, 0)
    assert [s.to_raw() for s in (first, second, cuda)] == raw[:3]  # the sampler's dicts, key for key
    assert memory_samples([first]) == [first]  # decoded ones pass
    [call] = module_calls([[32011326350288, 32011327058604, 32217, "Sequential"], [1, 2, 3], None])
    assert call == ModuleCall(32011326350288, 32011327058604, 32217, "Sequential")
    assert (call.start_ns, call.end_ns, call.tid, call.path) == tuple(call)
    row = SeriesRow.of([[7, 100, 200, 300, 90, 280, "aten::mm (Net.0)", 64, True]])[0]
    assert (row.iteration, row.allocated, row.reserved, row.rss_peak, row.end, row.rss_end, row.holder,
            row.holder_bytes, row.rss_exact) == (7, 100, 200, 300, 90, 280, "aten::mm (Net.0)", 64, True)
    assert list(row) == [7, 100, 200, 300, 90, 280, "aten::mm (Net.0)", 64, True]  # the facts' JSON
    assert Holder.of([["aten::empty", 1 << 30]]) == [Holder("aten::empty", 1 << 30)]


def test_l2_records() -> None:
    from jobprof.plugins.l2.records import CounterRecord, CounterSetRecord, counter_records

    raw = [32011320741162, 32011320755223, 32217, "profiler::_record_function_exit", 12309, 0]
    [r] = counter_records([raw, [1, 2], {"a": 1}])
    assert (r.start_ns, r.end_ns, r.tid, r.name, r.values) == (32011320741162, 32011320755223, 32217,
                                                               "profiler::_record_function_exit", [12309, 0])
    assert (r.accesses, r.misses) == (12309, 0) and r.to_raw() == raw
    assert counter_records([r]) == [r]
    counted = CounterSetRecord.of([{"events": ["task-clock", "page-faults"], "source": "software"}])
    assert counted == CounterSetRecord(("task-clock", "page-faults"), "software")
    assert counted.to_raw() == {"events": ["task-clock", "page-faults"], "source": "software"}
    assert CounterSetRecord.of([]) is None and CounterRecord.from_raw("x") is None


def test_dp_records() -> None:
    from jobprof.plugin import BatchRecord, WorkerFetchRecord
    from jobprof.plugins.dp.records import LoaderRecord, dp_record

    batch = dp_record({"k": "next", "l": 0, "b": 6, "t0": 32011325111039, "t1": 32011326206423, "q0": 4,
                       "q1": 3, "w": 1, "tid": 32217})
    assert batch == BatchRecord(32011325111039, 32011326206423, 0, 6, 4, 3, 1, 32217)
    fetch = dp_record({"k": "fetch", "l": 0, "w": 1, "pid": 32225, "n": 64, "t0": 32011326222772,
                       "t1": 32011326344264, "t2": 32011326678062})
    assert fetch == WorkerFetchRecord(32011326222772, 32011326344264, 32011326678062, 0, 1, 32225, 64)
    assert dp_record({"k": "loader", "l": 0, "dataset": "Synthetic", "workers": 2}) == \
        LoaderRecord(0, "Synthetic", 2)
    assert dp_record({"k": "next", "t0": 2, "t1": 1}) is None and dp_record([1]) is None


def test_host_sys_records() -> None:
    from jobprof.plugins.host_sys.records import (
        CoreLoad,
        CoreTicks,
        HostFacts,
        NetCount,
        ProcSample,
        host_facts,
        host_samples,
    )

    raw = {"ns": 32011320662113, "own_ns": 9903436,
           "procs": [{"pid": 32217, "name": "python", "label": "", "cpu_ns": 1909642258, "vms": 315391,
                      "rss": 86788, "shared": 26165, "rchar": 55326654, "wchar": 1597487,
                      "read_bytes": 7176192, "write_bytes": 1753088}],
           "before": True, "cores": {"Avg": {"busy": 3179616, "total": 6388305}},
           "cpu_detail": {"0": {"user": 1215160, "nice": 22826, "system": 198193, "idle": 1754246,
                                "iowait": 830, "irq": 0, "softirq": 1349, "steal": 719}},
           "mem": {"MemTotal": 24683772, "MemAvailable": 23770520},
           "net": {"eth0": {"recv": 11089447170, "sent": 16986107}}}
    later = {"ns": 32011330000000, "own_ns": 9903500, "procs": [{"pid": 7, "name": "w"}]}  # fields not read
    first, second = host_samples([later, raw, {"ns": 1}, None])  # oldest first; no process list: left out
    assert (first.ns, first.own_ns, first.before) == (32011320662113, 9903436, True)
    [p] = first.procs
    assert (p.pid, p.name, p.cpu_ns, p.rss, p.read_bytes, p.write_bytes) == \
        (32217, "python", 1909642258, 86788, 7176192, 1753088)
    assert first.cores == {"Avg": CoreLoad(3179616, 6388305)}
    assert first.cpu_detail == {"0": CoreTicks(1215160, 22826, 198193, 1754246, 830, 0, 1349, 719)}
    assert first.mem == {"MemTotal": 24683772, "MemAvailable": 23770520}
    assert first.net == {"eth0": NetCount(11089447170, 16986107)}
    assert second.procs == (ProcSample(7, "w", "", -1, -1, -1, -1, -1, -1, -1, -1),)
    assert second.cores is second.cpu_detail is second.mem is second.net is None
    facts = host_facts([{"host_sys": ["cpu", "disk"], "host_sys_usage": ["cpu"], "freq": 50, "cpus": 2,
                         "mem_total_kb": 24683772, "page": 4096, "tick_ns": 10000000,
                         "speed_mbps": {"eth0": 0}}])
    assert facts == HostFacts(("cpu", "disk"), ("cpu",), 50, 2, 24683772, 4096, 10000000, {"eth0": 0})
    assert host_facts([]) == HostFacts()
