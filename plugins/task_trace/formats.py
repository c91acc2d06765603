"""The op_summary cells that describe tensors: shapes, data types and memory formats.

Kineto records one entry per operator argument (``shapes``, ``dtypes``, ``strides`` lists of
equal length).  The cells follow the contract: one item per tensor, tensors separated by
``;``, dimensions by ``,`` (``"64,32;32,16"``).

* Only tensor arguments are listed.  Kineto marks the others by their type name instead of a
  dtype: ``Scalar`` (a Python number), ``ScalarList`` (an int list such as a size), ``""``
  (None, strings, other values) and ``TensorList`` (``torch.cat``'s input: Kineto keeps no
  per-tensor shapes for lists, so they cannot be listed either).  A 0-dim tensor is a tensor:
  it appears as an empty item with its dtype.  That includes a Python number PyTorch wraps
  into a 0-dim tensor for a Tensor argument: ``x.add_(1)`` on a (4, 8) float tensor lists
  ``"4,8;"`` and ``float32;int64`` (the ``alpha`` Scalar is left out).
* Data types use torch's names (``float32``, ``bfloat16``, ``int64``), mapped from the C++
  names Kineto records (``float``, ``c10::BFloat16``, ``long int``).
* Formats are the memory layout read from the strides, in PyTorch's terms: ``contiguous``
  (row-major, as ``Tensor.is_contiguous()`` says), ``channels_last`` (4-D NHWC),
  ``channels_last_3d`` (5-D NDHWC), otherwise ``strided`` (a transposed, sliced or expanded
  view).  Ascend's formats (``ND``, ``NCHW``, ``FRACTAL_NZ``...) describe its own tile
  layouts; PyTorch tensors have strides instead.
"""

from __future__ import annotations

from typing import Any

#: Kineto's C++ type names -> torch dtype names
DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "signed char": "int8", "unsigned char": "uint8", "short int": "int16", "short": "int16",
    "int": "int32", "long int": "int64", "long long int": "int64", "long": "int64", "bool": "bool",
    "short unsigned int": "uint16", "unsigned int": "uint32", "long unsigned int": "uint64",
    "long long unsigned int": "uint64", "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
}
#: what Kineto records instead of a dtype for an argument that is not a tensor
NOT_TENSORS = frozenset({"", "Scalar", "ScalarList", "TensorList", "GenericList", "None"})


def dtype_name(kineto: str) -> str:
    """torch's name for a Kineto dtype (``c10::Float8_e4m3fn`` -> ``float8_e4m3fn``); a name
    that already is torch's (``float32``) comes back unchanged."""
    name = DTYPES.get(kineto)
    if name is None:
        name = DTYPES[kineto] = kineto.removeprefix("c10::").lower()
    return name


def _row_major(shape: list[int], strides: list[int], order: tuple[int, ...]) -> bool:
    """True when ``strides`` are dense in ``order`` (innermost dimension first); dimensions of
    size 1 may have any stride, as in PyTorch's contiguity checks."""
    expected = 1
    for d in order:
        size = shape[d]
        if size != 1:
            if strides[d] != expected:
                return False
            expected *= size
    return True


_CL2D, _CL3D = (1, 3, 2, 0), (1, 4, 3, 2, 0)


def memory_format(shape: list[int], strides: Any) -> str:
    """``contiguous``, ``channels_last``, ``channels_last_3d`` or ``strided`` (``N/A`` when
    the tensor has no strides, e.g. a sparse one)."""
    n = len(shape)
    if not isinstance(strides, list) or len(strides) != n:
        return "N/A"
    if 0 in shape or _row_major(shape, strides, tuple(range(n - 1, -1, -1))):
        return "contiguous"  # an empty tensor is contiguous whatever its strides
    if n == 4 and _row_major(shape, strides, _CL2D):
        return "channels_last"
    if n == 5 and _row_major(shape, strides, _CL3D):
        return "channels_last_3d"
    return "strided"


def input_cells(shapes: list[Any], dtypes: list[Any], strides: list[Any] | None) -> tuple[str, str, str]:
    """(Input Shapes, Input Data Types, Input Formats) of one operator's arguments."""
    sh, dt, fm = [], [], []
    names = DTYPES
    if strides is None or len(strides) != len(shapes):
        strides = [None] * len(shapes)
    for shape, kineto, stride in zip(shapes, dtypes, strides, strict=False):
        if kineto in NOT_TENSORS:
            continue
        name = names.get(kineto) or dtype_name(kineto)
        dt.append(name)
        n = len(shape)
        if n == 0:
            sh.append("")
            fm.append("contiguous" if stride == [] else "N/A")
            continue
        sh.append(",".join(map(str, shape)))
        # the common case inline: contiguous without a size-1 or size-0 dimension
        if stride is not None and len(stride) == n and stride[-1] == 1 and (
                n == 1 or (n == 2 and stride[0] == shape[1])):
            fm.append("contiguous")
        else:
            fm.append(memory_format(shape, stride))
    return ";".join(sh), ";".join(dt), ";".join(fm)


def output_cells(outputs: Any) -> tuple[str, str, str] | None:
    """(Output Shapes, Output Data Types, Output Formats) from ``Task.outputs`` ((shapes,
    dtypes), or with strides as a third item), or None when the outputs are unknown."""
    if not outputs:
        return None
    shapes, dtypes = outputs[0], outputs[1]
    strides = outputs[2] if len(outputs) > 2 else None
    shape_cell = ";".join(",".join(map(str, s)) for s in shapes)
    dtype_cell = ";".join(dtype_name(str(d)) for d in dtypes)
    if strides is None:
        format_cell = "N/A"  # output strides are not recorded: the layout is unknown
    else:
        format_cell = ";".join(memory_format(s, st) for s, st in zip(shapes, strides, strict=False))
    return shape_cell, dtype_cell, format_cell
