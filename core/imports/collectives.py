"""NCCL kernels (RCCL's on ROCm, which keep NCCL's names) as hccl's collective records.

Every NCCL kernel is one collective: its span is the kernel's on the device (a rank's kernel
waits inside for its peers, so the cross-rank wait is measured there, as NCCL sees it).  Its
parameters come, in this order, from the ``record_param_comms`` operator around the launch on
the host (torch records the collective's name, group, ranks, dtype and element counts there),
from the same keys on the kernel itself (newer Kineto copies them), or from the kernel's name
(``ncclKernel_AllReduce_RING_LL_Sum_float``: the operation); what none of them says is N/A.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jobprof.plugin.records import CollectiveRecord

#: torch's names in record_param_comms (``Collective name``) -> torch.distributed's, as the hccl
#: plugin names the c10d operators (jobprof.plugins.hccl.collectives.OPERATORS; a test holds
#: the two tables to each other)
OPERATIONS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced", "broadcast": "broadcast",
    "reduce": "reduce", "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "all_gather_into_tensor": "all_gather_into_tensor", "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all_single",
    "all_to_allv": "all_to_all_single", "gather": "gather", "scatter": "scatter", "barrier": "barrier",
    "send": "send", "recv": "recv", "recvAnySource": "recv", "recv_any_source": "recv"}
#: the operation in an NCCL kernel's name -> torch.distributed's name
KERNEL_OPERATIONS = {"AllReduce": "all_reduce", "Broadcast": "broadcast", "Reduce": "reduce",
                     "AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "SendRecv": "send_recv",
                     "Send": "send", "Recv": "recv", "AllToAll": "all_to_all"}
_KERNEL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)")
#: c10's ScalarType names (record_param_comms ``dtype``) -> (torch's name, bytes per element)
DTYPES = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2), "BFloat16": ("bfloat16", 2),
    "Int": ("int32", 4), "Long": ("int64", 8), "Short": ("int16", 2), "Char": ("int8", 1),
    "Byte": ("uint8", 1), "Bool": ("bool", 1), "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16), "ComplexHalf": ("complex32", 4),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1),
    "Float8_e4m3fnuz": ("float8_e4m3fnuz", 1), "Float8_e5m2fnuz": ("float8_e5m2fnuz", 1),
    "UInt16": ("uint16", 2), "UInt32": ("uint32", 4), "UInt64": ("uint64", 8)}
#: the C++ names of an operator's inputs (Kineto's ``Input type``) -> bytes per element
INPUT_TYPES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
               "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
               "c10::complex<double>": 16}
_RANKS_RE = re.compile(r"^\[\s*(\d+(\s*,\s*\d+)*)?\s*\]$")
#: where the end of an imported collective comes from
END_FROM = "device kernel"


def is_collective_kernel(name: str) -> bool:
    return name.startswith("nccl") and _KERNEL_RE.match(name) is not None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ranks(args: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The group's global ranks: the explicit list (``Process Group Ranks``, "[0, 1]" or a
    list), else start + stride x i over the group's size; None when neither is there."""
    value = args.get("Process Group Ranks")
    if isinstance(value, list) and value and all(_int(v) is not None and v >= 0 for v in value):
        return tuple(value)
    if isinstance(value, str) and len(value) < 1 << 16:
        match = _RANKS_RE.match(value.strip())
        if match and match[1]:
            return tuple(int(v) for v in match[1].split(","))
    size, start, stride = (_int(args.get(k))
                           for k in ("Group size", "Global rank start", "Global rank stride"))
    if size and size > 0 and size < 1 << 20 and start is not None and start >= 0 and stride and stride > 0:
        return tuple(start + stride * i for i in range(size))
    return None


