"""How a top-level operator's time splits into compute, copy and framework (dispatch) time.

msprof's aicpu file splits each AI CPU task into ``Compute_time``, ``Memcpy_time`` and
``Dispatch_time``.  A PyTorch operator has no such counters; the split comes from the operator
tree Kineto recorded (:class:`jobprof.plugin.opview.OpView`), whose self times (a record's duration
minus its children's) add up exactly to the top-level operator's duration.  Every record of the
subtree puts its self time in one bucket:

* ``Memcpy``: the self time of the operators that move bytes themselves (:data:`COPY_OPS`) and,
  on CUDA jobs, of CUDA runtime copy calls (``cudaMemcpy*`` / ``cuMemcpy*``: the host waits for
  or enqueues the transfer).
* ``Compute``: the self time of every other dispatcher operator, except the framework ones below.
* ``Dispatch`` (the rest: ``Total - Compute - Memcpy``): the self time of operators that do no
  work of their own (:data:`FRAMEWORK_OPS`: allocation, views and metadata, composite wrappers
  whose body only calls other operators; and an operator that a Python dispatch mode or tensor
  subclass runs again below itself: the outer record is that layer), of
  non-operator records in the subtree (CUDA launch calls, synchronisation), and the time no
  record covers.  It is what the framework costs around
  the work: dispatcher, autograd bookkeeping, allocation, views, kernel launches.

Limits, stated: the autograd layer of an operator (recording the graph in forward) runs inside
the operator's own record, so it counts with the operator's self time; an operator that is a
composite wrapper but is not in :data:`COMPOSITE_OPS` counts its (small) glue time as compute.
Wrapper operators such as ``aten::_to_copy`` or ``aten::clone`` are framework: the copy they
make is their ``aten::copy_`` child.

On CUDA jobs the split is of the host-side time (the device time of the kernels an operator
launched is in op_summary / task_time), and :func:`launching_tops` tells which operators
launched device work at all; the others ran entirely on the host.  UNVERIFIED on a GPU so far.
"""

from __future__ import annotations

import attrs

from jobprof.plugin import DEVICE_KINDS, OpView, is_dispatch_op

#: operators whose self time is the copy itself (``aten::_to_copy``, ``aten::clone``,
#: ``aten::contiguous`` and ``aten::to`` are wrappers: their copy is a ``copy_`` child)
COPY_OPS = frozenset({
    "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::copy",
})
#: allocation: creating storage is framework work, not computation
ALLOCATION_OPS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_", "aten::resize_as_", "aten::_empty_affine_quantized",
})
#: views and metadata: they change sizes/strides/flags, never touch the data
VIEW_OPS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::view_as", "aten::as_strided", "aten::as_strided_",
    "aten::t", "aten::t_", "aten::transpose", "aten::transpose_", "aten::numpy_T", "aten::mT",
    "aten::expand", "aten::expand_as", "aten::reshape", "aten::_reshape_alias", "aten::reshape_as",
    "aten::resolve_conj", "aten::resolve_neg", "aten::conj", "aten::_conj", "aten::_neg_view",
    "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::lift",
    "aten::slice", "aten::select", "aten::narrow", "aten::unsqueeze", "aten::unsqueeze_",
    "aten::squeeze", "aten::squeeze_", "aten::permute", "aten::flatten", "aten::unflatten",
    "aten::unbind", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::diagonal",
    "aten::unfold", "aten::movedim", "aten::moveaxis", "aten::swapaxes", "aten::set_",
    "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::requires_grad_",
    "aten::_version", "aten::retain_grad", "aten::_shape_as_tensor",
})
#: composite wrappers: their body only calls other operators (their self time is glue)
COMPOSITE_OPS = frozenset({
    "aten::to", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::type_as",
    "aten::linear", "aten::matmul", "aten::einsum", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::convolution", "aten::_convolution", "aten::batch_norm", "aten::_batch_norm_impl_index",
    "aten::layer_norm", "aten::group_norm", "aten::dropout", "aten::cross_entropy_loss",
    "aten::nll_loss", "aten::nll_loss_nd", "aten::softmax", "aten::log_softmax",
    "aten::max_pool2d", "aten::adaptive_avg_pool2d", "aten::zeros", "aten::zeros_like",
    "aten::ones", "aten::ones_like", "aten::full", "aten::full_like", "aten::new_zeros",
    "aten::new_ones", "aten::new_full", "aten::scalar_tensor",
})
#: operators whose self time is framework work (dispatch), not compute or copy
FRAMEWORK_OPS = ALLOCATION_OPS | VIEW_OPS | COMPOSITE_OPS
#: the records Kineto writes where an operator enters Python (a dispatch mode, a tensor subclass)
PYTHON_DISPATCH_RECORDS = frozenset({"PythonDispatchMode", "PythonTLSSnapshot"})
#: CUDA runtime/driver calls that copy (their host time is the copy's host side)
CUDA_COPY_PREFIXES = ("cudaMemcpy", "cuMemcpy")


