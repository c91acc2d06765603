"""The one place that talks to the user from inside a profiled process.

Collectors never print; they hand problems to the reporter, which writes each distinct
message once to stderr (prefixed ``jobprof:``) and remembers it for ``end_info``.
"""

from __future__ import annotations

import json
import os
import re
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
        """One line; the path holds the user's keys, so it is escaped and shortened too."""
        shown = f" (got {show_value(self.value)})" if self.has_value else ""
        return f"{_shorten(escape(self.path), MAX_PATH_SHOWN)}: {escape(self.message)}{shown}"


#: Longest value shown in a problem line; the user has the full text in the environment.
MAX_SHOWN = 80
#: Longest JSON path shown (a key may be any length)
MAX_PATH_SHOWN = 96

#: What a terminal acts on instead of showing: C0 controls, DEL, C1 (0x9b is a one-byte CSI),
#: lone surrogates (undecodable bytes of the environment, as os.environ holds them; no
#: encoder accepts them), the line and paragraph separators and the bidi overrides.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e"
                             "\u2066-\u2069]")


def escape(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would act on written as a JSON escape (\\u001b)."""
    pattern = _UNSAFE_KEEP_NL if keep_newlines else _UNSAFE
    return pattern.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def show_value(value: object) -> str:
    """The value as the user wrote it in JSON (true, null, "on"), on one line, shortened.

    JSON escapes \\n and friends; DEL, C1 controls and lone surrogates are escaped too so the
    terminal shows what is wrong instead of acting on it.
    """
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # RecursionError: a deep list or dict
        try:
            text = repr(value)
        except (ValueError, RecursionError):  # an int past the str-conversion limit
            text = f"<{type(value).__name__}>"
    return _shorten(escape(text), MAX_SHOWN)


class Reporter:
    """Deduplicating stderr writer.  Thread-safe; never raises."""

    def __init__(self, stream=None) -> None:
        self._stream = stream
        self._seen: set[str] = set()
        # reentrant: SIGTERM's handler reports on the thread it interrupted, maybe in here
        self._lock = threading.RLock()
        self.messages: list[str] = []

    def _emit(self, level: str, text: str) -> None:
        # every message may quote the user (keys, paths, module names): nothing raw reaches
        # the terminal but the line breaks the message is made of
        text = escape(text, keep_newlines=True)
        line = f"jobprof: {level}: {text}" if level else f"jobprof: {text}"
        # every line of a message starts with the prefix, so that `grep -v ^jobprof:` or a log
        # filter separates the job's own stderr from ours
        line = line.replace("\n", "\njobprof: ")
        with self._lock:
            if line in self._seen:
                return
            self._seen.add(line)
            self.messages.append(line)
        try:
            stream = self._stream or sys.stderr
            try:
                stream.write(line + "\n")
            except UnicodeEncodeError:  # a stream that takes ASCII only, say: escape the rest
                encoding = getattr(stream, "encoding", None) or "ascii"
                stream.write((line + "\n").encode(encoding, "backslashreplace").decode(encoding))
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
        # surrogatepass: a key with undecodable bytes must not make the digest raise
        digest = format(zlib.crc32(f"{level}:{text}".encode("utf-8", "surrogatepass")), "x")
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
