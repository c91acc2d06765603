"""The in-process marker recorder: what ``jobprof.mstx`` and the record_function / NVTX hooks call.

Hot path (user threads): a domain check (one dict lookup), a clock read, and one append of a
finished record to a deque (atomic under the GIL, so threads need no lock).  Open ranges
wait in a dict by id (any thread may end them); push/pop ranges in a stack per (thread,
domain).  :meth:`Recorder.take` runs once per iteration, on the core's sink thread shortly
after the iteration ended (a deferred hand-over), and hands over the records that ended by
the iteration's end.

Raw record (one compact dict per marker; times ``time.monotonic_ns()``, threads native ids)::

    k   kind: "m" marker, "r" range (start/end, by id), "p" push/pop range
    m   message (str, at most 255 UTF-8 bytes)      d   domain
    s   start ns    e   end ns (= s for a marker)    t   thread that started it
    et  thread that ended it, only when not ``t``
    si  iteration in which it started, only when earlier than the one it is stored in

The process id is the device's (``ExportContext.pid``): records never leave their process.
"""

from __future__ import annotations

import bisect
import itertools
import os
import sys
import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

import attrs

#: mstx's message limit, in UTF-8 bytes
MAX_MESSAGE_BYTES = 255
#: below this many characters a str cannot exceed MAX_MESSAGE_BYTES (4 bytes per character)
_SURELY_SHORT = MAX_MESSAGE_BYTES // 4
#: finished records waiting for their iteration (a loop that never ends an iteration must
#: not grow without bound: ~350 bytes each); beyond it records are dropped and counted
MAX_PENDING = 200_000
#: every this many queued records, the slow path checks whether this process is a spawned
#: DataLoader worker (its own session never ends an iteration): then it stops recording
CHECK_EVERY = 10_000
#: open ranges (range_start without range_end) and open pushes per (thread, domain)
MAX_OPEN = 100_000
MAX_DEPTH = 10_000
#: iteration ends kept to name the start iteration of a long range (trimmed past open ones)
KEEP_ENDS = 1 << 16
#: open ranges described in the exit warning
SHOW_OPEN = 5

_now = time.monotonic_ns
_native_id = threading.get_native_id  # a syscall (gettid): ~5x a thread-local read here
_end_key = itemgetter("e")


