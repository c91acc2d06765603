"""How DataLoader workers send their timings to the process that owns the loader.

dp's use of the plugin API's authenticated channel (:mod:`jobprof.plugin.channel`) under the name ``dp``:
one listener per profiled process, opened just before its first multi-worker iterator starts
its workers; its address travels in ``JOBPROF_DP_CHANNEL`` with the owner's pid, so a worker
only ever talks to its own parent (or, for forkserver workers, its grandparent).  The receiver
takes connections only from this process's own descendants with its uid (``SO_PEERCRED``), and
every record is validated again by :func:`jobprof.plugins.dp.fetch.parse`.  Nothing is written
to disk: worker records join the owner's raw store through its ``jobprof_iteration_end``, so
there is never a second PROF_ directory.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from jobprof.plugin import channel

POLL_S = channel.POLL_S
Peer = channel.Peer

NAME = "dp"
ENV = channel.env_var(NAME)
#: a record is 8 integers of at most 20 digits: well under this
MAX_MESSAGE = 512

__all__ = ["ENV", "MAX_MESSAGE", "NAME", "POLL_S", "Peer", "Receiver", "Sender"]


class Receiver(channel.Receiver):
    """dp's receiver.  ``on_message(data)``, or ``on_message(data, peer)`` with ``with_peer``."""

    def __init__(self, on_message: Callable[..., None], *, with_peer: bool = False,
                 known_pids: Callable[[], Collection[int]] | None = None) -> None:
        def deliver(data: bytes, peer: Peer) -> None:
            on_message(data, peer) if with_peer else on_message(data)

        super().__init__(NAME, deliver, max_message=MAX_MESSAGE, known_pids=known_pids)


class Sender(channel.Sender):
    """A worker's end (never blocks, never raises)."""

    @classmethod
    def for_this_worker(cls) -> Sender | None:
        """A sender to the receiver of the process that owns this worker's loader, or None."""
        return cls.for_owner(NAME)  # type: ignore[return-value]
