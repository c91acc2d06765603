"""Takes finished iterations off the training thread: raw append now, export in the background.

On the training thread, :meth:`Sink.submit` appends the iteration's raw line (one ``write()``,
tens of microseconds) and applies the storage budget: after it returns the iteration is safe.
Rendering the per-iteration timeline/summary files costs far more (a file per writer), so a
background exporter does it under a CPU-duty budget (``EXPORT_DUTY`` of wall time: it sleeps
in proportion to the time it worked) and reads each iteration back from disk, so memory stays
bounded however far it lags.  ``close()`` renders whatever is left, at exit / SIGTERM.  The
first OSError (disk full, output removed or unwritable) stops collection with one message.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from jobprof import export, rawstore
from jobprof.storage import StorageBudget
from jobprof.types import WriterSpec

#: share of wall time the background exporter may work while the job trains
EXPORT_DUTY = 0.01
POLL_S = 0.25
#: iterations waiting for export that the process remembers (about 100 bytes each); older
#: ones stay on disk as raw data for `jobprof export` (counted in info.json)
MAX_BACKLOG = 50_000


class Sink:
    def __init__(self, device_dir: Path, meta: export.DeviceMeta,
                 writers: Iterable[tuple[str, WriterSpec]], budget: StorageBudget,
                 on_plugin_error: Callable[[str, str], None],
                 on_fatal: Callable[[str], None],
                 stream_owner: Callable[[str], str | None] = lambda stream: None) -> None:
        self.device_dir, self.meta, self.writers = device_dir, meta, list(writers)
        self.budget = budget
        self._on_plugin_error, self._on_fatal, self._stream_owner = on_plugin_error, on_fatal, stream_owner
        self._raw = rawstore.RawWriter(device_dir)
        self._unit = 0
        self._todo: deque[tuple[int, int, rawstore.Written, frozenset[str]]] = deque()
        self._render_failed: set[str] = set()
        self._export_lock = threading.Lock()
        self._stop = threading.Event()
        self.written = 0
        self.exported = 0
        self.deferred = 0
        self.export_seconds = 0.0
        self.failed = False
        self._thread = threading.Thread(target=self._run, name="jobprof-export", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------
    def submit(self, index: int, streams: Mapping[str, list[Any]], active: frozenset[str]) -> None:
        """Store one finished iteration (never raises).

        ``active`` names the plugins alive when the iteration ended: only their writers render
        it (a plugin that fails later still gets the iterations it finished).
        """
        if self.failed:
            return
        try:
            where = self._raw.append(index, streams, self._bad_stream)
            if where.new_segment:
                self._unit = index
            self.budget.account(self._unit, where.segment, where.offset + where.length)
            self.budget.enforce()
            self.written += 1
            self._todo.append((index, self._unit, where, active))
            if len(self._todo) > MAX_BACKLOG:
                self._todo.popleft()
                self.deferred += 1
        except OSError as exc:
            self._fail(f"cannot write to {self.device_dir}: {exc.strerror or exc}")
        except Exception as exc:
            self._fail(f"internal error while writing iteration {index}: {exc!r}")

    def close(self) -> None:
        """Stop the background exporter and render every iteration still waiting."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._export_pending(throttle=False)
        self._raw.close()

    # -- exporter --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self._export_pending(throttle=True)

    def _export_pending(self, throttle: bool) -> None:
        with self._export_lock:
            while self._todo and not self.failed and not (throttle and self._stop.is_set()):
                index, unit, where, active = self._todo.popleft()
                started = time.perf_counter()
                self._export_one(index, unit, where, active)
                spent = time.perf_counter() - started
                self.export_seconds += spent
                if throttle and self._stop.wait(spent * (1 / EXPORT_DUTY - 1)):
                    return

    def _export_one(self, index: int, unit: int, where: rawstore.Written, active: frozenset[str]) -> None:
        if not self.budget.alive(unit):
            return  # aged away before it was rendered
        try:
            streams = rawstore.read_at(where)
            if streams is None:
                return
            writers = [(p, spec) for p, spec in self.writers if p in active and p not in self._render_failed]
            for path, size, _ in export.render_iteration(self.device_dir, self.meta, streams, writers,
                                                         self._writer_failed):
                if not self.budget.account(unit, path, size):
                    path.unlink(missing_ok=True)  # its unit was aged while rendering
            self.budget.enforce()
            self.exported += 1
        except OSError as exc:
            self._fail(f"cannot write to {self.device_dir}: {exc.strerror or exc}")
        except Exception as exc:  # never let the thread die silently
            self._fail(f"internal error while exporting iteration {index}: {exc!r}")

    # -- failures --------------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        if not self.failed:
            self.failed = True
            self._on_fatal(message)

    def _writer_failed(self, plugin: str, message: str) -> None:
        self._render_failed.add(plugin)
        self._on_plugin_error(plugin, message)

    def _bad_stream(self, stream: str, exc: Exception) -> None:
        owner = self._stream_owner(stream) or stream
        self._on_plugin_error(owner, f"stream '{stream}' is not JSON-serialisable: {exc}")
