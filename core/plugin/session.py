"""What a plugin sees of the running session: :class:`PluginSession`.

The session (``jobprof.runtime.session.Session``) has more inside -- its state machine, the
sink, the step detector -- but hooks receive it typed as this protocol, so a plugin's type
checker tells it when it reaches past the contract.  Every member is documented in
docs/hooks.md (section 3.3) and exercised by the built-in plugins.

Example::

    from jobprof.plugin import PluginSession, hookimpl

    @hookimpl
    def jobprof_session_start(session: PluginSession) -> None:
        session.attach("gc", GcCollector(origin_ns=session.anchor.monotonic_ns))
        session.set_info("gc", {"available": True})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from jobprof.plugin.clock import ClockAnchor
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.values import Config


@runtime_checkable
class PluginSession(Protocol):
    """The plugin-facing API of the session, as hooks receive it."""

    #: the validated, effective options
    config: Config
    #: jobprof's one voice on stderr: ``warning(text)``, ``error(text)``, ``once_per_job(...)``
    reporter: Reporter
    #: this process's clock pair (monotonic ns <-> wall ns) taken when the session started
    anchor: ClockAnchor

    def attach(self, name: str, obj: Any) -> None:
        """Keep a plugin's per-run object (its collector) on the session under ``name``."""

    def attached(self, name: str) -> Any:
        """The object attached under ``name``, or None."""

    def when_imported(self, name: str, callback: Callable[[Any], None]) -> None:
        """Call ``callback(module)`` once the program imports module ``name`` (at once if it
        already has): how a plugin hooks into a library without importing it first."""

    def on_root_module(self, listener: Callable[[Any], None], what: str = "") -> None:
        """Call ``listener(module)`` for every module first seen as a root forward; its time is
        recorded as jobprof's own (``what`` names it in info.json)."""

    def record_own(self, start_ns: int, end_ns: int, what: str = "") -> None:
        """Record jobprof's own work (monotonic ns): shown as jobprof's, never as the job's."""

    def request_ops(self, shapes: bool = False, cupti_metrics: tuple[str, ...] = ()) -> None:
        """Ask for the operators of every iteration (the core stream ``ops``)."""

    def request_op_memory(self) -> None:
        """When the operator capture runs (some plugin, in any order, called
        :meth:`request_ops`), record the allocators' allocations and frees with it: the core
        stream ``op_memory`` (:class:`~jobprof.plugin.MemoryEvent` records, each iteration's,
        read back like ``ops``), and every module call (:meth:`module_calls`).  Costs a
        record per allocation.  Alone it starts no capture."""

    def module_calls(self) -> Any:
        """The recorder of module calls, when the session records them (the operator capture
        runs with :meth:`request_op_memory`), else None.  Its ``take(iteration)`` gives the
        calls (outside compiled regions) that started in the iteration as ``[start_ns,
        end_ns, native thread id, module path]`` lists (the path in its root model,
        ``Net.encoder.layers.0``), e.g. as a deferred stream of ``jobprof_iteration_end``.
        ~0.3 us per module call while on."""

    def set_info(self, key: str, value: Any) -> None:
        """Record a JSON-serialisable fact under ``key`` in the ``jobprof`` section of this
        device's ``info.json`` (e.g. which counter source a plugin used, or why none)."""

    def get_info(self, key: str) -> Any:
        """A fact set with :meth:`set_info` in this process (by any plugin), or None."""
