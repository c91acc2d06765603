"""What each torch.distributed operation is: its c10d operator, its arguments, its bandwidth rule.

Every collective and point-to-point call of torch.distributed, from Python (``dist.all_reduce``)
or from C++ (DistributedDataParallel's bucket all-reduces), goes through one dispatcher
operator of the ``c10d`` namespace (``c10d::allreduce_`` ...); the capture wraps those.

Sizes and bandwidths follow the nccl-tests conventions (``doc/PERFORMANCE.md`` there):

* ``S`` (``size(Byte)``) is the size of the whole message: the tensor for all_reduce,
  broadcast, reduce, send and recv; ``n`` x the per-rank chunk for all_gather, reduce_scatter,
  all_to_all, gather and scatter (what one rank's buffer holds when it has everything);
  ``count`` is ``S`` in elements.
* ``algbw = S / t`` (t the duration), in GB/s with GB = 10**9 bytes.
* ``busbw = algbw * factor``: ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather,
  reduce_scatter, all_to_all, gather and scatter, ``1`` for broadcast, reduce, send and recv;
  with ``n`` ranks in the group.  barrier moves no data: both are N/A.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.frozen
class Collective:
    """One ``c10d`` operator as jobprof reports it."""

    #: the torch.distributed name shown in files (``OP Type``)
    name: str
    #: the schema argument holding this rank's chunk (one tensor, a list, or a list of lists)
    chunk: str | None
    #: how many chunks make the message ``S``: 1, or the group size (``"n"``)
    chunks: str = "1"
    #: busbw / algbw as a function of the group size
    bus: Callable[[int], float] = attrs.field(default=lambda n: 1.0, repr=False)
    #: the argument naming the other rank (root, destination or source), if any
    peer: str | None = None


def _allreduce_bus(n: int) -> float:
    return 2 * (n - 1) / n


def _spread_bus(n: int) -> float:
    return (n - 1) / n


#: c10d operator -> what it is.  ``chunk`` names the argument whose tensors are this rank's
#: share: for all_gather the input, for reduce_scatter the output, and so on.
OPERATORS: dict[str, Collective] = {
    "allreduce_": Collective("all_reduce", "tensors", bus=_allreduce_bus),
    "allreduce_coalesced_": Collective("all_reduce_coalesced", "tensors", bus=_allreduce_bus),
    "broadcast_": Collective("broadcast", "tensors", peer="root_rank"),
    "reduce_": Collective("reduce", "tensors", peer="root_rank"),
    "allgather_": Collective("all_gather", "input_tensors", "n", _spread_bus),
    "_allgather_base_": Collective("all_gather_into_tensor", "input_tensor", "n", _spread_bus),
    "allgather_coalesced_": Collective("all_gather_coalesced", "input_list", "n", _spread_bus),
    "allgather_into_tensor_coalesced_": Collective("all_gather_into_tensor_coalesced", "inputs", "n",
                                                   _spread_bus),
    "reduce_scatter_": Collective("reduce_scatter", "output_tensors", "n", _spread_bus),
    "_reduce_scatter_base_": Collective("reduce_scatter_tensor", "output_tensor", "n", _spread_bus),
    "reduce_scatter_tensor_coalesced_": Collective("reduce_scatter_tensor_coalesced", "outputs", "n",
                                                   _spread_bus),
    # all_to_all: the chunk is everything this rank sends (to every rank, itself included)
    "alltoall_": Collective("all_to_all", "input_tensors", bus=_spread_bus),
    "alltoall_base_": Collective("all_to_all_single", "input", bus=_spread_bus),
    "gather_": Collective("gather", "input_tensors", "n", _spread_bus, peer="root_rank"),
    "scatter_": Collective("scatter", "output_tensors", "n", _spread_bus, peer="root_rank"),
    "barrier": Collective("barrier", None),
    "send": Collective("send", "tensors", peer="dst"),
    "recv_": Collective("recv", "tensors", peer="src"),
    "recv_any_source_": Collective("recv", "tensors"),
}
#: the names of the reductions whose spans fill step_trace's Reduce Start / Duration pairs
REDUCTIONS = frozenset({"all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor",
                        "reduce_scatter_tensor_coalesced"})
_BY_NAME = {c.name: c for c in OPERATORS.values()}
#: msprof's data type names (hccl ``data type`` args); others are upper-cased torch names
_MSPROF_DTYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BFP16", "float64": "FP64",
                  "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
                  "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64"}


def chunks(name: str, ranks: int) -> int:
    """How many of this rank's chunks make the message ``S`` (see the module doc)."""
    collective = _BY_NAME.get(name)
    return ranks if collective is not None and collective.chunks == "n" else 1


def bandwidths(name: str, size: int, ranks: int, dur_ns: int | None) -> tuple[float | None, float | None]:
    """``(algbw, busbw)`` in GB/s, or None where there is no data or no duration."""
    collective = _BY_NAME.get(name)
    if collective is None or collective.chunk is None or not dur_ns or dur_ns <= 0 or ranks < 1:
        return None, None
    algbw = size / dur_ns  # bytes per ns = GB/s
    return algbw, algbw * collective.bus(ranks)


def msprof_dtype(dtype: str) -> str:
    return _MSPROF_DTYPES.get(dtype, dtype.upper() or "INVALID_TYPE")
