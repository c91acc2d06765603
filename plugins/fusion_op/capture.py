"""In the profiled process: see every graph Inductor hands out, without changing one.

Inductor calls ``CompiledFxGraph.post_compile`` once for every compiled graph it returns,
"whether or not we have a cache hit" (its docstring), for forward, backward (compiled lazily at
the first backward) and inference graphs.  The observer wraps that method: the original runs
first and unchanged, then the observer notes the graph's FX cache key (the name of the
``## Call CompiledFxGraph <key> ##`` range Inductor opens around every call while a profiler
runs), its wrapper source, the compile id (``torch._guards.CompileContext``), the phase and
the indices of its static inputs (parameters and buffers), and the compiled frame's qualified
name (Dynamo's current instruction translator, for forward graphs).  Nothing is parsed there:
the wrapper source is read into kernels on the sink thread when the iteration ends
(:func:`GraphCapture.take`), so the job's compile time holds none of jobprof's work.

The wrapper is installed when ``torch._inductor.output_code`` is imported (before the first
compile) and removed at session end.  It adds no guard, recompiles nothing and leaves the
generated code alone: the do-no-harm matrix's compile rows run with it.
"""

from __future__ import annotations

import functools
import sys
import threading
import zlib
from typing import Any

from jobprof.plugin import STEP_MODE_MODEL_ID, CompiledGraphRecord, FusedKernel, hide_frame
from jobprof.plugins.fusion_op import wrapper
from jobprof.plugins.fusion_op.records import CompileCountersRecord

#: graphs kept per process; a job recompiling without end (a shape per batch) stops here
MAX_GRAPHS = 512
_MARK = "_jobprof_fusion_op"


def model_id(model_name: str) -> int:
    """A stable Model ID for a graph name: the same on every rank and in every run."""
    value = zlib.crc32(model_name.encode())
    return value ^ 1 if value == STEP_MODE_MODEL_ID else value


def _phase(graph_kwargs: Any) -> str:
    get = getattr(graph_kwargs, "get", None)
    if get is None:
        return "fwd"
    if get("is_backward"):
        return "bwd"
    return "inf" if get("is_inference") else "fwd"


