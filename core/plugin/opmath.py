"""FLOPs, bytes moved and output shapes of an operator, computed from its input shapes.

Input: what Kineto records per operator with ``record_shapes`` -- one entry per argument in
``shapes`` (a list of dims, ``[]`` for a non-tensor or a 0-dim tensor) and ``dtypes`` (the C++
type name: ``float``, ``c10::BFloat16``, ``long int``, ...; ``Scalar`` / ``ScalarList`` / ``''``
for non-tensors; ``TensorList`` for a list of tensors, whose shapes are not recorded).  Only
``aten::`` operators are known; everything else is None ("unknown"), never a guess.

Conventions (the numbers the aic_metrics groups show):

FLOPs
  * matmul family, EXACT: ``2*M*N*K`` per matrix product (one multiply and one add per
    multiply-accumulate).  ``mm``, ``bmm`` (``2*B*M*N*K``), ``matmul`` (batch dims broadcast, a
    1-D operand counts as a vector), ``linear`` (``2 * prod(leading dims) * in * out``),
    ``dot``/``vdot`` (``2*K``), ``mv`` (``2*M*K``).  ``addmm``/``baddbmm``/``addmv``/``linear``
    count the product only, not the bias epilogue (``M*N`` adds, under 1/K of the total) --
    Kineto's own estimate for ``addmm`` does the same, so the two agree.
  * convolutions, EXACT where the scalar arguments were recorded: ``2 * N * prod(out spatial) *
    numel(weight)`` (one multiply-accumulate per weight element per output position; bias not
    counted), the output size from stride, padding and dilation, which Kineto records as
    ``Concrete Inputs`` (``conv1d/2d/3d``, ``convolution``, ``_convolution``,
    ``cudnn_convolution``, ``mkldnn_convolution``; string padding ``same``/``valid`` too).
    Transposed convolutions, other convolution entry points, or no concrete values: None.
  * elementwise arithmetic: "1 FLOP per output element per arithmetic operation": ``add``,
    ``sub``, ``rsub``, ``mul``, ``div``, ``true_divide``, ``neg``, ``reciprocal``, ``square`` 1;
    ``addcmul``, ``addcdiv`` 2; ``lerp`` 3.  Scaling factors passed as Python numbers
    (``alpha``, ``value``) are not recorded and not counted.  Transcendentals, comparisons and
    activations (``exp``, ``relu``, ``gt``, ...) have no agreed FLOP count: None.
  * reductions over everything (``sum``/``mean`` without ``dim``): ``n-1`` adds, plus one
    division for ``mean``; with ``dim`` the output size is unknown: None.
  * data movement and views (``copy_``, ``clone``, ``fill_``, ``view``, ``empty``, ...): 0.

Bytes ``(read, written)``
  * read = the logical size (numel x element size) of every tensor operand; written = the
    output(s) from :func:`output_meta`.  Logical: a broadcast (stride-0) operand counts at its
    recorded shape, and cache hits are not subtracted -- an upper bound on memory traffic for
    the op's own algorithm (a 0-dim operand made from a Python number counts its 8 bytes).
  * ``copy_(self, src)``: read src, write self; ``fill_``/``zero_``/in-place random fills
    (``normal_``, ``uniform_``...): read only tensor arguments other than self, write self;
    other in-place ``op_``: read every operand (self included), write self.
  * ``out=`` variants of known ops: the out tensor is written, not read.
  * views and allocations (``view``, ``t``, ``expand``, ``empty``, ...): (0, 0).
  * None when the output is unknown, an argument is a ``TensorList``, a dtype is not in the
    table, or the op writes part of self only (``index_put_``, ``scatter_``, ...).

Output dtype of elementwise ops (the promotion rule applied, deliberately small): among the
tensor operands, those with dims decide; if they all share one dtype, that is the result,
provided every 0-dim operand (e.g. a wrapped Python number) is of the same or a lower category
(bool < integer < floating < complex).  Anything else (mixed dtypes, a float 0-dim with an
integer tensor, integer true division) is None.  Comparisons give ``bool``.

Speed: called for every task at export, so each call is one dict lookup of the operator name
(specs are built once, per name) and a pass over the inputs; no regex, no torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from math import prod
from typing import Any

#: bytes per element by Kineto's dtype spelling (verified by recording each dtype with torch 2.13)
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4,
    "long int": 8, "int": 4, "short int": 2, "signed char": 1,
    "unsigned char": 1, "short unsigned int": 2, "unsigned int": 4, "long unsigned int": 8,
    "bool": 1,
    "c10::qint8": 1, "c10::quint8": 1, "c10::qint32": 4, "c10::bits8": 1, "c10::bits16": 2,
}
#: torch's dtype name for a Kineto spelling (the calibration keys its peaks by these)
TORCH_DTYPE: dict[str, str] = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz", "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
    "c10::Float8_e8m0fnu": "float8_e8m0fnu",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "c10::complex<c10::Half>": "complex32",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "short unsigned int": "uint16", "unsigned int": "uint32",
    "long unsigned int": "uint64", "bool": "bool",
    "c10::qint8": "qint8", "c10::quint8": "quint8", "c10::qint32": "qint32",
}
#: promotion category: bool < integer < floating < complex
_CATEGORY: dict[str, int] = {d: 1 for d in DTYPE_BYTES}
_CATEGORY.update({"bool": 0, "float": 2, "double": 2, "c10::Half": 2, "c10::BFloat16": 2,
                  "c10::complex<float>": 3, "c10::complex<double>": 3, "c10::complex<c10::Half>": 3})
_CATEGORY.update({d: 2 for d in DTYPE_BYTES if d.startswith("c10::Float8")})
#: argument type names Kineto gives non-tensor arguments (their size is not data moved)
_NON_TENSOR = frozenset({"", "Scalar", "ScalarList", "GenericList"})

CUBE, VECTOR, COPY, OTHER = "cube", "vector", "copy", "other"

Shapes = list[Any]
Meta = tuple[list[Any], list[str]]


class _Spec:
    """What is known about one operator name (built once per name, then looked up)."""

    __slots__ = ("flops", "inplace", "kind", "operands", "out", "unit")

    def __init__(self, unit: str, kind: str, operands: int = 0,
                 flops: Callable[[Shapes, list[str], Meta | None], int | None] | None = None,
                 out: Callable[[Shapes, list[str]], Meta | None] | None = None,
                 inplace: str = "") -> None:
        self.unit, self.kind, self.operands, self.flops, self.out = unit, kind, operands, flops, out
        #: "" (not in-place), "rw" (reads and writes self), "w" (overwrites self), "partial"
        #: (writes part of self: bytes unknown), "meta" (changes metadata only)
        self.inplace = inplace


# -- shape helpers ---------------------------------------------------------------------------
def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        offset = ndim - len(s)
        for i, d in enumerate(s):
            j = offset + i
            if d != 1:
                if out[j] != 1 and out[j] != d:
                    return None
                out[j] = d
    return out


def _promote(dtypes: list[str], shapes: Shapes) -> str | None:
    """The module docstring's rule: dimensioned operands decide, 0-dim ones may not outrank them."""
    ranked = [d for s, d in zip(shapes, dtypes, strict=True) if s]
    if not ranked:
        ranked = dtypes
    first = ranked[0]
    if any(d != first for d in ranked):
        return None
    top = _CATEGORY[first]
    if any(_CATEGORY[d] > top for d in dtypes):
        return None
    return first