def _params(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record fields that ``args`` (record_param_comms' or the kernel's) says."""
    if not args:
        return {}
    out: dict[str, Any] = {}
    name = args.get("Collective name")
    if isinstance(name, str) and name in OPERATIONS:
        out["op"] = OPERATIONS[name]
    group = args.get("Process Group Name")
    if isinstance(group, (str, int)) and not isinstance(group, bool):
        out["group"] = str(group)
    desc = args.get("Process Group Description")
    if isinstance(desc, str):
        out["group_desc"] = desc
    ranks = _ranks(args)
    if ranks is not None:
        out["ranks"] = ranks
    size = _int(args.get("Group size"))
    if size is not None and size > 0:
        out["rank_size"] = size
    elif ranks is not None:
        out["rank_size"] = len(ranks)
    dtype = args.get("dtype")
    if isinstance(dtype, str) and dtype in DTYPES:
        torch_name, width = DTYPES[dtype]
        out["dtype"] = torch_name
        counts = [c for c in (_int(args.get("In msg nelems")), _int(args.get("Out msg nelems")))
                  if c is not None and c >= 0]
        if counts:
            # the message S of nccl-tests: the larger buffer (all_gather's output, reduce_scatter's
            # input, the tensor itself for all_reduce / broadcast / send / recv)
            out["count"] = max(counts)
            out["bytes"] = max(counts) * width
    seq = _int(args.get("Seq"))
    if seq is None:
        seq = _int(args.get("seq"))
    if seq is not None and seq >= 0:
        out["seq"] = seq
    return out


def _input_bytes(args: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(elements, bytes) of the largest tensor input a host event recorded (its ``Input Dims``
    and ``Input type``), or None."""
    if not args:
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    best = None
    for shape, kind in zip(dims, types, strict=False):  # a list cut short: the pairs there are
        width = INPUT_TYPES.get(kind) if isinstance(kind, str) else None
        if width is None or not isinstance(shape, list) or not shape or \
                not all(_int(d) is not None and d >= 0 for d in shape):
            continue
        count = 1
        for d in shape:
            count *= d
        if best is None or count > best[0]:
            best = (count, count * width)
    return best


def record(kernel: Mapping[str, Any], start_ns: int, end_ns: int, host: Mapping[str, Any],
           launch_tid: int | None, rank: int | None, backend: str | None,
           default_group: Mapping[str, Any] | None = None) -> CollectiveRecord:
    """One NCCL kernel (its span ``[start_ns, end_ns)`` on the device) as a collective record;
    ``host``: the host events around its launch (:meth:`jobprof.imports.scan.Scan.comms_at`);
    ``default_group``: the job's only process group (``distributedInfo.pg_config``), if it has
    one only, for calls whose record does not name theirs."""
    fields = _params(kernel.get("args"))
    fields.update(_params(host.get("record_param_comms")))  # torch's own account of the call
    c10d = host.get("c10d:: name")
    if "op" not in fields and isinstance(c10d, str):
        op = OPERATIONS.get(c10d.removeprefix("c10d::").rstrip("_"))
        if op is not None:
            fields["op"] = op
    if "op" not in fields:
        match = _KERNEL_RE.match(kernel.get("name", ""))
        fields["op"] = KERNEL_OPERATIONS.get(match[1], match[1].lower()) if match else "nccl"
    if "bytes" not in fields:
        size = _input_bytes(host.get("nccl:"))
        if size is not None:
            fields["count"], fields["bytes"] = size
    if "group" not in fields and default_group:
        fields.update({k: v for k, v in _params(default_group).items() if k not in fields})
    return CollectiveRecord(start_ns=start_ns, end_ns=end_ns, tid=launch_tid, end_from=END_FROM,
                            is_async=True, rank=rank, backend=backend, **fields)


def default_group(distributed: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job's process group as record_param_comms would name it, when ``distributedInfo``
    lists exactly one (``pg_config``): every collective of the job is in it."""
    groups = distributed.get("pg_config")
    if not isinstance(groups, list) or len(groups) != 1 or not isinstance(groups[0], dict):
        return None
    pg = groups[0]
    out = {"Process Group Name": pg.get("pg_name"), "Process Group Description": pg.get("pg_desc"),
           "Process Group Ranks": pg.get("ranks"), "Group size": pg.get("pg_size")}
    return {k: v for k, v in out.items() if v is not None}
