"""The background thread that takes finished iterations off the training thread.

For each iteration it writes the raw files, renders the exported files from the records
still in memory, and applies the storage budget.  The queue is bounded: the process holds at
most ``MAX_IN_FLIGHT`` iterations; if the disk cannot keep up, newer iterations are dropped
and counted rather than stalling the job.  The first OSError (disk full, output removed or
unwritable) stops collection with one message; the job carries on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from jobprof import export, rawstore
from jobprof.steps import PENDING_LIMIT
from jobprof.storage import StorageBudget
from jobprof.types import WriterSpec

# room for the burst of tentative iterations the detector confirms at once, plus a few more
MAX_IN_FLIGHT = PENDING_LIMIT + 8
_STOP = object()


class Sink:
    def __init__(self, device_dir: Path, meta: export.DeviceMeta,
                 writers: Iterable[tuple[str, WriterSpec]], budget: StorageBudget,
                 on_plugin_error: Callable[[str, str], None],
                 on_fatal: Callable[[str], None],
                 stream_owner: Callable[[str], str | None] = lambda stream: None) -> None:
        self.device_dir, self.meta, self.writers = device_dir, meta, list(writers)
        self._stream_owner = stream_owner
        self._render_failed: set[str] = set()
        self.budget = budget
        self._on_plugin_error, self._on_fatal = on_plugin_error, on_fatal
        self._queue: queue.Queue = queue.Queue(maxsize=MAX_IN_FLIGHT)
        self.dropped = 0
        self.written = 0
        self.failed = False
        self._thread = threading.Thread(target=self._run, name="jobprof-sink", daemon=True)
        self._thread.start()

    def submit(self, index: int, streams: Mapping[str, list[Any]], active: frozenset[str]) -> None:
        """Called on the training thread: never blocks, never raises.

        ``active`` names the plugins alive when the iteration ended: only their writers render
        it (a plugin that fails later still gets the iterations it finished).
        """
        if self.failed:
            return
        try:
            self._queue.put_nowait((index, streams, active))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 60.0) -> None:
        """Drain what is queued and stop the thread (waits at most ``timeout`` seconds)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _writer_failed(self, plugin: str, message: str) -> None:
        self._render_failed.add(plugin)
        self._on_plugin_error(plugin, message)

    def _bad_stream(self, stream: str, exc: Exception) -> None:
        owner = self._stream_owner(stream) or stream
        self._on_plugin_error(owner, f"stream '{stream}' is not JSON-serialisable: {exc}")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self.failed:
                continue
            index, streams, active = item
            try:
                files: list[tuple[Path, int, str | None]] = []
                files.extend(rawstore.write_iteration(self.device_dir, index, streams, self._bad_stream))
                writers = [(p, spec) for p, spec in self.writers
                           if p in active and p not in self._render_failed]
                files.extend(export.render_iteration(self.device_dir, self.meta, streams,
                                                     writers, self._writer_failed))
                self.budget.add(index, files)
                self.budget.enforce()
                self.written += 1
            except OSError as exc:
                self.failed = True
                self._on_fatal(f"cannot write to {self.device_dir}: {exc.strerror or exc}")
            except Exception as exc:  # never let the thread die silently
                self.failed = True
                self._on_fatal(f"internal error while writing iteration {index}: {exc!r}")
