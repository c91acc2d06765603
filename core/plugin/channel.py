"""An authenticated record channel from helper processes (DataLoader workers, ...) to their owner.

Any plugin whose collector runs in other processes of the job uses it: the owner opens a
:class:`Receiver` under a name, before it starts the helpers; its address travels in
``JOBPROF_<NAME>_CHANNEL`` (inherited by forked and spawned children alike) with the owner's
pid; a helper opens a :class:`Sender` from that variable.

Transport: one Unix ``SOCK_SEQPACKET`` listener per owner (abstract namespace on Linux, nothing
on disk).  Sequenced packets keep message boundaries (no framing), a connected socket is bounded
by its buffer (~200 KB) rather than by ``net.unix.max_dgram_qlen``, and a sender never blocks: a
record that would block is dropped and counted by the sender.

Trust: an abstract socket is visible in ``/proc/net/unix`` and connectable by any local user, so
every accepted connection is checked with ``SO_PEERCRED`` (the peer's pid, uid and gid at
``connect()``): it must have this process's effective uid and be this process or a descendant of
it (``/proc/<pid>/stat`` parent chain, up to :data:`MAX_DEPTH` levels: forkserver workers are
grandchildren).  A peer already gone when its connection is accepted (exited and reaped) cannot
be traced; the owner may then vouch for it with ``known_pids`` (e.g. the workers it started).
Anything else is closed unread and counted in :attr:`Receiver.refused`, the first one kept in
:attr:`Receiver.first_refused` for the owner to report.  Where ``SO_PEERCRED`` does not exist
(not Linux) every connection is accepted, as before this check existed: the address is then a
socket file in the temp folder, guarded only by its permissions (the umask) and the folder's.

Packets longer than ``max_message`` bytes, empty packets and those ``on_message`` rejects (any
exception) are counted in :attr:`Receiver.malformed`; nothing a peer sends ever ends the
receiver thread.
"""

from __future__ import annotations

import os
import secrets
import select
import selectors
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection

import attrs

#: how often the receiver thread takes what the senders sent (connections are accepted at once)
POLL_S = 0.05
#: parent links walked from a peer up to the owner (worker <- forkserver <- owner is 2)
MAX_DEPTH = 4
_PEERCRED = getattr(socket, "SO_PEERCRED", None)
_UCRED = struct.Struct("3i")  # struct ucred: pid_t pid; uid_t uid; gid_t gid
_HANGUP = getattr(select, "POLLHUP", 0) | getattr(select, "POLLRDHUP", 0)  # no poll() on Windows


@attrs.frozen
class Peer:
    """The credentials of a connected process (None where the platform cannot tell)."""

    pid: int | None
    uid: int | None
    gid: int | None


def env_var(name: str) -> str:
    """The environment variable that carries channel ``name``'s address to the helpers."""
    return f"JOBPROF_{name.upper()}_CHANNEL"