class GraphCapture:
    """The graphs of this process: pending (seen, not read yet) and known (read)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # reentrant: a SIGTERM handler may end the session in here
        self._pending: list[tuple[str | None, str, str, str, tuple[int, ...], str | None]] = []
        self._known: list[dict[str, Any]] = []
        self._names: dict[str, str] = {}  # compile id -> frame qualname (backward graphs have none)
        self._ops: frozenset[str] | None = None
        self._original: Any = None
        self._owner: Any = None
        self.errors = 0
        self.dropped = 0

    # -- training process, inside Inductor ------------------------------------------------
    def install(self, module: Any) -> None:
        """Wrap ``module.CompiledFxGraph.post_compile`` (``torch._inductor.output_code``)."""
        cls = getattr(module, "CompiledFxGraph", None)
        original = getattr(cls, "post_compile", None)
        if cls is None or original is None or getattr(original, _MARK, False):
            return
        capture = self

        @functools.wraps(original)
        def post_compile(graph: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(graph, *args, **kwargs)
            except BaseException as exc:
                hide_frame(exc)
                raise
            try:
                capture._seen(graph, args[2] if len(args) > 2 else kwargs.get("graph_kwargs"))
            except Exception:
                capture.errors += 1  # never into the compile
            return result

        setattr(post_compile, _MARK, True)
        self._original, self._owner = original, cls
        cls.post_compile = post_compile

    def remove(self) -> None:
        if self._owner is not None and getattr(self._owner.post_compile, _MARK, False):
            self._owner.post_compile = self._original
        self._owner = self._original = None

    def _seen(self, graph: Any, graph_kwargs: Any) -> None:
        source = getattr(graph, "source_code", None)
        if not isinstance(source, str):
            return
        guards = sys.modules.get("torch._guards")
        cid = guards.CompileContext.current_compile_id() if guards is not None else None
        compile_id = str(cid) if cid is not None else "?"
        convert = sys.modules.get("torch._dynamo.symbolic_convert")
        tx = getattr(getattr(convert, "tls", None), "current_tx", None)
        code = getattr(tx, "f_code", None)
        qualname = getattr(code, "co_qualname", None) if code is not None else None
        get = getattr(graph_kwargs, "get", None)
        static = get("static_input_idxs") if get is not None else None
        key = getattr(graph, "_fx_graph_cache_key", None)
        with self._lock:
            if len(self._known) + len(self._pending) >= MAX_GRAPHS:
                self.dropped += 1
                return
            self._pending.append((key if isinstance(key, str) else None, source, compile_id,
                                  _phase(graph_kwargs), tuple(static or ()), qualname))

    # -- sink thread ------------------------------------------------------------------------
    def _known_ops(self) -> frozenset[str]:
        """ATen operator names (``add``, ``threshold_backward``) to split kernel names with."""
        if self._ops is None:
            try:
                import torch

                names = torch._C._dispatch_get_all_op_names()
                self._ops = frozenset(n.split("::", 1)[1].split(".", 1)[0] for n in names
                                      if n.startswith("aten::"))
            except Exception:
                self._ops = frozenset()
        return self._ops

    def take(self, iteration: int) -> list[dict[str, Any]]:
        """Every graph known at the end of ``iteration`` (new ones read now), as raw records."""
        with self._lock:
            pending, self._pending = self._pending, []
        for key, source, compile_id, phase, static, qualname in pending:
            if qualname:
                self._names.setdefault(compile_id, qualname)
            frame = self._names.get(compile_id) or qualname or "graph"
            name = f"{frame}#{phase}{compile_id}"
            try:
                kernels = wrapper.parse(source, static, self._known_ops())
            except Exception:
                self.errors += 1
                kernels = []
            record = CompiledGraphRecord(model_id(name), name, compile_id, phase, iteration, key,
                                         [FusedKernel(k.name, k.kind, k.original_ops, k.order, k.input_bytes,
                                                      k.output_bytes, k.weight_bytes, k.workspace_bytes,
                                                      k.calls) for k in kernels])
            self._known.append(record.to_raw())
        return list(self._known)

    def identities(self) -> list[dict[str, Any]]:
        """Model ID, name, compile id, phase and cache key of every graph read so far."""
        keys = ("model_id", "model_name", "compile_id", "phase", "cache_key", "first_iteration")
        return [{k: record[k] for k in keys} for record in list(self._known)]

    def seen_any(self) -> bool:
        """Whether Inductor handed out a graph in this process yet."""
        with self._lock:
            return bool(self._known or self._pending)

    def recompiles(self) -> int:
        """Compile ids ``frame/k`` with ``k > 0`` among the graphs seen."""
        with self._lock:
            ids = {r["compile_id"] for r in self._known} | {p[2] for p in self._pending}
        return sum(1 for cid in ids if cid.rpartition("/")[2].split("_")[0] not in ("0", "", "?"))


def counters(capture: GraphCapture) -> list[dict[str, Any]]:
    """torch.compile's counts now (training thread, at the iteration end); [] before Dynamo
    is imported.  Read with ``.get``: ``counters`` is a defaultdict, and indexing it would add
    the keys a program printing its counters would then show."""
    utils = sys.modules.get("torch._dynamo.utils")
    table = getattr(utils, "counters", None)
    if table is None:
        return []
    try:
        stats, breaks, frames = table.get("stats"), table.get("graph_break"), table.get("frames")
        unique = stats.get("unique_graphs") if stats is not None else None
        broke = sum(dict(breaks).values()) if breaks is not None else 0
        total = frames.get("total") if frames is not None else None
    except Exception:  # mutated under us by another thread's compile: next iteration
        return []
    if not (unique or broke or total or capture.seen_any()):
        return []  # Dynamo imported (torch.optim does) but nothing compiled: no record
    return [CompileCountersRecord(unique, broke, total, capture.recompiles()).to_raw()]
