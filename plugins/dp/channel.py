"""How DataLoader workers send their timings to the process that owns the loader.

One Unix ``SOCK_SEQPACKET`` listener per profiled process, opened just before its first
multi-worker iterator starts its workers.  Its address travels in ``JOBPROF_DP_CHANNEL``
(inherited by forked and spawned workers alike) together with the owner's pid, so a worker only
ever talks to its own parent.  Each worker connects once; sequenced packets keep message
boundaries (no framing), and a connected socket is bounded by its buffer size (~200 KB, some
thousands of records) rather than by ``net.unix.max_dgram_qlen`` (often 10) as an unconnected
datagram socket is.  A worker never blocks: when the buffer is full the record is dropped and
counted (the count rides on the next record), so a slow receiver cannot slow the workers.
Nothing is written to disk: worker records join the owner's raw store through its
``jobprof_iteration_end``, so there is never a second PROF_ directory.
"""

from __future__ import annotations

import os
import secrets
import selectors
import socket
import sys
import tempfile
import threading
from collections.abc import Callable

ENV = "JOBPROF_DP_CHANNEL"
_MAX_DATAGRAM = 512
#: how often the receiver thread takes what the workers sent
POLL_S = 0.05


def _address() -> str:
    token = f"jobprof-dp-{os.getpid()}-{secrets.token_hex(6)}"
    if sys.platform.startswith("linux"):
        return "\0" + token  # abstract namespace: nothing on disk to clean up
    return os.path.join(tempfile.gettempdir(), token + ".sock")


class Receiver:
    """The owner's end: a daemon thread accepts workers and hands every record to ``on_message``."""

    def __init__(self, on_message: Callable[[bytes], None]) -> None:
        self._on_message = on_message
        self.address = _address()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.bind(self.address)
        self._sock.listen(256)
        self._sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._poll_lock = threading.Lock()  # the thread and drain() callers share the selector
        os.environ[ENV] = f"{os.getpid()}:{self.address.lstrip(chr(0))}:{int(self.address[0] == chr(0))}"
        self._thread = threading.Thread(target=self._run, name="jobprof-dp-receiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # wake on a timer, not per record: a wake per batch would ask the training thread for
        # the GIL twice a step; the socket buffer holds some hundreds of records meanwhile
        while not self._stop.wait(POLL_S):
            self.drain()

    def drain(self) -> None:
        """Take everything the workers have sent so far (any thread; one at a time)."""
        with self._poll_lock:
            while self._poll(0):
                pass

    def _poll(self, timeout: float) -> bool:
        """Serve what is ready; True if anything was."""
        try:
            ready = self._selector.select(timeout)
        except (OSError, ValueError):
            self._stop.set()
            return False
        for key, _ in ready:
            sock = key.fileobj
            if sock is self._sock:
                try:
                    conn, _ = self._sock.accept()
                except OSError:
                    continue
                conn.setblocking(False)
                self._selector.register(conn, selectors.EVENT_READ)
                continue
            try:
                while True:
                    data = sock.recv(_MAX_DATAGRAM)
                    if not data:  # the worker exited
                        self._selector.unregister(sock)
                        sock.close()
                        break
                    try:
                        self._on_message(data)
                    except Exception:
                        pass  # a malformed record must not end the thread
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._selector.unregister(sock)
                sock.close()
        return bool(ready)

    def close(self) -> None:
        """Stop the thread, take what the workers already sent, release the socket."""
        self._stop.set()
        self._thread.join(1 + POLL_S)
        self.drain()
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()
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
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.connect(address)
        except OSError:
            self._sock.close()
            raise
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
            self._sock.send(data, socket.MSG_DONTWAIT)
        except OSError:  # buffer full (EAGAIN) or the owner is gone
            self.dropped += 1
