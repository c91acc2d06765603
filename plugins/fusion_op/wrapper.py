"""Read one Inductor output module (the Python wrapper torch.compile generates for a graph)
into its kernels: name, kind, the ATen operators each replaced, and the bytes it reads and
writes.  Pure text work (no torch): runs on the sink thread and in tests on saved sources.

What the wrapper holds (torch 2.13, the default ``cpp_wrapper=False``):

* kernel definitions, one per generated kernel: ``cpp_fused_add_relu_0 =
  async_compile.cpp_pybinding([...], r'''...extern "C" void kernel(const float* in_ptr0, ...)''')``
  on CPU, ``triton_poi_fused_add_relu_0 = async_compile.triton('...', '''...def
  triton_poi_fused_add_relu_0(in_ptr0, out_ptr0, xnumel, ...)''')`` on CUDA;
* ``call(args)``: the graph's inputs (``primals_1, ... = args``) with their shapes
  (``assert_size_stride``), every buffer it allocates (``buf0 = empty_strided_cpu((16, 64),
  (64, 1), torch.float32)``), buffer reuse (``buf3 = buf1; del buf1  # reuse``) and each
  kernel call in execution order;
* ``get_args()``: every input's shape, stride and dtype (Inductor's benchmark harness);
* Inductor's own provenance comment, ``# Topologically Sorted Source Nodes: [...], Original
  ATen: [aten.t, aten.addmm]`` (``torch._inductor.utils.get_kernel_metadata``), written before
  every extern kernel call and every Triton kernel definition, in graph order.  CPU (C++)
  kernels get no such comment; their name is built from the same ``original_aten`` metadata
  (``get_fused_kernel_name`` with ``config.cpp.descriptive_names = "original_aten"``, the
  default): the distinct operators, sorted.  For those the order is the name's (``ORDER_NAME``).

Argument roles come from the kernel's parameter names (``in_ptr`` read, ``out_ptr`` written,
``in_out_ptr`` both, ``ws_ptr`` workspace), for extern kernels from ``out=``.  A buffer whose
shape holds a symbol (dynamic shapes) has no byte count: None, shown as N/A.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterable
from typing import Any

#: original operators in graph order (Inductor's topologically sorted comment) or in the
#: kernel name's order (alphabetical: Inductor sorts them when naming a C++ kernel)
ORDER_GRAPH, ORDER_NAME = "graph", "name"
CPP, TRITON, EXTERN = "cpp", "triton", "extern"

_DEFINE = re.compile(r"^(\w+) = async_compile\.(cpp_pybinding|cpp|triton)\(", re.M)
_ORIGIN = re.compile(r"#\s*(?:Topologically Sorted|Unsorted) Source Nodes: \[.*?\], Original ATen: \[(.*?)\]")
_CPP_PARAMS = re.compile(r'extern "C"[^(]*\bkernel\s*\(([^)]*)\)')
_ALLOC = re.compile(r"^(\w+) = empty_strided(?:_\w+)?\((\(.*?\)), (\(.*?\)), torch\.(\w+)")
_ASSERT = re.compile(r"^assert_size_stride\((\w+), (\(.*?\)), (\(.*?\))")
_RAND = re.compile(r"^(\w+) = rand_strided\((\(.*?\)), (\(.*?\)), device='[^']*', dtype=torch\.(\w+)\)")
_REUSE = re.compile(r"^(\w+) = (\w+); del \2\s*# reuse")
_CALL = re.compile(r"^(?:(\w+) = )?([\w.]+)\((.*)\)\s*$")
_ARGS_LINE = re.compile(r"^([\w, ]+) = args$")
_FUSED_PREFIX = re.compile(r"^(?:cpp|triton)_(?:[a-z]+_)?fused_(.*)_\d+$")

ITEMSIZE = {"float32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "half": 2, "bfloat16": 2,
            "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
            "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1, "uint16": 2,
            "uint32": 4, "uint64": 8}


class Kernel:
    """One generated kernel of a graph, as the wrapper calls it."""

    __slots__ = ("calls", "input_bytes", "kind", "name", "order", "original_ops", "output_bytes",
                 "weight_bytes", "workspace_bytes")

    def __init__(self, name: str, kind: str, original_ops: list[str], order: str) -> None:
        self.name, self.kind, self.original_ops, self.order = name, kind, original_ops, order
        self.calls = 0
        self.input_bytes: int | None = 0
        self.output_bytes: int | None = 0
        self.weight_bytes: int | None = 0
        self.workspace_bytes: int | None = 0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def _ints(text: str) -> tuple[int, ...] | None:
    """``(16, 64)`` -> (16, 64); None when an entry is symbolic (``s0``, ``2*s1``)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, int):
        value = (value,)
    if not isinstance(value, tuple) or not all(isinstance(v, int) for v in value):
        return None
    return value


