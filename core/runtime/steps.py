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
limit, or at exit, the lower method is confirmed.  While an optimizer's ``step`` runs (LBFGS
evaluates its closure many times inside one step), nothing is cut or confirmed: the step's own
end decides.

Nothing of jobprof is reachable from the program's objects (do no harm): no hook on any module
instance (they would be pickled by ``torch.save(model)`` and copied by ``deepcopy``) and no
global module hook (torch.compile warns about those, traces them and recompiles when they go).
Root forwards are seen by wrapping ``torch.nn.Module.__call__`` on the class, once: a module
call costs one more Python frame (~0.5 us here), and while dynamo traces (``is_compiling()``)
the wrapper is plain delegation, so compiled graphs, guards and counters are unchanged.  A
root forward inside a compiled region is therefore not seen (its iteration has no FP Start).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs

from jobprof.plugin.frames import hide_frame
from jobprof.plugin.values import Iteration
from jobprof.runtime.torch_import import when_imported

PENDING_LIMIT = 16
#: module calls kept waiting for their iteration (a loop no iteration ends keeps the latest)
KEEP_CALLS = 200_000
_now = time.monotonic_ns


def _forked(ref: weakref.ref) -> None:
    """In a forked child (a DataLoader worker runs modules too) the detector only delegates."""
    detector = ref()
    if detector is not None:
        detector.live = False


class ModuleCalls:
    """The span of every module call (outside compiled regions), with the module's path in
    its root model (``Net.encoder.layers.0``; a module no root holds: its class name).

    The wrapper appends ``(start, end, thread, path)`` as each call returns (a deque append is
    atomic: any thread); :meth:`take` hands an iteration the calls that started in it, as
    ``[start_ns, end_ns, native thread id, path]`` lists.  ~0.3 us per module call."""

    def __init__(self) -> None:
        self._calls: deque[tuple[int, int, int, str]] = deque(maxlen=KEEP_CALLS)
        #: the paths of the root models' modules, by id (a module no root holds: its class name,
        #: not kept: a program that builds modules as it goes does not grow this)
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, module: Any, start: int, end: int) -> None:
        path = self._paths.get(id(module)) or type(module).__name__
        self._calls.append((start, end, threading.get_native_id(), path))

    def name_root(self, root: Any) -> None:
        """Learn the paths of ``root``'s submodules (a root-module listener)."""
        prefix = type(root).__name__
        for name, sub in root.named_modules():
            self._paths[id(sub)] = f"{prefix}.{name}" if name else prefix

    def take(self, iteration: Iteration) -> list[list[Any]]:
        """The calls that started before the iteration's end (those before its start are
        dropped: an earlier iteration took them, or none did)."""
        out = []
        with self._lock:
            calls = self._calls
            for _ in range(len(calls)):
                call = calls[0]
                if call[0] >= iteration.end_ns:
                    calls.rotate(-1)  # a call that started later but ended first: keep it
                    continue
                calls.popleft()
                if call[0] >= iteration.start_ns:
                    out.append(list(call))
        out.sort()
        return out