def _operands(shapes: Shapes, dtypes: list[str], count: int) -> tuple[Shapes, list[str]] | None:
    """Shapes and dtypes of the tensor arguments among the first ``count``; None if one is not
    a known tensor dtype and not a plain non-tensor."""
    s_out, d_out = [], []
    for s, d in zip(shapes[:count], dtypes[:count], strict=True):
        if d in DTYPE_BYTES:
            s_out.append(s)
            d_out.append(d)
        elif d not in _NON_TENSOR:
            return None
    return s_out, d_out


def _out_args(spec: _Spec, shapes: Shapes, dtypes: list[str]) -> Meta | None:
    """Tensors passed after the operands: the ``out=`` tensors of an out variant."""
    if spec.operands and len(dtypes) > spec.operands:
        tail = zip(shapes[spec.operands:], dtypes[spec.operands:], strict=True)
        outs = [(s, d) for s, d in tail if d in DTYPE_BYTES]
        if outs:
            return [s for s, _ in outs], [d for _, d in outs]
    return None


def _nbytes(shape: list[int], dtype: str) -> int:
    return prod(shape) * DTYPE_BYTES[dtype]


# -- output rules ----------------------------------------------------------------------------
def _elementwise_out(result: str | None = None, int_to_float: bool = False, skip: int = 0):
    """Broadcast of the tensor operands; dtype by the promotion rule (or fixed ``result``)."""

    def out(spec_operands: int):
        def rule(shapes: Shapes, dtypes: list[str]) -> Meta | None:
            ops = _operands(shapes, dtypes, spec_operands)
            if ops is None or not ops[0]:
                return None
            op_shapes, op_dtypes = ops
            shape = _broadcast(op_shapes)
            if shape is None:
                return None
            if result is not None:
                return [shape], [result]
            dtype = _promote(op_dtypes[skip:], op_shapes[skip:]) if len(op_dtypes) > skip else None
            if dtype is None or (int_to_float and _CATEGORY[dtype] < 2):
                return None
            return [shape], [dtype]
        return rule
    return out


