"""How DataLoader workers send their timings to the process that owns the loader.

One Unix datagram socket per profiled process, created just before its first multi-worker
iterator starts its workers.  Its address travels in ``JOBPROF_DP_CHANNEL`` (inherited by
forked and spawned workers alike) together with the owner's pid, so a worker only ever talks
to its own parent.  Datagrams keep message boundaries, need no framing and no lock, and a
worker never blocks on them: when the owner's buffer is full the record is dropped and
counted (the count rides on the next record), so a slow receiver cannot slow the workers.
Nothing is written to disk: worker records join the owner's raw store through its
``jobprof_iteration_end``, so there is never a second PROF_ directory.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import tempfile
import threading
from collections.abc import Callable

ENV = "JOBPROF_DP_CHANNEL"
_MAX_DATAGRAM = 512


def _address() -> str:
    token = f"jobprof-dp-{os.getpid()}-{secrets.token_hex(6)}"
    if sys.platform.startswith("linux"):
        return "\0" + token  # abstract namespace: nothing on disk to clean up
    return os.path.join(tempfile.gettempdir(), token + ".sock")


class Receiver:
    """The owner's end: a daemon thread hands every datagram to ``on_message``."""

    def __init__(self, on_message: Callable[[bytes], None]) -> None:
        self._on_message = on_message
        self.address = _address()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.address)
        self._sock.settimeout(0.2)  # lets close() stop the thread without a wake-up message
        self._stop = threading.Event()
        os.environ[ENV] = f"{os.getpid()}:{self.address.lstrip(chr(0))}:{int(self.address[0] == chr(0))}"
        self._thread = threading.Thread(target=self._run, name="jobprof-dp-receiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        recv = self._sock.recv
        while not self._stop.is_set():
            try:
                data = recv(_MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                self._on_message(data)
            except Exception:
                pass  # a malformed datagram must not end the thread

    def drain(self) -> None:
        """Hand over what is already queued (at session end, after the workers' last sends)."""
        self._sock.setblocking(False)
        try:
            while True:
                self._on_message(self._sock.recv(_MAX_DATAGRAM))
        except (BlockingIOError, OSError):
            pass
        finally:
            self._sock.settimeout(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)
        self.drain()
        self._sock.close()
        if os.environ.get(ENV, "").startswith(f"{os.getpid()}:"):
            del os.environ[ENV]
        if not self.address.startswith("\0"):
            try:
                os.unlink(self.address)
            except OSError:
                pass


class Sender:
    """A worker's end.  ``send`` never blocks and never raises."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dropped = 0

    @classmethod
    def for_this_worker(cls) -> Sender | None:
        """A sender to the parent's receiver, or None if the parent does not listen."""
        owner, _, rest = os.environ.get(ENV, "").partition(":")
        path, _, abstract = rest.rpartition(":")
        if not owner.isdigit() or int(owner) != os.getppid() or not path:
            return None
        try:
            return cls("\0" + path if abstract == "1" else path)
        except OSError:
            return None

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendto(data, socket.MSG_DONTWAIT, self._address)
        except OSError:  # buffer full (EAGAIN) or the owner is gone
            self.dropped += 1
