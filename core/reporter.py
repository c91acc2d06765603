"""The one place that talks to the user from inside a profiled process.

Collectors never print; they hand problems to the reporter, which writes each distinct
message once to stderr (prefixed ``jobprof:``) and remembers it for ``end_info``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import zlib

import attrs


@attrs.frozen
class Problem:
    """One thing wrong with the options: where (a JSON path), what, and the offending value."""

    path: str
    message: str
    value: object = attrs.field(default=None)
    has_value: bool = False

    def render(self) -> str:
        shown = f" (got {show_value(self.value)})" if self.has_value else ""
        return f"{self.path}: {self.message}{shown}"


#: Longest value shown in a problem line; the user has the full text in the environment.
MAX_SHOWN = 80


def show_value(value: object) -> str:
    """The value as the user wrote it in JSON (true, null, "on"), on one line, shortened.

    JSON escapes \\n and friends; DEL and C1 controls are escaped too so the terminal shows
    what is wrong instead of acting on it.
    """
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = "".join(f"\\u{ord(c):04x}" if 0x7F <= ord(c) <= 0x9F else c for c in text)
    if len(text) > MAX_SHOWN:
        text = f"{text[:MAX_SHOWN - 3]}..."
    return text


class Reporter:
    """Deduplicating stderr writer.  Thread-safe; never raises."""

    def __init__(self, stream=None) -> None:
        self._stream = stream
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.messages: list[str] = []

    def _emit(self, level: str, text: str) -> None:
        line = f"jobprof: {level}: {text}" if level else f"jobprof: {text}"
        with self._lock:
            if line in self._seen:
                return
            self._seen.add(line)
            self.messages.append(line)
        try:
            stream = self._stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()
        except Exception:
            pass

    def error(self, text: str) -> None:
        self._emit("error", text)

    def warning(self, text: str) -> None:
        self._emit("warning", text)

    def info(self, text: str) -> None:
        self._emit("", text)

    def once_per_job(self, level: str, text: str) -> None:
        """Emit unless a parent process of this job already did (children inherit the marker).

        For start-up messages that every process of a job (torchrun and its workers) would
        otherwise repeat, such as option problems and option warnings.
        """
        marker = "JOBPROF_REPORTED"
        digest = format(zlib.crc32(f"{level}:{text}".encode()), "x")
        said = os.environ.get(marker, "").split(",")
        if digest in said:
            return
        os.environ[marker] = ",".join([*filter(None, said[-63:]), digest])
        self._emit(level, text)

    def options_problems(self, problems: list[Problem], source: str, consequence: str) -> None:
        """Report every option problem at once, each on its own line with its JSON path."""
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        body = "\n".join(f"  {p.render()}" for p in problems)
        self.once_per_job("error", f"{source}: {count}; {consequence}\n{body}")


REPORTER = Reporter()
