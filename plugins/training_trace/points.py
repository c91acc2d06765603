"""fp_point / bp_point: resolve module names and time them, without touching other modules.

A point names a module by its qualified path inside a root module (``encoder.layers.0``) or by
class name (``Linear``: every instance counts).  FP Start is the first forward of a matching
module in the iteration; BP End the last time a gradient for it was produced (parameter
gradient accumulated, or gradient of an input computed).  Tensor-level hooks are used instead
of module backward hooks because those break in-place operations in user models.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Any

from jobprof.plugin import Iteration, StepPointsRecord

_now = time.monotonic_ns
#: hits remembered while no iteration takes them
MAX_PENDING = 100_000


class PointCollector:
    def __init__(self, fp_point: str, bp_point: str) -> None:
        self.fp_point, self.bp_point = fp_point or "", bp_point or ""
        # hit times not yet handed over, in time order; take() (on the core's sink thread)
        # serves each iteration by time range and pops what it used; maxlen bounds a session
        # whose hand-overs stopped (disk full): the oldest hits go first
        self._fp_hits: deque[int] = deque(maxlen=MAX_PENDING)
        self._bp_hits: deque[int] = deque(maxlen=MAX_PENDING)
        self._handles: list[Any] = []
        self._roots: weakref.WeakSet = weakref.WeakSet()
        self.fp_matches = 0
        self.bp_matches = 0

    # -- resolution (once per root module) -------------------------------------------------
    def on_root(self, root: Any) -> None:
        if not (self.fp_point or self.bp_point) or root in self._roots:
            return
        self._roots.add(root)
        for name, module in root.named_modules():
            if self.fp_point and _matches(self.fp_point, name, module):
                self._handles.append(module.register_forward_pre_hook(self._on_fp))
                self.fp_matches += 1
            if self.bp_point and _matches(self.bp_point, name, module):
                self._watch_backward(module)
                self.bp_matches += 1

    def _watch_backward(self, module: Any) -> None:
        for param in module.parameters(recurse=True):
            if param.requires_grad and hasattr(param, "register_post_accumulate_grad_hook"):
                self._handles.append(param.register_post_accumulate_grad_hook(self._on_bp))
        self._handles.append(module.register_forward_hook(self._hook_inputs))

    def _hook_inputs(self, module: Any, args: Any, output: Any) -> None:
        for arg in args:
            if getattr(arg, "requires_grad", False) and getattr(arg, "grad_fn", None) is not None:
                arg.register_hook(self._on_bp)

    # -- hot path --------------------------------------------------------------------------
    def _on_fp(self, *_: Any) -> None:
        self._fp_hits.append(_now())

    def _on_bp(self, *_: Any) -> None:
        self._bp_hits.append(_now())

    # -- per iteration ---------------------------------------------------------------------
    def take(self, iteration: Iteration) -> list[dict[str, Any]]:
        """The iteration's step-trace record (one consumer, iterations in order; the hooks
        only append, so popping what ended by the iteration's end is thread-safe)."""
        lo, hi = iteration.start_ns, iteration.end_ns
        fp_own = bp_own = None
        hits = self._fp_hits
        while hits and hits[0] <= hi:
            t = hits.popleft()
            if t >= lo and fp_own is None:
                fp_own = t  # the first forward of the point in the iteration
        hits = self._bp_hits
        while hits and hits[0] <= hi:
            t = hits.popleft()
            if t >= lo:
                bp_own = t  # the last gradient of the point in the iteration
        return [StepPointsRecord(
            fp_own if fp_own is not None else iteration.fp_start_ns,
            bp_own if bp_own is not None else iteration.bp_end_ns,
            "fp_point" if fp_own is not None else "auto",
            "bp_point" if bp_own is not None else "auto",
        ).to_raw()]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def unmatched(self) -> list[str]:
        notes = []
        for key, value, count in (("fp_point", self.fp_point, self.fp_matches),
                                  ("bp_point", self.bp_point, self.bp_matches)):
            if value and not count:
                notes.append(f"{key} {value!r} matched no module (use a module path such as "
                             f"'encoder.0' or a class name such as 'Linear'); the automatic "
                             f"{'FP Start' if key == 'fp_point' else 'BP End'} was used")
        return notes


def _matches(point: str, name: str, module: Any) -> bool:
    return point == name or point == type(module).__name__