def _split(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


@attrs.frozen
class DomainFilter:
    """``mstx_domain_include`` / ``mstx_domain_exclude`` (comma-separated; never both)."""

    include: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()

    @classmethod
    def from_options(cls, include: str = "", exclude: str = "") -> DomainFilter:
        return cls(_split(include or ""), _split(exclude or ""))

    def allows(self, domain: str) -> bool:
        if self.include:
            return domain in self.include
        return domain not in self.exclude


def clip(message: str) -> tuple[str, bool]:
    """``message`` cut to at most 255 UTF-8 bytes at a character boundary; (text, was cut)."""
    data = message.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_MESSAGE_BYTES:
        return message, False
    return data[:MAX_MESSAGE_BYTES].decode("utf-8", "ignore"), True


@attrs.frozen
class OpenRange:
    """A range or push still open: for the exit warning."""

    kind: str  # "range", "push" or "block" (a record_function entered and never exited)
    message: str
    domain: str
    thread: int
    start_ns: int


class Recorder:
    """Collects markers of one profiling session; never raises into the caller."""

    def __init__(self, domains: DomainFilter = DomainFilter(), origin_ns: int = 0,
                 warn: Callable[[str], None] | None = None, max_pending: int = MAX_PENDING,
                 keep_ends: int = KEEP_ENDS) -> None:
        self.enabled = True
        self.origin_ns = origin_ns  # the session's start, for "started N s after start"
        self.domains = domains
        self._warn = warn
        self.max_pending = max_pending
        self._check_at = min(CHECK_EVERY, max_pending)  # queue length that takes the slow path
        self.keep_ends = keep_ends
        self._trim_at = 2 * keep_ends
        self._allowed: dict[str, bool] = {}
        self._ids = itertools.count(1)
        self._open: dict[int, tuple[int, str, str, int]] = {}  # id -> (start, message, domain, tid)
        #: record_function blocks entered and not exited (capture.install_record_function):
        #: id of the entry -> ((thread ident, start ns), name)
        self.open_blocks: dict[int, tuple[tuple[int, int], Any]] = {}
        self._stacks: dict[tuple[int, str], list[tuple[int, str]]] = {}
        self._overflow: dict[tuple[int, str], int] = {}  # pushes past MAX_DEPTH, owed pops
        self._done: deque[dict[str, Any] | tuple] = deque()
        self._local = threading.local()  # .tid: this thread's native id, read once per thread
        # take() only (one consumer, in order): finished records not yet handed over, by end time
        self._carry: list[dict[str, Any]] = []
        self._ends = array("q")  # end ns of handed-over iterations, first is _first_index
        self._first_index = 1
        self.truncated = 0
        self.dropped = 0
        self.unknown_ends = 0
        self.unmatched_pops = 0
        self.errors = 0
        ref = weakref.ref(self)
        # a forked child (a DataLoader worker) must not fill a copy nobody will read
        os.register_at_fork(after_in_child=lambda: _disable(ref))

    # -- hot path --------------------------------------------------------------------------
    def allows(self, domain: str) -> bool:
        allowed = self._allowed.get(domain)
        if allowed is None:
            allowed = self._allowed[domain] = self.domains.allows(domain)
        return allowed

    def mark(self, domain: str, message: Any) -> None:
        now = _now()
        if not self.enabled:
            return
        try:
            allowed = self._allowed.get(domain)
            if not (allowed or (allowed is None and self.allows(domain))):
                return
            if type(message) is not str or len(message) > _SURELY_SHORT:
                message = self._message(message)
            try:
                tid = self._local.tid
            except AttributeError:
                tid = self._local.tid = _native_id()
            record = {"k": "m", "m": message, "d": domain, "s": now, "e": now, "t": tid}
            if len(self._done) < self._check_at:  # the append is atomic: no lock
                self._done.append(record)
            else:
                self._queue_slowly(record)
        except Exception:
            self.errors += 1

    clock = staticmethod(_now)

    def span(self, domain: str, message: Any, start: int, end: int) -> None:
        """A finished range of an allowed domain (the record_function lean path): one tuple,
        turned into a record by :meth:`take` off the training thread."""
        try:
            if type(message) is not str or len(message) > _SURELY_SHORT:
                message = self._message(message)
            try:
                tid = self._local.tid
            except AttributeError:
                tid = self._local.tid = _native_id()
            if len(self._done) < self._check_at and self.enabled:
                self._done.append(("r", message, domain, start, end, tid))
            else:
                self._queue_slowly(("r", message, domain, start, end, tid))
        except Exception:
            self.errors += 1

    def range_start(self, domain: str, message: Any) -> int:
        now = _now()
        if not self.enabled:
            return 0
        try:
            allowed = self._allowed.get(domain)
            if not (allowed or (allowed is None and self.allows(domain))):
                return 0
            if type(message) is not str or len(message) > _SURELY_SHORT:
                message = self._message(message)
            if len(self._open) >= MAX_OPEN:
                self.dropped += 1
                return 0
            try:
                tid = self._local.tid
            except AttributeError:
                tid = self._local.tid = _native_id()
            range_id = next(self._ids)  # itertools.count: atomic under the GIL
            self._open[range_id] = (now, message, domain, tid)
            return range_id
        except Exception:
            self.errors += 1
            return 0

    def range_end(self, range_id: int) -> None:
        now = _now()
        try:
            entry = self._open.pop(range_id, None)
            if entry is None:
                if range_id:  # 0 is "not recorded": ending it is normal, not an error
                    self.unknown_ends += 1
                return
            start, message, domain, tid = entry
            record = {"k": "r", "m": message, "d": domain, "s": start, "e": now, "t": tid}
            try:
                here = self._local.tid
            except AttributeError:
                here = self._local.tid = _native_id()
            if here != tid:
                record["et"] = here
            if self.enabled and len(self._done) < self._check_at:
                self._done.append(record)
            else:
                self._queue_slowly(record)
        except Exception:  # e.g. an unhashable id
            self.unknown_ends += 1

    def push(self, domain: str, message: Any) -> None:
        now = _now()
        if not self.enabled:
            return
        try:
            allowed = self._allowed.get(domain)
            if not (allowed or (allowed is None and self.allows(domain))):
                return
            if type(message) is not str or len(message) > _SURELY_SHORT:
                message = self._message(message)
            try:
                tid = self._local.tid
            except AttributeError:
                tid = self._local.tid = _native_id()
            key = (tid, domain)
            stack = self._stacks.get(key)
            if stack is None:
                stack = self._stacks.setdefault(key, [])
            if len(stack) >= MAX_DEPTH:
                self._overflow[key] = self._overflow.get(key, 0) + 1
                self.dropped += 1
                return
            stack.append((now, message))
        except Exception:
            self.errors += 1

    def pop(self, domain: str) -> None:
        now = _now()
        try:
            allowed = self._allowed.get(domain)
            if not (allowed or (allowed is None and self.allows(domain))):
                return
            try:
                tid = self._local.tid
            except AttributeError:
                tid = self._local.tid = _native_id()
            key = (tid, domain)
            if self._overflow and self._overflow.get(key):
                self._overflow[key] -= 1  # pairs with a push that was not kept
                return
            stack = self._stacks.get(key)
            if not stack:
                self.unmatched_pops += 1
                return
            start, message = stack.pop()
            record = {"k": "p", "m": message, "d": domain, "s": start, "e": now, "t": tid}
            if self.enabled and len(self._done) < self._check_at:
                self._done.append(record)
            else:
                self._queue_slowly(record)
        except Exception:
            self.errors += 1

    def _queue_slowly(self, record: dict[str, Any] | tuple) -> None:
        """Rare path: the queue reached a checkpoint (no iteration took it for a while)."""
        if not self.enabled:
            return
        if _in_dataloader_worker():
            self.enabled = False  # a spawned worker: its session never hands anything over
            self._done.clear()
            return
        if len(self._done) < self.max_pending:
            self._done.append(record)
            self._check_at = min(len(self._done) + CHECK_EVERY, self.max_pending)
        else:
            self.dropped += 1

    def _message(self, message: Any) -> str:
        """Rare path: a non-str message, or one that may be over the byte limit."""
        try:
            text = message if type(message) is str else str(message)
        except Exception:
            text = f"<unprintable {type(message).__name__}>"
        text, cut = clip(text)
        if cut:
            self.truncated += 1
            if self.truncated == 1 and self._warn is not None:
                self._warn(f"msproftx: a marker message longer than {MAX_MESSAGE_BYTES} bytes was "
                           f"truncated ({text[:40]!r}...); later truncations are not reported")
        return text

    # -- hand-over (training thread, once per iteration) -----------------------------------
    def take(self, index: int, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """Records that ended by ``end_ns``: iteration ``index``, ``(previous end, end_ns]``.

        Records ending later stay for the next iteration, so a burst of iterations delivered
        together is split correctly.  A range that started before ``start_ns`` gets ``si``,
        the iteration it started in (ranges that began before the first iteration have none).
        """
        done = self._done
        carry = self._carry
        if done:
            for _ in range(len(done)):  # popleft: threads may append meanwhile
                record = done.popleft()
                if isinstance(record, tuple):  # from span(); the others are plain dicts
                    kind, message, domain, start, end, tid = record
                    record = {"k": kind, "m": message, "d": domain, "s": start, "e": end, "t": tid}
                carry.append(record)
            carry.sort(key=_end_key)  # nearly sorted already: linear
        cut = bisect.bisect_right(carry, end_ns, key=_end_key)
        taken = carry[:cut]
        del carry[:cut]
        if self._ends:  # not the first iteration: a range may have started in an earlier one
            for record in taken:
                if record["s"] < start_ns:
                    record["si"] = self._iteration_of(record["s"])
        if not self._ends:
            self._first_index = index
        self._ends.append(end_ns)  # iterations arrive in order, one call each
        if len(self._ends) > self._trim_at:
            self._trim_ends()
        return taken

    def _iteration_of(self, ns: int) -> int:
        # iteration k spans (end of k-1, end of k]; earlier than the kept ends: the first kept
        pos = bisect.bisect_left(self._ends, ns)
        return self._first_index + pos

    def _trim_ends(self) -> None:
        """Forget iteration ends no open range can need any more (amortised, rare)."""
        starts = [entry[0] for entry in list(self._open.values())]
        starts += [top[0] for stack in list(self._stacks.values()) for top in stack[:1]]
        starts += [r["s"] for r in self._carry]
        oldest = min(starts, default=self._ends[-1])
        keep_from = min(bisect.bisect_left(self._ends, oldest), len(self._ends) - self.keep_ends)
        if keep_from > 0:
            del self._ends[:keep_from]
            self._first_index += keep_from
        # a long-open range pins the history: try again only once it has doubled (amortised)
        self._trim_at = 2 * max(self.keep_ends, len(self._ends))

    # -- end of session --------------------------------------------------------------------
    def close(self) -> None:
        self.enabled = False

    def still_open(self) -> list[OpenRange]:
        """Ranges and pushes not closed, oldest first."""
        out = [OpenRange("range", m, d, t, s) for s, m, d, t in list(self._open.values())]
        for (tid, domain), stack in list(self._stacks.items()):
            out += [OpenRange("push", m, domain, tid, s) for s, m in list(stack)]
        if self.open_blocks:
            native = {t.ident: t.native_id for t in threading.enumerate()}  # blocks keep the ident
            for (ident, start), name in list(self.open_blocks.values()):
                if self.allows("record_function"):
                    out.append(OpenRange("block", self._message(name), "record_function",
                                         native.get(ident) or ident, start))
        return sorted(out, key=lambda o: o.start_ns)

    def exit_notes(self, open_ranges: bool = True) -> Iterable[str]:
        """Warnings for the end of the session: open ranges first (unless not ``open_ranges``),
        then anything ignored."""
        still = self.still_open() if open_ranges else []
        if still:
            ranges = sum(o.kind == "range" for o in still)
            blocks = sum(o.kind == "block" for o in still)
            pushes = len(still) - ranges - blocks
            what = " and ".join(part for part in (
                f"{ranges} range{'s' if ranges != 1 else ''} (range_start)" if ranges else "",
                f"{pushes} push{'es' if pushes != 1 else ''} (push/pop)" if pushes else "",
                f"{blocks} record_function block{'s' if blocks != 1 else ''} (never exited)"
                if blocks else "") if part)
            shown = "; ".join(
                f"{o.message!r} (domain {o.domain}, thread {o.thread}, started "
                f"{(o.start_ns - self.origin_ns) / 1e9:.3f} s after profiling started)"
                for o in still[:SHOW_OPEN])
            more = f"; and {len(still) - SHOW_OPEN} more" if len(still) > SHOW_OPEN else ""
            yield (f"msproftx: {what} still open at exit, not written to msprof_tx: "
                   f"{shown}{more}")
        if self.unknown_ends:
            yield f"msproftx: {self.unknown_ends} range_end call(s) with an unknown range id were ignored"
        if self.unmatched_pops:
            yield f"msproftx: {self.unmatched_pops} pop call(s) without an open push were ignored"
        if self.dropped:
            yield (f"msproftx: {self.dropped} marker(s) were not recorded (more than {self.max_pending} "
                   f"waiting for an iteration, {MAX_OPEN} open ranges or {MAX_DEPTH} nested pushes)")
        if self.errors:
            yield f"msproftx: {self.errors} marker call(s) failed inside jobprof and were skipped"


def _in_dataloader_worker() -> bool:
    try:
        return sys.modules["torch"].utils.data.get_worker_info() is not None
    except Exception:
        return False


def _disable(ref: weakref.ref) -> None:
    recorder = ref()
    if recorder is not None:
        recorder.enabled = False
