"""The ``dp`` stream's record that only dp reads (the shared ones are declared in
``jobprof.plugin``: :class:`~jobprof.plugin.BatchRecord`, :class:`~jobprof.plugin.WorkerFetchRecord`),
and the stream's one decoder (:func:`dp_record`, :func:`profile_records`): dp reads its records
by name, never by raw key."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard

import attrs

from jobprof.plugin import BatchRecord, WorkerFetchRecord

if TYPE_CHECKING:
    from jobprof.plugin import Profile


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@attrs.frozen
class LoaderRecord:
    """What a DataLoader is: a ``k: "loader"`` record of the ``dp`` stream, once per iteration
    for each loader that iteration used (raw keys ``l``, ``dataset``: the dataset's class name,
    ``workers``: its ``num_workers``)."""

    STREAM: ClassVar[str] = "dp"
    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "loader"

    loader: int
    dataset: str
    workers: int

    @classmethod
    def from_raw(cls, raw: Any) -> LoaderRecord | None:
        if not isinstance(raw, Mapping) or raw.get("k") != cls.KIND:
            return None
        loader, dataset, workers = raw.get("l"), raw.get("dataset"), raw.get("workers")
        if not (_int(loader) and isinstance(dataset, str) and _int(workers)):
            return None
        return cls(loader, dataset, workers)

    def to_raw(self) -> dict[str, Any]:
        return {"k": self.KIND, "l": self.loader, "dataset": self.dataset, "workers": self.workers}


#: a record of the ``dp`` stream, by its kind (raw ``k``)
DpRecord = BatchRecord | WorkerFetchRecord | LoaderRecord


def dp_record(raw: Any) -> DpRecord | None:
    """The record of a raw ``dp`` record, of whichever kind it is, or None when it is not
    shaped as dp writes it."""
    return BatchRecord.from_raw(raw) or WorkerFetchRecord.from_raw(raw) or LoaderRecord.from_raw(raw)


def profile_records(profile: Profile, device: int) -> Iterator[tuple[int, DpRecord]]:
    """``(iteration, record)`` of every well-formed ``dp`` record of ``device``, in one pass over
    the stream (``Profile.typed`` would read it once per kind)."""
    for raw in profile.records(BatchRecord.STREAM, device):
        record = dp_record(raw)
        if record is not None:
            yield raw["_iteration"], record