@attrs.define
class _Segment:
    """Timestamps of one tentative (or open) stretch of work."""

    fp_grad: int | None = None  # first root forward with grad enabled
    fp_any: int | None = None  # first root forward
    bp_end: int | None = None  # end of the last backward
    fwd_end: int | None = None  # end of the last root forward
    end: int | None = None  # tentative boundary
    data_start: int | None = None  # first DataLoader next() after this stretch's work
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
        self._restore: list[Callable[[], None]] = []
        #: inside an optimizer's step (between its pre and post hooks)
        self._stepping = False
        #: False once uninstalled, and in a forked child (a DataLoader worker runs modules too)
        self.live = True
        #: records every module call's span when set (a plugin asked: PluginSession.module_calls)
        self.module_calls: ModuleCalls | None = None
        os.register_at_fork(after_in_child=partial(_forked, weakref.ref(self)))
        #: the code objects of our wrappers, which dynamo must never compile as frames
        self._codes: list[tuple[Any, bool]] = []
        for method in (self.on_forward_start, self.on_forward_end, self.on_backward, self.on_data_start,
                       self.on_optimizer_step, self._optimizer_pre, self._optimizer_post):
            self._codes.append((method.__code__, True))

    # -- installation ----------------------------------------------------------------------
    #: the mechanisms :meth:`install` puts in place, by name (``bench/mechanisms.py`` times each alone)
    MECHANISMS = ("module_call", "optimizer_hook", "backward", "grad_scaler")

    def install(self, only: tuple[str, ...] = MECHANISMS) -> None:
        import torch

        self._grad_enabled = torch.is_grad_enabled
        # dynamo compiles every new Python frame run inside a compiled function (after a graph
        # break too): it must skip ours, as it skips torch's own, or it counts frames and graph
        # breaks the program does not have (its frames inside ours are treated as before)
        when_imported("torch._dynamo", self._skip_in_dynamo)
        is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        if "module_call" in only:
            self._wrap_module_call(torch.nn.Module, is_compiling)
        if "optimizer_hook" in only:
            from torch.optim import optimizer as optim_mod

            self._handles.append(optim_mod.register_optimizer_step_pre_hook(self._optimizer_pre))
            self._handles.append(optim_mod.register_optimizer_step_post_hook(self._optimizer_post))
        if "backward" in only:
            self._wrap_backward(torch, is_compiling)
        if "grad_scaler" in only:
            self._wrap_scaler(torch)

    def _wrap_backward(self, torch: Any, is_compiling: Callable[[], bool]) -> None:
        original_backward = torch.autograd.backward
        detector = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():  # traced by dynamo: torch's own call, nothing of ours in the graph
                return original_backward(*args, **kwargs)
            start = _now()
            try:
                return original_backward(*args, **kwargs)
            except BaseException as exc:
                hide_frame(exc)
                raise
            finally:
                detector.on_backward(start, _now())

        self._own_code(backward)
        backward.__wrapped__ = original_backward  # type: ignore[attr-defined]
        torch.autograd.backward = backward
        self._restore.append(lambda: setattr(torch.autograd, "backward", original_backward))

    def _wrap_scaler(self, torch: Any) -> None:
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is None:
            return
        original_step = scaler_cls.step
        detector = self

        def scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = detector.optimizer_steps
            try:
                return original_step(scaler, optimizer, *args, **kwargs)
            except BaseException as exc:
                hide_frame(exc)
                raise
            finally:
                if detector.optimizer_steps == before:  # inf/NaN grads: step skipped
                    detector.on_optimizer_step(optimizer, _now(), skipped=True)

        self._own_code(scaler_step)
        scaler_cls.step = scaler_step
        self._restore.append(lambda: setattr(scaler_cls, "step", original_step))

    def _skip_in_dynamo(self, dynamo: Any, codes: list[tuple[Any, bool]] | None = None) -> None:
        """Dynamo never compiles our frames: a wrapper's (the torch frames it calls are treated
        as before) and the detector's event methods' (with everything they call: jobprof's)."""
        try:
            from torch._dynamo.types import FrameAction, FrameExecStrategy

            strategy = {nested: FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP if nested
                                                  else FrameAction.DEFAULT) for nested in (True, False)}
            for code, nested in self._codes if codes is None else codes:
                dynamo.eval_frame.set_code_exec_strategy(code, strategy[nested])
        except Exception:  # a torch without these (private) calls: dynamo may count our frames
            pass

    def _wrap_module_call(self, cls: Any, is_compiling: Callable[[], bool]) -> None:
        """Every module call passes through here; the outermost one is a root forward.  With
        :attr:`module_calls` set, every call's span is recorded too."""
        original = cls.__dict__["__call__"]
        local, detector = self._local, self

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if is_compiling():  # dynamo inlines this: it must see torch's own call and nothing else
                return original(module, *args, **kwargs)
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            calls = detector.module_calls
            if depth or not detector.live:
                if calls is None or not detector.live:
                    try:
                        return original(module, *args, **kwargs)
                    except BaseException as exc:
                        hide_frame(exc)
                        raise
                    finally:
                        local.depth = depth
                start = _now()
                try:
                    return original(module, *args, **kwargs)
                except BaseException as exc:
                    hide_frame(exc)
                    raise
                finally:
                    local.depth = depth
                    calls.add(module, start, _now())
            detector.on_forward_start(module, _now())
            start = _now()
            try:
                return original(module, *args, **kwargs)
            except BaseException as exc:
                hide_frame(exc)
                raise
            finally:
                local.depth = depth
                end = _now()
                if calls is not None:
                    calls.add(module, start, end)
                detector.on_forward_end(end)

        self._replace(cls, "__call__", original, __call__)

    def wrap_data_next(self, torch: Any) -> None:
        """A DataLoader's ``next()`` is data loading, whatever modules it calls (transforms are
        modules too): no root forward inside it.  Its start is where a stretch found by backward
        or forward ends, when it comes before the next root forward.

        Installed after the plugins' collectors (the session calls it after
        ``jobprof_session_start``), so it is the outermost wrapper: the boundary is stamped
        before dp's request stamp, and dp's batch lands in the iteration that waited for it.
        """
        cls = getattr(getattr(torch.utils.data, "dataloader", None), "_BaseDataLoaderIter", None)
        if cls is None or "__next__" not in cls.__dict__:
            return
        original = cls.__dict__["__next__"]
        local, detector = self._local, self

        def __next__(it: Any) -> Any:
            depth = getattr(local, "depth", 0)
            if not depth and detector.live:
                detector.on_data_start(_now())
            local.depth = depth + 1
            try:
                return original(it)
            except BaseException as exc:
                hide_frame(exc)
                raise
            finally:
                local.depth = depth

        self._replace(cls, "__next__", original, __next__)

    def _replace(self, cls: Any, name: str, original: Any, wrapper: Any) -> None:
        self._own_code(wrapper)
        wrapper.__wrapped__ = original
        wrapper.__qualname__ = original.__qualname__
        setattr(cls, name, wrapper)

        def restore() -> None:
            # put torch's back only if nobody wrapped ours since (a plugin restores later, to
            # ours, which then only delegates: ``live`` is False)
            if cls.__dict__.get(name) is wrapper:
                setattr(cls, name, original)

        self._restore.append(restore)

    def uninstall(self) -> None:
        self.live = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()

    def _own_code(self, fn: Callable[..., Any], nested: bool = False) -> None:
        entry = (fn.__code__, nested)
        self._codes.append(entry)
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:  # imported already: skip it now
            self._skip_in_dynamo(dynamo, [entry])

    # -- hook callbacks (hot path) ---------------------------------------------------------
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepping = True  # a closure's forwards and backwards belong to this step

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepping = False
        self.on_optimizer_step(optimizer, _now())

    # -- events ----------------------------------------------------------------------------
    def on_forward_start(self, module: Any, ts: int) -> None:
        grad = self._grad_enabled()
        with self._lock:
            if id(module) not in self._root_ids:  # ids: cheaper than WeakSet lookups per step
                self._root_ids.add(id(module))
                self.roots.add(module)
                if self.root_listeners:
                    for listener in self.root_listeners:
                        listener(module)
                    # what the listeners did (a calibration, starting a capture) is jobprof's
                    # work: the forward starts after it
                    ts = _now()
            if not self._holds_cuts() and self._maybe_cut_tentative(id(module), ts):
                ts = _now()  # the hand-over of what was cut is jobprof's, not this forward's
            seg = self._current
            seg.root_ids.add(id(module))
            if seg.fp_any is None:
                seg.fp_any = ts
            if grad and seg.fp_grad is None:
                seg.fp_grad = ts

    def on_data_start(self, ts: int) -> None:
        with self._lock:
            seg = self._current
            if seg.data_start is None and (seg.backwards or seg.fwd_end is not None):
                seg.data_start = ts

    def on_forward_end(self, ts: int) -> None:
        with self._lock:
            self._current.fwd_end = ts

    def on_backward(self, start: int, end: int) -> None:
        with self._lock:
            if not self._holds_cuts() and self._current.backwards:
                # a second backward with no root forward in between (a forward would have cut)
                assert self._current.bp_end is not None  # set with every backwards += 1
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
    def _holds_cuts(self) -> bool:
        """Forwards and backwards do not cut: an optimizer (or jobprof.step()) decides, or will
        when the step now running returns."""
        return self.mode in ("explicit", "optimizer_step") or self._tentative_optimizer or self._stepping

    def _maybe_cut_tentative(self, root: int | None, ts: int | None = None) -> bool:
        """A forward after a backward, or a root forward called again, closes a stretch; True
        when iterations were emitted.

        The stretch ends where the next one's work begins: at its first DataLoader ``next()``,
        else at this forward (``ts``), so what the loop did after the backward (a hand-written
        update, zero_grad, logging) stays in its iteration; at exit (``ts`` None) it ends with
        its last backward or forward.
        """
        seg = self._current
        if seg.backwards and seg.bp_end is not None:
            self._cut(seg.data_start or ts or seg.bp_end)
        elif (seg.fwd_end is not None and self.mode != "backward"
              and (root is None or root in seg.root_ids)):
            self._cut(seg.data_start or ts or seg.fwd_end)
        if len(self._pending) >= PENDING_LIMIT or (self.mode in ("backward", "forward") and self._pending):
            index = self.index
            self._confirm_pending()
            return self.index != index
        return False

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
            assert seg.end is not None  # _cut set it when it queued the segment
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
        self._emit(Iteration(self.index, start, end, method, fp, bp, skipped))