def storage_bytes(shape: tuple[int, ...] | None, stride: tuple[int, ...] | None,
                  dtype: str | None) -> int | None:
    """Bytes a strided tensor spans (its storage extent), or None when unknown."""
    if shape is None or dtype not in ITEMSIZE:
        return None
    if any(s == 0 for s in shape):
        return 0
    if stride is None or len(stride) != len(shape):
        extent = 1
        for s in shape:
            extent *= s
    else:
        extent = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride, strict=True))
    return extent * ITEMSIZE[dtype]


def split_args(text: str) -> list[str]:
    """Top-level comma split of a call's argument text (brackets and quotes respected)."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def _base(arg: str) -> str:
    """The buffer an argument names: ``reinterpret_tensor(buf3, ...)`` -> ``buf3``."""
    while arg.startswith(("reinterpret_tensor(", "as_strided(")):
        arg = arg[arg.index("(") + 1:].split(",", 1)[0].strip()
    return arg


def ops_from_name(name: str, known: Collection[str]) -> list[str] | None:
    """The operators a descriptive kernel name lists (``cpp_fused_add_relu_threshold_backward_0``
    -> ``[add, relu, threshold_backward]``), split on ``_`` into names of ``known`` ATen
    operators; the fewest pieces win (``threshold_backward``, not ``threshold`` + ``backward``,
    which is no operator).  None when the name lists no operators or does not split."""
    found = _FUSED_PREFIX.match(name)
    if found is None:
        return None
    text = found.group(1)
    n = len(text)
    best: list[list[str] | None] = [None] * (n + 1)
    best[n] = []
    for i in range(n - 1, -1, -1):
        for j in range(n, i, -1):
            piece = text[i:j]
            if (j == n or text[j] == "_") and piece in known:
                rest = best[j + 1] if j < n else best[n]
                if rest is not None and (best[i] is None or 1 + len(rest) < len(best[i] or ())):
                    best[i] = [piece, *rest]
    return best[0]


def _origin_ops(comment: str) -> list[str]:
    """``aten.t, aten.addmm`` -> ``[aten::t, aten::addmm]``."""
    return [op.strip().replace(".", "::", 1) for op in comment.split(",") if op.strip()]


def _param_roles(names: Iterable[str]) -> list[str | None]:
    """Per parameter: ``in``, ``out``, ``inout``, ``ws`` or None (a size, a constexpr)."""
    roles: list[str | None] = []
    for raw in names:
        name = raw.strip().split(":")[0].strip().split()[-1].lstrip("*") if raw.strip() else ""
        if name.startswith("in_out_ptr"):
            roles.append("inout")
        elif name.startswith("in_ptr"):
            roles.append("in")
        elif name.startswith("out_ptr"):
            roles.append("out")
        elif name.startswith("ws_ptr"):
            roles.append("ws")
        else:
            roles.append(None)
    return roles


def _definitions(source: str) -> dict[str, tuple[str, list[str | None], list[str] | None]]:
    """{kernel name: (kind, parameter roles, ops from a provenance comment above it)}."""
    out = {}
    matches = list(_DEFINE.finditer(source))
    for k, m in enumerate(matches):
        name, how = m.group(1), m.group(2)
        kind = TRITON if how == "triton" else CPP
        end = matches[k + 1].start() if k + 1 < len(matches) else len(source)
        body = source[m.end():end]
        if kind == CPP:
            params = _CPP_PARAMS.search(body)
            roles = _param_roles(params.group(1).split(",")) if params else []
        else:
            sig = re.search(r"def " + re.escape(name) + r"\(([^)]*)\)", body)
            roles = _param_roles(sig.group(1).split(",")) if sig else []
        # the comment block right above the definition (Triton kernels carry their origins there)
        above = source[max(0, m.start() - 4000):m.start()].splitlines()
        ops = None
        for line in reversed(above):
            line = line.strip()
            if not line:
                continue
            if not line.startswith("#"):
                break
            found = _ORIGIN.search(line)
            if found:
                ops = _origin_ops(found.group(1))
                break
        out[name] = (kind, roles, ops)
    return out


def _call_body(source: str) -> list[str]:
    """The stripped lines of the wrapper's ``call`` function."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith(("def call(self, args)", "def call(args)")):
            indent = len(line) - len(stripped)
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt.strip())
            return body
    return []


