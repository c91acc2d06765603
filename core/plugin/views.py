"""What the analysis hooks receive, as a protocol: :class:`Profile`, a profile read back
(``jobprof_rank_facts``, ``jobprof_report_sections``, ``jobprof_diff_tables``).

The class behind it lives two stages later (``jobprof.analysis.profile.Profile``); a plugin is
typed against this protocol, so its type checker says when it reaches past the contract.  A test
holds the class to the protocol.

Example::

    from jobprof.plugin import Profile, hookimpl

    @hookimpl
    def jobprof_rank_facts(profile: Profile, device: int):
        return {"iterations": len(profile.iterations(device))}
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar

from jobprof.plugin.records import SharedRecord
from jobprof.plugin.values import Iteration

_R = TypeVar("_R", bound=SharedRecord)

#: a plugin's ``jobprof_iteration_facts``: ``(iteration, streams) -> digest``
DigestOf = Callable[[Iteration, Mapping[str, list[Any]]], Any]


class Profile(Protocol):
    """A profile folder read back: its devices (one per rank) and, per device, what the job
    stored.  Every read is tolerant: a damaged file is named once and left out."""

    @property
    def devices(self) -> list[int]:
        """The selected devices (one per rank), in id order."""

    def rank(self, device: int) -> int:
        """The job rank that wrote ``device`` (``rank_id`` in info.json; else the device id)."""

    def info(self, device: int) -> dict[str, Any]:
        """The device's ``info.json`` (``{}`` when missing or unreadable)."""

    def folder(self, device: int) -> Path:
        """The device's folder (``PROF_.../device_<id>``)."""

    def options(self, device: int) -> dict[str, Any]:
        """The options the device's job ran with (info.json's ``jobprof.options``; ``{}``
        when it records none)."""

    def is_on(self, device: int, key: str) -> bool:
        """Whether option ``key`` was on for the device (set, not ``"off"``), as
        ``Config.is_on`` says it at collection: ``profile.is_on(0, "kineto_trace")``."""

    def task_trace_every(self, device: int) -> int:
        """The device's ``task_trace_every`` (1: every iteration's operators were captured)."""

    def facts(self, plugin: str, device: int, compute: Callable[[Profile, int], Any]) -> Any:
        """``plugin``'s ``jobprof_rank_facts`` answer for ``device``: the gathered one when the
        command gathered facts, else ``compute(self, device)``."""

    def iteration_facts(self, plugin: str, device: int, compute: DigestOf) -> Iterator[tuple[int, Any]]:
        """``(iteration, digest)`` of each selected iteration of ``device`` where ``plugin``'s
        ``jobprof_iteration_facts`` answered: the digest the exporter kept as it rendered it
        (no operator window read), else ``compute(iteration, streams)`` on the raw data."""

    def iterations(self, device: int) -> list[Iteration]:
        """The selected iterations of ``device``, in order."""

    def records(self, stream: str, device: int | None = None) -> Iterator[dict[str, Any]]:
        """Every selected raw record of ``stream``, tagged with ``_device`` and ``_iteration``."""

    def streams(self, device: int,
                skip_ops: Container[int] = ()) -> Iterator[tuple[int, dict[str, list[Any]]]]:
        """Each selected iteration's raw streams, ``(index, {stream: records})``."""

    def typed(self, kind: type[_R], device: int | None = None) -> Iterator[tuple[int, int, _R]]:
        """Every selected record of a declared stream shaped as ``kind`` declares, as
        ``(device, iteration, record)``."""

    def summary_files(self, device: int, name: str) -> list[Path]:
        """The selected iterations' ``summary/<name>_<dev>_<model>_<iter>.csv`` files."""

    def open_text(self, path: Path) -> TextIO:
        """A file of the profile opened to read as UTF-8 text (``newline=""``, as ``csv`` wants);
        OSError for anything but a regular file (a FIFO never blocks the command)."""

    def problem(self, text: str) -> None:
        """Report one read problem: the file named, what is wrong and what was done (``left
        out``).  The command shows it once, after its output."""