@attrs.frozen
class Split:
    """One top-level operator's times, integer ns: ``task + dispatch == total`` exactly."""

    compute: int
    memcpy: int
    total: int

    @property
    def task(self) -> int:
        return self.compute + self.memcpy

    @property
    def dispatch(self) -> int:
        return self.total - self.task


def bucket(name: str, kind: str) -> str:
    """Where a record's self time goes: ``memcpy``, ``compute`` or ``dispatch``."""
    if is_dispatch_op(name, kind):
        if name in COPY_OPS:
            return "memcpy"
        return "dispatch" if name in FRAMEWORK_OPS else "compute"
    if kind in ("cuda_runtime", "cuda_driver") and name.startswith(CUDA_COPY_PREFIXES):
        return "memcpy"
    return "dispatch"


def split(view: OpView, i: int) -> Split:
    """The compute / memcpy / dispatch split of top-level operator ``i``."""
    records = view.records
    compute = memcpy = 0
    for j in view.subtree(i):
        name = records[j].name
        where = bucket(name, records[j].kind)
        if where == "dispatch" or _redispatched(view, j, name):
            continue
        own = max(0, view.self_ns(j))
        if where == "memcpy":
            memcpy += own
        else:
            compute += own
    total = records[i].dur
    # children never outlast their parent (the tree nests): this only guards odd records
    memcpy = min(memcpy, total)
    compute = min(compute, total - memcpy)
    return Split(compute, memcpy, total)


def _redispatched(view: OpView, j: int, name: str) -> bool:
    """The operator runs itself again one level down (a Python dispatch mode or tensor subclass
    re-enters the dispatcher, e.g. the l2 plugin's counter mode; Kineto then records
    ``aten::mm > PythonDispatchMode > aten::mm``): the outer record's own time is that layer,
    framework time; the work is in the inner record."""
    records = view.records
    return any(records[c].name == name or records[c].name in PYTHON_DISPATCH_RECORDS
               for c in view.children(j))


def launching_tops(view: OpView) -> set[int]:
    """Top-level operators (indices) from whose subtree some device task was launched (CUDA)."""
    parent = view.parent
    tops = set(view.top)
    found: set[int] = set()
    for task in view.tasks:
        if task.record.kind not in DEVICE_KINDS:
            continue
        j = view.launch_of(task)
        while j >= 0 and j not in tops:
            j = parent[j]
        if j >= 0:
            found.add(j)
    return found


def numbered(view: OpView) -> list[tuple[int, int, int]]:
    """``(record index, thread, task id)`` of every top-level operator in start order; task ids
    count 1, 2, ... per thread."""
    counters: dict[int, int] = {}
    out = []
    for i in view.top:
        tid = view.records[i].tid
        counters[tid] = counters.get(tid, 0) + 1
        out.append((i, tid, counters[tid]))
    return out