def _same_as_first(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    if dtypes and dtypes[0] in DTYPE_BYTES:
        return [shapes[0]], [dtypes[0]]
    return None


def _same_dtype(dtypes: list[str], *indices: int) -> str | None:
    first = dtypes[indices[0]]
    if first not in DTYPE_BYTES or any(dtypes[i] != first for i in indices):
        return None
    return first


def _mm_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    a, b = shapes[0], shapes[1]
    dtype = _same_dtype(dtypes, 0, 1)
    if dtype is None or len(a) != 2 or len(b) != 2:
        return None
    return [[a[0], b[1]]], [dtype]


def _addmm_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    return _mm_out(shapes[1:], dtypes[1:])


def _bmm_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    a, b = shapes[0], shapes[1]
    dtype = _same_dtype(dtypes, 0, 1)
    if dtype is None or len(a) != 3 or len(b) != 3:
        return None
    return [[a[0], a[1], b[2]]], [dtype]


def _baddbmm_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    return _bmm_out(shapes[1:], dtypes[1:])


def _matmul_dims(a: list[int], b: list[int]) -> tuple[list[int], int, int, int, list[int]] | None:
    """(batch, M, N, K, output shape) of ``matmul(a, b)`` per torch.matmul's rules."""
    if not a or not b:
        return None
    if len(a) == 1 and len(b) == 1:
        return ([], 1, 1, a[0], []) if a[0] == b[0] else None
    m = a[-2] if len(a) >= 2 else 1
    k = a[-1]
    n = b[-1] if len(b) >= 2 else 1
    kb = b[-2] if len(b) >= 2 else b[0]
    if k != kb:
        return None
    batch = _broadcast([a[:-2], b[:-2]]) if len(a) > 2 or len(b) > 2 else []
    if batch is None:
        return None
    out = list(batch)
    if len(a) >= 2:
        out.append(m)
    if len(b) >= 2:
        out.append(n)
    return batch, m, n, k, out


def _matmul_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    dims = _matmul_dims(shapes[0], shapes[1])
    dtype = _same_dtype(dtypes, 0, 1)
    if dims is None or dtype is None:
        return None
    return [dims[4]], [dtype]


def _linear_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    x, w = shapes[0], shapes[1]
    dtype = _same_dtype(dtypes, 0, 1)
    if dtype is None or not x or len(w) not in (1, 2) or x[-1] != w[-1]:
        return None
    return [x[:-1] + w[:-1]], [dtype]


def _dot_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    dtype = _same_dtype(dtypes, 0, 1)
    if dtype is None or len(shapes[0]) != 1 or shapes[0] != shapes[1]:
        return None
    return [[]], [dtype]


def _mv_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    a, v = shapes[0], shapes[1]
    dtype = _same_dtype(dtypes, 0, 1)
    if dtype is None or len(a) != 2 or len(v) != 1 or a[1] != v[0]:
        return None
    return [[a[0]]], [dtype]


def _addmv_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    return _mv_out(shapes[1:], dtypes[1:])


def _reduce_all_out(name: str):
    def rule(shapes: Shapes, dtypes: list[str]) -> Meta | None:
        # the full reduction is the (self, dtype) overload; with dim it has 4+ arguments
        if len(dtypes) != 2 or dtypes[0] not in DTYPE_BYTES or dtypes[1] != "":
            return None
        dtype, category = dtypes[0], _CATEGORY[dtypes[0]]
        if category < 2:
            if name == "mean":
                return None  # mean of integers is an error in torch; never guess
            dtype = "long int"  # sum of bool/integers accumulates in int64
        return [[]], [dtype]
    return rule


# -- FLOP rules ------------------------------------------------------------------------------
def _mm_flops(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int | None:
    a, b = shapes[0], shapes[1]
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    return 2 * a[0] * a[1] * b[1]


def _bmm_flops(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int | None:
    a, b = shapes[0], shapes[1]
    if len(a) != 3 or len(b) != 3 or a[2] != b[1] or a[0] != b[0]:
        return None
    return 2 * a[0] * a[1] * a[2] * b[2]


def _matmul_flops(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int | None:
    dims = _matmul_dims(shapes[0], shapes[1])
    if dims is None:
        return None
    batch, m, n, k, _ = dims
    return 2 * prod(batch) * m * n * k


def _linear_flops(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int | None:
    x, w = shapes[0], shapes[1]
    if not x or len(w) not in (1, 2) or x[-1] != w[-1]:
        return None
    out = w[0] if len(w) == 2 else 1
    return 2 * prod(x[:-1]) * x[-1] * out


def _shifted(rule, skip: int = 1):
    """The rule of the product inside an ``add*`` op (its first argument is the addend)."""
    def shifted(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int | None:
        return rule(shapes[skip:], dtypes[skip:], meta)
    return shifted


def _per_output(count: int):
    def rule(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int | None:
        if meta is None:
            return None
        return count * sum(prod(s) for s in meta[0])
    return rule


def _reduce_flops(extra: int):
    def rule(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int | None:
        if meta is None:
            return None
        n = prod(shapes[0])
        return max(n - 1, 0) + extra
    return rule


def _zero(shapes: Shapes, dtypes: list[str], meta: Meta | None) -> int:
    return 0


# -- the operator table ----------------------------------------------------------------------
_SPECS: dict[str, _Spec] = {}


def _add(names: str, spec_factory: Callable[[], _Spec], inplace: str | None = "rw") -> None:
    """Register ``aten::<name>`` (and its in-place ``aten::<name>_`` when ``inplace``)."""
    for name in names.split():
        _SPECS[f"aten::{name}"] = spec_factory()
        if inplace is not None:
            spec = spec_factory()
            spec.inplace = inplace
            _SPECS[f"aten::{name}_"] = spec


# matmul family: (operands, FLOP rule, output rule)
for _name, _ops, _fl, _out in (
    ("mm", 2, _mm_flops, _mm_out), ("addmm", 3, _shifted(_mm_flops), _addmm_out),
    ("bmm", 2, _bmm_flops, _bmm_out), ("baddbmm", 3, _shifted(_bmm_flops), _baddbmm_out),
    ("matmul", 2, _matmul_flops, _matmul_out), ("linear", 3, _linear_flops, _linear_out),
    ("dot", 2, lambda s, d, m: 2 * s[0][0] if len(s[0]) == 1 else None, _dot_out),
    ("vdot", 2, lambda s, d, m: 2 * s[0][0] if len(s[0]) == 1 else None, _dot_out),
    ("mv", 2, lambda s, d, m: 2 * prod(s[0]) if len(s[0]) == 2 else None, _mv_out),
    ("addmv", 3, lambda s, d, m: 2 * prod(s[1]) if len(s[1]) == 2 else None, _addmv_out),
):
    _add(_name, lambda o=_ops, f=_fl, u=_out:  # type: ignore[misc]  # mypy: lambda defaults
         _Spec(CUBE, "matmul", o, f, u),
         inplace="rw" if _name in ("addmm", "baddbmm", "addmv") else None)
# convolutions and other matrix-unit work whose FLOPs need arguments Kineto does not record
_add("conv1d conv2d conv3d convolution _convolution conv_transpose1d conv_transpose2d conv_transpose3d "
     "mkldnn_convolution cudnn_convolution cudnn_convolution_transpose convolution_backward "
     "_convolution_double_backward addbmm _int_mm _scaled_mm einsum tensordot",
     lambda: _Spec(CUBE, "conv"), inplace=None)

# elementwise arithmetic: FLOPs per output element, number of operand positions
for _names, _per, _operand_count, _int_to_float in (
    ("add sub rsub mul", 1, 2, False),
    ("div true_divide", 1, 2, True),
    ("neg square", 1, 1, False),
    ("reciprocal", 1, 1, True),
    ("addcmul", 2, 3, False),
    ("addcdiv", 2, 3, True),
    ("lerp", 3, 3, True),
):
    _add(_names, lambda p=_per, c=_operand_count, i=_int_to_float:  # type: ignore[misc]  # mypy: lambda defaults
         _Spec(VECTOR, "elementwise", c, _per_output(p), _elementwise_out(int_to_float=i)(c)))
# other elementwise ops: output known, FLOPs not defined (None)
for _names, _operand_count, _kw in (
    ("abs sign floor ceil round trunc frac relu clamp_min clamp_max bitwise_not logical_not", 1, {}),
    ("exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sigmoid tanh sin cos tan asin acos atan sinh cosh "
     "erf erfc erfinv silu gelu mish hardswish hardsigmoid softplus logit", 1, {"int_to_float": True}),
    ("clamp", 3, {}),
    ("maximum minimum fmax fmin remainder fmod floor_divide bitwise_and bitwise_or bitwise_xor "
     "logical_and logical_or logical_xor pow atan2 hypot copysign", 2, {}),
    ("eq ne lt le gt ge isnan isinf isfinite", 2, {"result": "bool"}),
):
    _add(_names, lambda c=_operand_count, kw=_kw:  # type: ignore[misc]  # mypy: lambda defaults
         _Spec(VECTOR, "elementwise", c, None, _elementwise_out(**kw)(c)))
_add("where", lambda: _Spec(VECTOR, "elementwise", 3, None, _elementwise_out(skip=1)(3)), inplace=None)
_add("sum", lambda: _Spec(VECTOR, "reduce", 1, _reduce_flops(0), _reduce_all_out("sum")), inplace=None)
_add("mean", lambda: _Spec(VECTOR, "reduce", 1, _reduce_flops(1), _reduce_all_out("mean")), inplace=None)

# data movement
_add("clone", lambda: _Spec(COPY, "clone", 1, _zero, _same_as_first), inplace=None)
_add("contiguous to _to_copy _copy_from _copy_from_and_resize",
     lambda: _Spec(COPY, "copy_unknown", 1, _zero, None), inplace=None)
_SPECS["aten::copy_"] = _Spec(COPY, "copy", 2, _zero, None, inplace="w")  # reads src, overwrites self
# in-place ops that overwrite self without reading it
for _name in ("fill_", "zero_", "normal_", "uniform_", "random_", "exponential_", "cauchy_", "log_normal_",
              "geometric_", "bernoulli_"):
    _SPECS[f"aten::{_name}"] = _Spec(OTHER, "fill", 0, _zero, None, inplace="w")
# in-place ops that write part of self (or reallocate it): the bytes they touch are unknown
for _name in ("index_put_", "_index_put_impl_", "scatter_", "scatter_add_", "scatter_reduce_", "index_add_",
              "index_copy_", "index_fill_", "masked_fill_", "masked_scatter_", "put_", "fill_diagonal_",
              "resize_", "resize_as_"):
    _SPECS[f"aten::{_name}"] = _Spec(OTHER, "partial", 0, None, None, inplace="partial")
# views and allocations: no data moved, no arithmetic
_add("view _unsafe_view _reshape_alias as_strided t transpose permute expand expand_as squeeze unsqueeze "
     "select slice narrow detach alias resolve_conj resolve_neg unfold diagonal mT mH numpy_T view_as "
     "view_as_real view_as_complex real imag lift_fresh split split_with_sizes chunk unbind swapaxes "
     "swapdims empty empty_like empty_strided new_empty new_empty_strided",
     lambda: _Spec(OTHER, "view", 0, _zero, None), inplace=None)
# in-place metadata changes
for _name in ("as_strided_", "t_", "transpose_", "squeeze_", "unsqueeze_", "swapaxes_", "swapdims_",
              "detach_", "set_", "requires_grad_", "_coalesced_"):
    _SPECS[f"aten::{_name}"] = _Spec(OTHER, "view", 0, _zero, None, inplace="meta")


def _t_out(shapes: Shapes, dtypes: list[str]) -> Meta | None:
    if not dtypes or dtypes[0] not in DTYPE_BYTES or len(shapes[0]) > 2:
        return None
    return [shapes[0][::-1]], [dtypes[0]]


_SPECS["aten::t"].out = _t_out
for _name in ("detach", "alias", "resolve_conj", "resolve_neg", "lift_fresh"):
    _SPECS[f"aten::{_name}"].out = _same_as_first
del _name, _names, _ops, _fl, _out, _per, _operand_count, _int_to_float, _kw


def _spec(name: str) -> _Spec | None:
    spec = _SPECS.get(name)
    if spec is None and name.endswith("_") and not name.endswith("__") and name.startswith("aten::"):
        # an in-place op we know nothing else about: it writes self, and reads it too
        spec = _SPECS[name] = _Spec(OTHER, "inplace", 0, None, None, inplace="rw")
    return spec


# -- convolutions: the output size needs the scalar arguments (``Concrete Inputs``) -----------
#: operator -> (argument index of stride, padding, dilation; of the "transposed" flag or -1)
_CONV_ARGS: dict[str, tuple[int, int, int, int]] = {
    "aten::conv1d": (3, 4, 5, -1), "aten::conv2d": (3, 4, 5, -1), "aten::conv3d": (3, 4, 5, -1),
    "aten::convolution": (3, 4, 5, 6), "aten::_convolution": (3, 4, 5, 6),
    "aten::cudnn_convolution": (3, 2, 4, -1), "aten::mkldnn_convolution": (4, 3, 5, -1),
}


def _ints(text: str, n: int) -> list[int] | None:
    """``'[1, 1]'`` (or ``'2'``, one value for every dimension) as n integers."""
    text = text.strip()
    try:
        values = [int(v) for v in text.strip("[]").split(",")] if text else []
    except ValueError:
        return None
    if len(values) == 1 and n > 1:
        values *= n
    return values if len(values) == n else None


def conv_output(name: str, shapes: Shapes, concrete: list[str]) -> list[int] | None:
    """The output shape of a (non-transposed) convolution from its input and weight shapes and
    its recorded scalar arguments, or None."""
    where = _CONV_ARGS.get(name)
    if where is None or len(shapes) < 2:
        return None
    x, w = shapes[0], shapes[1]
    if len(x) < 3 or len(w) != len(x):
        return None
    stride_at, pad_at, dilation_at, transposed_at = where
    if max(where) >= len(concrete) or (transposed_at >= 0 and concrete[transposed_at] != "False"):
        return None
    n = len(x) - 2
    stride, dilation = _ints(concrete[stride_at], n), _ints(concrete[dilation_at], n)
    if stride is None or dilation is None:
        return None
    kernel = w[2:]
    padding_text = concrete[pad_at].strip().strip("'\"")
    if padding_text == "valid":
        padding: list[int] | None = [0] * n
    elif padding_text == "same":
        return [x[0], w[0], *x[2:]]
    else:
        padding = _ints(padding_text, n)
    if padding is None:
        return None
    spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
               for size, p, d, k, s in zip(x[2:], padding, dilation, kernel, stride, strict=True)]
    return [x[0], w[0], *spatial] if all(v > 0 for v in spatial) else None


# -- computing one operator -----------------------------------------------------------------
def _output(spec: _Spec, shapes: Shapes, dtypes: list[str]) -> Meta | None:
    if spec.inplace:
        return _same_as_first(shapes, dtypes) if spec.inplace != "meta" else None
    outs = _out_args(spec, shapes, dtypes)
    if outs is not None:
        return outs
    return spec.out(shapes, dtypes) if spec.out is not None else None


def _tensor_bytes(shapes: Shapes, dtypes: list[str]) -> int | None:
    total = 0
    for s, d in zip(shapes, dtypes, strict=True):
        size = DTYPE_BYTES.get(d)
        if size is not None:
            total += prod(s) * size
        elif d not in _NON_TENSOR:
            return None  # a TensorList or an unknown dtype: its size is not recorded
    return total


def _bytes(spec: _Spec, shapes: Shapes, dtypes: list[str], meta: Meta | None) -> tuple[int, int] | None:
    inplace = spec.inplace
    if spec.kind == "view" or inplace == "meta":
        return 0, 0
    if inplace == "partial":
        return None
    if inplace:
        if dtypes[0] not in DTYPE_BYTES:
            return None
        start = 1 if inplace == "w" else 0  # an overwrite does not read self
        read = _tensor_bytes(shapes[start:], dtypes[start:])
        return None if read is None else (read, _nbytes(shapes[0], dtypes[0]))
    if meta is None:
        return None
    count = spec.operands or len(dtypes)
    read = _tensor_bytes(shapes[:count], dtypes[:count])
    if read is None:
        return None
    return read, sum(_nbytes(s, d) for s, d in zip(*meta, strict=True))


Cost = tuple[int | None, tuple[int, int] | None, Meta | None]
_NOTHING: Cost = (None, None, None)


def _compute(name: str, shapes: Shapes, dtypes: list[str]) -> Cost:
    spec = _spec(name)
    if spec is None:
        return _NOTHING
    try:
        meta = _output(spec, shapes, dtypes)
    except (IndexError, TypeError, KeyError, ValueError):  # an overload with other arguments
        meta = None
    try:
        count = spec.flops(shapes, dtypes, meta) if spec.flops is not None else None
    except (IndexError, TypeError, KeyError, ValueError):
        count = None
    try:
        moved = _bytes(spec, shapes, dtypes, meta)
    except (IndexError, TypeError, KeyError, ValueError):
        moved = None
    return count, moved, meta


#: cached results: a training job repeats the same calls (name, shapes, dtypes) every iteration
MEMO_LIMIT = 65536


def cost(name: str, shapes: list[Any] | None, dtypes: list[Any] | None,
         concrete: list[Any] | None = None) -> Cost:
    """(FLOPs, (bytes read, bytes written), (output shapes, output dtypes)) of one call, each
    None when unknown: :func:`flops`, :func:`bytes_moved` and :func:`output_meta` at once.
    ``concrete``: the call's scalar argument values as Kineto records them (convolutions)."""
    if shapes is None or dtypes is None:
        return _NOTHING
    try:
        found = _cached(name, tuple(map(tuple, shapes)), tuple(dtypes))
    except TypeError:  # a nested (unhashable) shape
        found = _compute(name, shapes, dtypes)
    if found[0] is None and concrete and name in _CONV_ARGS:
        return _conv_cost(name, shapes, dtypes, concrete, found)
    return found


def _conv_cost(name: str, shapes: Shapes, dtypes: list[str], concrete: list[Any], found: Cost) -> Cost:
    """A convolution's cost once its scalar arguments are known: FLOPs, and the bytes of its
    input, weight (and bias) read and its output written."""
    try:
        out = conv_output(name, shapes, [str(c) for c in concrete])
        if out is None or dtypes[0] not in DTYPE_BYTES:
            return found
        count = 2 * out[0] * prod(out[2:]) * prod(shapes[1])
        read = _tensor_bytes(shapes[:3], dtypes[:3])
        moved = None if read is None else (read, _nbytes(out, dtypes[0]))
        return count, moved, ([out], [dtypes[0]])
    except (IndexError, TypeError, ValueError):
        return found


@functools.lru_cache(maxsize=MEMO_LIMIT)
def _cached(name: str, shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...]) -> Cost:
    return _compute(name, [list(s) for s in shapes], list(dtypes))


# -- public API ------------------------------------------------------------------------------
def unit(name: str) -> str:
    """The execution unit an operator's work belongs to: ``cube`` (matmul/conv family),
    ``vector`` (elementwise arithmetic and math, full reductions), ``copy``
    (copy_/_to_copy/clone/contiguous/to) or ``other``."""
    spec = _spec(name)
    return spec.unit if spec is not None else OTHER


def flops(name: str, shapes: list[Any], dtypes: list[Any], concrete: list[Any] | None = None) -> int | None:
    """Floating-point operations of one call (conventions in the module docstring), or None."""
    return cost(name, shapes, dtypes, concrete)[0]


def bytes_moved(name: str, shapes: list[Any], dtypes: list[Any]) -> tuple[int, int] | None:
    """(bytes read, bytes written) of one call, or None when unknown (see the module docstring)."""
    return cost(name, shapes, dtypes)[1]


def output_meta(name: str, shapes: list[Any], dtypes: list[Any]) -> tuple[list[Any], list[str]] | None:
    """(output shapes, output dtypes) where the operator's semantics give them, else None."""
    return cost(name, shapes, dtypes)[2]
