"""The ``dp`` stream's record that only dp reads (the shared ones are declared in
``jobprof.plugin``: :class:`~jobprof.plugin.BatchRecord`, :class:`~jobprof.plugin.WorkerFetchRecord`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeGuard

import attrs


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
