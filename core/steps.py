"""Finds training iterations in an unchanged PyTorch program.

Preference order (the first one seen wins over the ones below it):

1. ``explicit``: the script calls ``jobprof.step()``;
2. ``optimizer_step``: the post-step hook of one designated optimizer (the first that steps);
   gradient accumulation falls out naturally, GradScaler-skipped steps still end an iteration
   (marked ``skipped``), and ``step(closure)`` optimizers end when the closure's step returns;
3. ``backward``: ``torch.autograd.backward`` calls, when no optimizer ever steps;
4. ``forward``: the root module's forward, for inference loops.

Boundaries of the two lower methods are tentative: until an optimizer steps, the detector
holds up to ``PENDING_LIMIT`` tentative segments (a few timestamps each), so a gradient-
accumulation window or the first optimizer step merges them into one iteration.  After that
limit, or at exit, the lower method is confirmed.

Hot-path cost: module hooks are global only until the first iteration is final, then they
move onto the root modules seen so far (submodules go back to PyTorch's fast path).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import attrs

from jobprof.types import Iteration

PENDING_LIMIT = 16
_now = time.monotonic_ns


@attrs.define
class _Segment:
    """Timestamps of one tentative (or open) stretch of work."""

    fp_grad: int | None = None  # first root forward with grad enabled
    fp_any: int | None = None  # first root forward
    bp_end: int | None = None  # end of the last backward
    fwd_end: int | None = None  # end of the last root forward
    end: int | None = None  # tentative boundary
    backwards: int = 0
    skipped: bool = False
    root_ids: set[int] = attrs.field(factory=set)  # roots whose forward ran in this stretch

    def fp(self) -> int | None:
        return self.fp_grad if self.fp_grad is not None else self.fp_any


class StepDetector:
    """Turns forward/backward/optimizer events into finished :class:`Iteration` records."""

    def __init__(self, emit: Callable[[Iteration], None]) -> None:
        self._emit = emit
        self._lock = threading.RLock()
        self._local = threading.local()
        self.mode: str | None = None
        #: the main script mentions jobprof.step(): hold automatic boundaries as tentative
        #: until the first explicit call (or PENDING_LIMIT of them pass without one)
        self.expect_explicit = False
        self._tentative_optimizer = False
        self.index = 0
        self._last_end: int | None = None
        self._pending: list[_Segment] = []
        self._current = _Segment()
        self._designated: Any = None  # weakref to the designated optimizer
        self.optimizer_steps = 0
        self.roots: weakref.WeakSet = weakref.WeakSet()
        self._root_ids: set[int] = set()
        self._grad_enabled: Callable[[], bool] = lambda: True
        self.root_listeners: list[Callable[[Any], None]] = []
        self._handles: list[Any] = []
        self._root_handles: list[Any] = []
        self._restore: list[Callable[[], None]] = []
        self._global_hooks = False

    # -- installation ----------------------------------------------------------------------
    def install(self) -> None:
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_mod

        self._grad_enabled = torch.is_grad_enabled

        self._handles.append(nn_module.register_module_forward_pre_hook(self._global_pre))
        try:
            post = nn_module.register_module_forward_hook(self._global_post, always_call=True)
        except TypeError:  # torch < 2.1
            post = nn_module.register_module_forward_hook(self._global_post)
        self._handles.append(post)
        self._global_hooks = True
        self._handles.append(optim_mod.register_optimizer_step_post_hook(self._optimizer_post))

        original_backward = torch.autograd.backward
        detector = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            start = _now()
            try:
                return original_backward(*args, **kwargs)
            finally:
                detector.on_backward(start, _now())

        backward.__wrapped__ = original_backward  # type: ignore[attr-defined]
        torch.autograd.backward = backward
        self._restore.append(lambda: setattr(torch.autograd, "backward", original_backward))

        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is not None:
            original_step = scaler_cls.step

            def scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
                before = detector.optimizer_steps
                try:
                    return original_step(scaler, optimizer, *args, **kwargs)
                finally:
                    if detector.optimizer_steps == before:  # inf/NaN grads: step skipped
                        detector.on_optimizer_step(optimizer, _now(), skipped=True)

            scaler_cls.step = scaler_step
            self._restore.append(lambda: setattr(scaler_cls, "step", original_step))

    def uninstall(self) -> None:
        for handle in self._handles + self._root_handles:
            handle.remove()
        self._handles.clear()
        self._root_handles.clear()
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()

    def _move_hooks_to_roots(self) -> None:
        """After the first final iteration: hook only the known root modules."""
        if not self._global_hooks:
            return
        self._global_hooks = False
        for handle in self._handles[:2]:
            handle.remove()
        del self._handles[:2]
        for root in list(self.roots):
            self._root_handles.append(root.register_forward_pre_hook(self._global_pre))
            try:
                self._root_handles.append(root.register_forward_hook(self._global_post, always_call=True))
            except TypeError:
                self._root_handles.append(root.register_forward_hook(self._global_post))

    # -- hook callbacks (hot path) ---------------------------------------------------------
    def _global_pre(self, module: Any, args: Any) -> None:
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if depth == 0:
            self.on_forward_start(module, _now())

    def _global_post(self, module: Any, args: Any, output: Any) -> None:
        local = self._local
        depth = getattr(local, "depth", 1) - 1
        local.depth = depth
        if depth == 0:
            self.on_forward_end(_now())

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.on_optimizer_step(optimizer, _now())

    # -- events ----------------------------------------------------------------------------
    def on_forward_start(self, module: Any, ts: int) -> None:
        grad = self._grad_enabled()
        with self._lock:
            if id(module) not in self._root_ids:  # ids: cheaper than WeakSet lookups per step
                self._root_ids.add(id(module))
                self.roots.add(module)
                for listener in self.root_listeners:
                    listener(module)
            if self.mode not in ("explicit", "optimizer_step") and not self._tentative_optimizer:
                self._maybe_cut_tentative(id(module))
            seg = self._current
            seg.root_ids.add(id(module))
            if seg.fp_any is None:
                seg.fp_any = ts
            if grad and seg.fp_grad is None:
                seg.fp_grad = ts

    def on_forward_end(self, ts: int) -> None:
        with self._lock:
            self._current.fwd_end = ts

    def on_backward(self, start: int, end: int) -> None:
        with self._lock:
            if (self.mode not in ("explicit", "optimizer_step") and not self._tentative_optimizer
                    and self._current.backwards):
                # a second backward with no root forward in between (a forward would have cut)
                self._cut(self._current.bp_end)
            self._current.bp_end = end
            self._current.backwards += 1

    def on_optimizer_step(self, optimizer: Any, ts: int, skipped: bool = False) -> None:
        with self._lock:
            if not skipped:
                self.optimizer_steps += 1
            designated = self._designated() if self._designated is not None else None
            if designated is None:
                self._designated = weakref.ref(optimizer)
            elif designated is not optimizer:
                return
            if self.mode == "explicit":
                return
            if self.expect_explicit:
                self._tentative_optimizer = True
                self._current.skipped = skipped
                self._cut(ts)
                if len(self._pending) >= PENDING_LIMIT:
                    self._confirm_pending()
                return
            self.mode = "optimizer_step"
            self._finish_window(ts, "optimizer_step", skipped)

    def explicit(self) -> None:
        ts = _now()
        with self._lock:
            self.mode = "explicit"
            self.expect_explicit = False
            self._finish_window(ts, "explicit", False)

    def flush(self) -> None:
        """At session end: confirm tentative segments; an unfinished window is dropped."""
        with self._lock:
            if self.mode in ("explicit", "optimizer_step"):
                return
            if not self._tentative_optimizer:
                self._maybe_cut_tentative(None)
            self._confirm_pending()

    # -- window bookkeeping ----------------------------------------------------------------
    def _maybe_cut_tentative(self, root: int | None) -> None:
        """A forward after a backward, or a root forward called again, closes a stretch."""
        seg = self._current
        if seg.backwards and seg.bp_end is not None:
            self._cut(seg.bp_end)
        elif (seg.fwd_end is not None and self.mode != "backward"
              and (root is None or root in seg.root_ids)):
            self._cut(seg.fwd_end)
        if len(self._pending) >= PENDING_LIMIT:
            self._confirm_pending()

    def _cut(self, end: int) -> None:
        self._current.end = end
        self._pending.append(self._current)
        self._current = _Segment()

    def _confirm_pending(self) -> None:
        if not self._pending:
            return
        if self._tentative_optimizer:
            self.mode = "optimizer_step"
        elif self.mode is None:
            self.mode = "backward" if any(s.backwards for s in self._pending) else "forward"
        self.expect_explicit = False
        pending, self._pending = self._pending, []
        for seg in pending:
            self._finalize(seg, seg.end, self.mode, seg.skipped)

    def _finish_window(self, end: int, method: str, skipped: bool) -> None:
        merged = _Segment()
        for seg in [*self._pending, self._current]:
            merged.fp_grad = merged.fp_grad if merged.fp_grad is not None else seg.fp_grad
            merged.fp_any = merged.fp_any if merged.fp_any is not None else seg.fp_any
            merged.bp_end = seg.bp_end if seg.bp_end is not None else merged.bp_end
            merged.backwards += seg.backwards
        self._pending, self._current = [], _Segment()
        self._finalize(merged, end, method, skipped)

    def _finalize(self, seg: _Segment, end: int, method: str, skipped: bool) -> None:
        fp = seg.fp()
        start = self._last_end if self._last_end is not None else (fp if fp is not None else end)
        bp = seg.bp_end if seg.bp_end is not None and (fp is None or seg.bp_end >= fp) else None
        self.index += 1
        self._last_end = end
        iteration = Iteration(self.index, start, end, method, fp, bp, skipped)
        if self.index == 1:
            self._move_hooks_to_roots()
        self._emit(iteration)