def peer_of(conn: socket.socket) -> Peer:
    """The ``SO_PEERCRED`` credentials of a connected Unix socket's peer."""
    if _PEERCRED is None:
        return Peer(None, None, None)
    pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, _PEERCRED, _UCRED.size))
    return Peer(pid, uid, gid)


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc`` (None: no such process, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        return int(stat.rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descends_from(pid: int, ancestor: int, max_depth: int = MAX_DEPTH) -> bool | None:
    """True if ``ancestor`` is ``pid`` or one of its first ``max_depth`` ancestors; None if the
    chain breaks before an answer (a process in it is gone, or there is no ``/proc``)."""
    for _ in range(max_depth + 1):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        parent = parent_pid(pid)
        if parent is None:
            return None
        pid = parent
    return False


def _address(name: str) -> str:
    token = f"jobprof-{name}-{os.getpid()}-{secrets.token_hex(6)}"
    if sys.platform.startswith("linux"):
        return "\0" + token  # abstract namespace: nothing on disk to clean up
    return os.path.join(tempfile.gettempdir(), token + ".sock")


class Receiver:
    """The owner's end: a daemon thread accepts checked peers and hands every packet to
    ``on_message(data, peer)``; ``drain()`` takes what is waiting from any thread."""

    def __init__(self, name: str, on_message: Callable[[bytes, Peer], None], *, max_message: int = 512,
                 known_pids: Callable[[], Collection[int]] | None = None) -> None:
        self._on_message = on_message
        self._max = max_message
        self._known_pids = known_pids
        self.env = env_var(name)
        self.owner = os.getpid()
        self._uid = os.geteuid() if hasattr(os, "geteuid") else None
        self.refused = 0  # connections closed unread: not this job's helpers
        self.first_refused: Peer | None = None
        self.malformed = 0  # packets dropped: empty, too long, or rejected by on_message
        self.opened_ns = time.monotonic_ns()  # no helper record can be older than the channel
        self.address = _address(name)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.bind(self.address)
            self._sock.listen(256)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self._listener = selectors.DefaultSelector()  # connections: served at once (one per helper)
        self._listener.register(self._sock, selectors.EVENT_READ)
        self._selector = selectors.DefaultSelector()  # records: taken every POLL_S
        self._peers: dict[int, Peer] = {}  # fd -> who is on the other end
        self._stop = threading.Event()
        self._poll_lock = threading.Lock()  # the thread and drain() callers share the selectors
        os.environ[self.env] = f"{self.owner}:{self.address.lstrip(chr(0))}:{int(self.address[0] == chr(0))}"
        self._thread = threading.Thread(target=self._run, name=f"jobprof-{name}-receiver", daemon=True)
        self._thread.start()

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        # records are taken on a timer, not per record: a wake per batch would ask the training
        # thread for the GIL twice a step (the socket buffer holds some hundreds meanwhile).  A
        # connection is accepted at once, while its peer is certainly alive to be checked
        next_drain = time.monotonic() + POLL_S
        while not self._stop.is_set():
            try:
                ready = self._listener.select(max(0.0, next_drain - time.monotonic()))
            except (OSError, ValueError):
                return
            if ready:
                with self._poll_lock:
                    self._accept()
            if time.monotonic() >= next_drain:
                self.drain()
                next_drain = time.monotonic() + POLL_S

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # nothing more waiting (or the socket is closed)
                return
            try:
                peer = peer_of(conn)
                allowed = self._allowed(peer)
            except Exception:
                peer, allowed = Peer(None, None, None), False
            if not allowed:
                conn.close()
                self.refused += 1
                if self.first_refused is None:
                    self.first_refused = peer
                continue
            conn.setblocking(False)
            self._peers[conn.fileno()] = peer
            self._selector.register(conn, selectors.EVENT_READ)

    def _allowed(self, peer: Peer) -> bool:
        if peer.pid is None:
            return True  # no SO_PEERCRED on this platform: unauthenticated, as documented above
        if peer.uid != self._uid or peer.pid <= 0:  # pid 0: a peer in another pid namespace
            return False
        descends = descends_from(peer.pid, self.owner)
        if descends is None and self._known_pids is not None:  # gone already: the owner may vouch
            descends = peer.pid in self._known_pids()
        return bool(descends)

    # -- any thread ----------------------------------------------------------------------------
    def drain(self) -> None:
        """Take everything the senders have sent so far (any thread; one at a time)."""
        with self._poll_lock:
            self._accept()  # a peer connected since the last look: its records are waiting too
            while self._poll():
                pass

    def _poll(self) -> bool:
        """Serve what is ready; True if anything was."""
        try:
            ready = self._selector.select(0)
        except (OSError, ValueError):
            self._stop.set()
            return False
        for key, _ in ready:
            conn = key.fileobj
            peer = self._peers.get(conn.fileno(), Peer(None, None, None))  # type: ignore[union-attr]
            try:
                while True:
                    data = conn.recv(self._max + 1)  # type: ignore[union-attr]
                    if not data and self._hung_up(conn):  # type: ignore[arg-type]
                        self._forget(conn)  # type: ignore[arg-type]
                        break
                    if not data or len(data) > self._max:  # an empty packet; a longer one (cut)
                        self.malformed += 1
                        continue
                    try:
                        self._on_message(data, peer)
                    except Exception:
                        self.malformed += 1  # rejected: it must not end the thread
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._forget(conn)  # type: ignore[arg-type]
        return bool(ready)

    @staticmethod
    def _hung_up(conn: socket.socket) -> bool:
        """Whether an empty read is the end of the connection: the peer has closed and no packet
        with data is queued (a zero-length packet reads the same as the end)."""
        poller = select.poll()
        poller.register(conn, select.POLLIN | _HANGUP)
        events = poller.poll(0)
        if not events or not events[0][1] & _HANGUP:
            return False
        try:
            return not conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except OSError:
            return True

    def _forget(self, conn: socket.socket) -> None:
        self._peers.pop(conn.fileno(), None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def close(self) -> None:
        """Stop the thread, take what the senders already sent, release the socket."""
        self._stop.set()
        self._thread.join(1 + POLL_S)
        self.drain()
        for selector in (self._selector, self._listener):
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            selector.close()
        if os.environ.get(self.env, "").startswith(f"{self.owner}:"):
            del os.environ[self.env]
        if not self.address.startswith("\0"):
            try:
                os.unlink(self.address)
            except OSError:
                pass


class Sender:
    """A helper's end.  ``send`` never blocks and never raises."""

    def __init__(self, address: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.connect(address)
        except OSError:
            self._sock.close()
            raise
        self.dropped = 0

    @classmethod
    def for_owner(cls, name: str) -> Sender | None:
        """A sender to the receiver of an ancestor of this process (its parent, or a forkserver's
        parent), or None if none listens under ``name``."""
        owner, _, rest = os.environ.get(env_var(name), "").partition(":")
        path, _, abstract = rest.rpartition(":")
        if not owner.isdigit() or not path or int(owner) == os.getpid():
            return None
        owner_pid, parent = int(owner), os.getppid()
        if owner_pid != parent and not descends_from(parent, owner_pid, MAX_DEPTH - 1):
            return None  # a stale variable inherited from some other process
        try:
            return cls("\0" + path if abstract == "1" else path)
        except OSError:
            return None

    def send(self, data: bytes) -> None:
        try:
            self._sock.send(data, socket.MSG_DONTWAIT)
        except OSError:  # buffer full (EAGAIN) or the owner is gone
            self.dropped += 1
