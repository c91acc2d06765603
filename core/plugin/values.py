"""The values the core hands plugins and takes back: the effective options (:class:`Config`),
an iteration (:class:`Iteration`), the export context and the writers a plugin declares, the
metric sets of ``aic_metrics``, the breakdown parts a plugin measures, a ``jobprof plugins`` row.

All frozen (attrs): a hook receives them and cannot change what the next plugin sees.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from jobprof.plugin.clock import ClockAnchor, TimeAxis, own_base
from jobprof.plugin.converters import frozen_map, name_set, str_tuple

__all__ = [
    "JSON",
    "NA",
    "STEP_MODE_MODEL_ID",
    "Config",
    "ExportContext",
    "Iteration",
    "MetricSet",
    "PartSource",
    "PluginRecord",
    "Spans",
    "Streams",
    "StreamsOut",
    "WriterSpec",
]

# The types of what the hooks pass and return that are not classes (jobprof.plugin.hookspec
# annotates with them; an implementation annotates with them or a narrower type, checked by
# tests/test_hook_types.py).
#: JSON-ready data: what a facts hook returns (it travels through JSON between processes)
JSON: TypeAlias = Mapping[str, "JSON"] | Sequence["JSON"] | str | int | float | bool | None
#: an iteration's raw streams, by stream name: each a list of records (JSON values, or for the
#: core's ``ops`` / ``op_memory`` streams the :class:`OpRecord` / :class:`MemoryEvent` they decode to)
Streams: TypeAlias = Mapping[str, list[Any]]
#: what ``jobprof_iteration_end`` hands over: per stream, its records, or a zero-argument callable
#: that returns them (called on the sink thread)
StreamsOut: TypeAlias = Mapping[str, list[Any] | Callable[[], list[Any]]]
#: where an iteration's time went: category -> ``[(start_ns, end_ns), ...]``
Spans: TypeAlias = Mapping[str, list[tuple[int, int]]]

#: what a CSV or timeline value jobprof cannot measure says
NA = "N/A"
#: msprof's model id for step mode: eager execution, iteration = training step.
STEP_MODE_MODEL_ID = 4294967295



@attrs.frozen
class Config:
    """The validated, effective options: every key of the composed schema, defaults filled in.

    ``explicit`` names the keys the user set; ``source`` says where the options came from.
    """

    values: Mapping[str, Any] = attrs.field(converter=frozen_map)
    explicit: frozenset[str] = attrs.field(converter=name_set, factory=frozenset)
    source: str = "PROFILING_OPTIONS"
    storage_limit_mb: int | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def is_on(self, key: str) -> bool:
        """True when an on/off switch or a level (l0/l1/l2) is enabled."""
        return self.values.get(key) not in (None, "", "off")

    def level(self, key: str) -> str:
        """Normalised trace level: ``off``, ``l0``, ``l1`` or ``l2`` (``on`` means ``l1``)."""
        value = self.values.get(key) or "off"
        return "l1" if value == "on" else value

    @property
    def output(self) -> str:
        return self.values["output"]


@attrs.frozen
class Iteration:
    """One finished iteration (training step) as the core detected it.

    Times are ``time.monotonic_ns()`` values of this process; exporters convert them to
    epoch microseconds with the clock pair in ``start_info``.  ``fp_start_ns`` / ``bp_end_ns``
    are the automatic FP Start / BP End (first forward, end of last backward), or None.
    """

    index: int
    start_ns: int
    end_ns: int
    method: str
    fp_start_ns: int | None = None
    bp_end_ns: int | None = None
    skipped: bool = False
    model_id: int = STEP_MODE_MODEL_ID

    def to_record(self) -> dict[str, Any]:
        # spelled out: runs on the training thread every iteration (attrs.asdict is slower)
        return {"index": self.index, "start_ns": self.start_ns, "end_ns": self.end_ns,
                "method": self.method, "fp_start_ns": self.fp_start_ns, "bp_end_ns": self.bp_end_ns,
                "skipped": self.skipped, "model_id": self.model_id}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Iteration:
        names = {a.name for a in attrs.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


@attrs.frozen
class MetricSet:
    """One ``aic_metrics`` group: the ``op_summary`` columns it appends and how to fill them.

    ``values(task, machine)`` returns one value per column for a task (a
    :class:`jobprof.plugin.opview.Task`: name, type, duration, shapes, FLOPs, bytes moved, hardware
    counters when the machine had them); ``machine`` is the calibration recorded in
    ``info.json`` (measured peaks), empty when none was made.  A value nobody can measure is
    :data:`NA`.  ``sources`` says, per column, where its value comes from (shown by ``jobprof
    plugins`` and docs/plugins/aic_metrics.md), e.g. ``{"cube_fops": "FLOPs from input shapes (exact for
    matmul/conv)"}``.
    """

    name: str
    columns: tuple[str, ...] = attrs.field(converter=str_tuple)
    values: Callable[[Any, Mapping[str, Any]], list[Any]] = attrs.field(repr=False)
    #: record input shapes/dtypes/strides (FLOPs and bytes are computed from them)
    needs_shapes: bool = True
    #: measure machine peaks once (calibration) for utilisation ratios
    needs_peaks: bool = False
    sources: Mapping[str, str] = attrs.field(converter=frozen_map, factory=dict)


@attrs.frozen
class ExportContext:
    """What a writer gets to render one file for one iteration of one device."""

    device_id: int
    iteration: Iteration
    pid: int
    #: raw records of this iteration, by stream name
    #: records are JSON values: objects for most streams, arrays for the core's ``ops``
    streams: Mapping[str, list[Any]] = attrs.field(converter=frozen_map)
    #: the recording process's clock anchor (monotonic ns -> epoch)
    anchor: ClockAnchor = attrs.field(repr=False)
    config: Config | None = None
    #: the profiled program's name (``info.json`` pid_name), e.g. for a process label
    program: str = ""
    #: the chosen aic_metrics group, when the options asked for one and a plugin answers
    metrics: MetricSet | None = None
    #: the machine calibration recorded in info.json (measured peaks), or empty
    machine: Mapping[str, Any] = attrs.field(converter=frozen_map, factory=dict)
    #: per-iteration results shared by the writers of this iteration (e.g. the operator tree
    #: every operator-tier writer reads; see jobprof.plugin.opview.view)
    memo: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    #: the process's place in the job (info.json): ``rank_id``, ``world_size`` and ``backend``
    #: (``N/A`` outside a distributed job); empty for a profile recorded without them
    job: Mapping[str, Any] = attrs.field(converter=frozen_map, factory=dict)
    #: the job's time base (epoch ns) timeline ``ts`` values count from; None: this process's
    #: own (see jobprof.plugin.clock)
    time_base_ns: int | None = None
    #: what a writer tells the user about this iteration's files, one sentence each (a cap it
    #: applied); the core says each distinct sentence once per profile with the iterations it
    #: concerns, and records it in info.json (``jobprof.export_notes``)
    notes: list[str] = attrs.field(factory=list, eq=False, repr=False)
    #: the time rule of timeline files (jobprof.plugin.clock.TimeAxis)
    axis: TimeAxis = attrs.field(init=False, repr=False, eq=False)

    @axis.default
    def _axis(self) -> TimeAxis:
        base = self.time_base_ns
        return TimeAxis(self.anchor, own_base(self.anchor) if base is None else base)

    def records(self, stream: str) -> list[Any]:
        return self.streams.get(stream, [])

    def to_us(self, monotonic_ns: int) -> float:
        """A timeline ``ts``: µs since the job's time base (jobprof.plugin.clock) of a raw timestamp."""
        return self.axis.us(monotonic_ns)

    #: a timeline ``dur`` from the span's two raw timestamps (exact: ts + dur is the end)
    dur_us = staticmethod(TimeAxis.dur)

    def stamp(self, monotonic_ns: int) -> str:
        """Exact epoch microseconds with 3 decimals, for CSV columns."""
        return self.anchor.stamp(monotonic_ns)

    def stamp_cell(self, monotonic_ns: int | None) -> str:
        """An absolute-time CSV cell as the contract writes it: exact epoch µs and a trailing
        TAB (spreadsheets then keep every digit), or ``N/A``."""
        return NA if monotonic_ns is None else f"{self.anchor.stamp(monotonic_ns)}\t"

    @staticmethod
    def csv(header: Iterable[Any], rows: Iterable[Iterable[Any]]) -> str:
        """A summary file's text: the header, then the rows (``\\n`` line ends)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        return out.getvalue()


@attrs.frozen
class WriterSpec:
    """A file a plugin renders per iteration: ``<name>_<device>_<model>_<iter>.<extension>``.

    ``render`` returns the file's text, or None to write nothing for that iteration, or
    ``{model id: text}`` for one file per model (graph mode: a compiled graph's files carry its
    Model ID instead of the iteration's).  JSON files go to ``timeline/``, CSV files to
    ``summary/``.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_]*$"))
    extension: str = attrs.field(validator=attrs.validators.in_(("json", "csv")))
    render: Callable[[ExportContext], str | Mapping[int, str] | None] = attrs.field(repr=False)
    description: str = ""

    @property
    def folder(self) -> str:
        return "timeline" if self.extension == "json" else "summary"

    def filename(self, device_id: int, model_id: int, iteration: int) -> str:
        return f"{self.name}_{device_id}_{model_id}_{iteration}.{self.extension}"



@attrs.frozen
class PluginRecord:
    """One row of ``jobprof plugins``."""

    name: str
    distribution: str
    version: str
    status: str  # active | disabled | failed
    error: str = ""
    option_keys: tuple[str, ...] = attrs.field(converter=str_tuple, factory=tuple)
    files: tuple[str, ...] = attrs.field(converter=str_tuple, factory=tuple)



@attrs.frozen
class PartSource:
    """A part of the iteration breakdown (``jobprof.analysis.breakdown.PARTS``) that the
    answering plugin measures (``jobprof_breakdown_sources``).  When the part is N/A on a rank,
    the summary says why: "<plugin> was off", or "<plugin> was on but <unseen>"."""

    part: str
    unseen: str