def parse(source: str, static_inputs: Collection[int] = (), known_ops: Collection[str] = ()) -> list[Kernel]:
    """The kernels of one wrapper module in first-call order.

    ``static_inputs``: indices of the graph inputs that are parameters or buffers (Inductor's
    ``static_input_idxs``), counted as Memory Weight.  ``known_ops``: ATen operator names
    (``add``, ``threshold_backward``) to split C++ kernel names with.
    """
    defs = _definitions(source)
    sizes: dict[str, int | None] = {}
    shapes: dict[str, tuple[Any, Any]] = {}
    for line in source.splitlines():  # get_args(): every input's dtype
        found = _RAND.match(line.strip())
        if found:
            name, shape, stride, dtype = found.groups()
            sizes[name] = storage_bytes(_ints(shape), _ints(stride), dtype)
    weights: set[str] = set()
    aliases: dict[str, str] = {}
    kernels: dict[str, Kernel] = {}
    pending: list[str] | None = None
    for line in _call_body(source):
        if line.startswith("#"):
            found = _ORIGIN.search(line)
            if found:
                pending = _origin_ops(found.group(1))
            continue
        m = _ARGS_LINE.match(line)
        if m:
            names = [n.strip() for n in m.group(1).split(",") if n.strip()]
            weights = {n for i, n in enumerate(names) if i in static_inputs}
            continue
        m = _ASSERT.match(line)
        if m:
            shapes[m.group(1)] = (m.group(2), m.group(3))
            continue
        m = _ALLOC.match(line)
        if m:
            name, shape, stride, dtype = m.groups()
            sizes[name] = storage_bytes(_ints(shape), _ints(stride), dtype)
            continue
        m = _REUSE.match(line)
        if m:
            aliases[m.group(1)] = aliases.get(m.group(2), m.group(2))
            continue
        m = _CALL.match(line)
        if m is None:
            pending = None
            continue
        result, callee, argtext = m.groups()
        if callee.endswith(".run") and callee[:-4] in defs:
            callee = callee[:-4]
        if callee in defs:
            kind, roles, comment_ops = defs[callee]
            args = split_args(argtext)
            named = [a for a in args if "=" not in a.split("(")[0]]
            io = [(roles[i] if i < len(roles) else None, _base(a)) for i, a in enumerate(named)]
            if comment_ops is not None:
                ops, order = comment_ops, ORDER_GRAPH
            else:
                split = ops_from_name(callee, known_ops)
                ops, order = ([f"aten::{op}" for op in split] if split else []), ORDER_NAME
        elif callee.startswith(("extern_kernels.", "torch.ops.")):
            kind = EXTERN
            args = split_args(argtext)
            io = []
            for a in args:
                key, eq, value = a.partition("=")
                if eq and key.strip().isidentifier():
                    if key.strip() == "out":
                        io.append(("out", _base(value.strip())))
                    continue
                io.append(("in", _base(a)))
            if result:
                io.append(("out", result))
            ops, order = (pending or []), ORDER_GRAPH
        else:
            pending = None
            continue
        pending = None
        # a generated kernel is one row however often it is called; every extern call is its
        # own (another call site replaced other operators, on other buffers)
        key = f"{callee}#{len(kernels)}" if kind == EXTERN else callee
        kernel = kernels.get(key)
        first = kernel is None
        if kernel is None:
            kernel = kernels[key] = Kernel(callee, kind, ops, order)
        kernel.calls += 1
        if first:
            _account(kernel, io, sizes, aliases, weights, kind)
    return list(kernels.values())


def _account(kernel: Kernel, io: list[tuple[str | None, str]], sizes: dict[str, int | None],
             aliases: dict[str, str], weights: set[str], kind: str) -> None:
    """Bytes of the distinct buffers a kernel's first call reads, writes and uses as workspace."""
    seen: dict[str, set[str]] = {"in": set(), "out": set(), "weight": set(), "ws": set()}
    for role, arg in io:
        if role is None:
            continue
        base = aliases.get(arg, arg)
        if base not in sizes:  # a scalar, a constant or a symbol passed by value
            continue
        if role in ("in", "inout"):
            seen["weight" if base in weights else "in"].add(base)
        if role in ("out", "inout"):
            seen["out"].add(base)
        if role == "ws":
            seen["ws"].add(base)

    def total(names: set[str]) -> int | None:
        values = [sizes.get(n) for n in names]
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    kernel.input_bytes = total(seen["in"])
    kernel.output_bytes = total(seen["out"])
    kernel.weight_bytes = total(seen["weight"])
    # extern kernels (BLAS, oneDNN) allocate their scratch inside the library: not visible here
    kernel.workspace_bytes = None if kind == EXTERN else total(seen["ws"])
