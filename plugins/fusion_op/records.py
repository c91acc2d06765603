"""fusion_op's own record: torch.compile's counters, read only by fusion_op."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeGuard

import attrs


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@attrs.frozen
class CompileCountersRecord:
    """torch.compile's own counts at an iteration's end (``compile_counters`` stream, one
    record per iteration, written by fusion_op from ``torch._dynamo.utils.counters``, read only
    without adding a key): graphs Dynamo built, graph breaks (all reasons), frames compiled,
    and the recompiles (compile ids ``n/k`` with ``k > 0``) so far; None where torch has no count."""

    STREAM: ClassVar[str] = "compile_counters"
    VERSION: ClassVar[int] = 1

    unique_graphs: int | None = None
    graph_breaks: int | None = None
    frames: int | None = None
    recompiles: int | None = None

    @classmethod
    def from_raw(cls, raw: Any) -> CompileCountersRecord | None:
        if not isinstance(raw, Mapping):
            return None
        values = [raw.get(k) for k in ("unique_graphs", "graph_breaks", "frames", "recompiles")]
        return cls(*values) if all(v is None or _int(v) for v in values) else None

    def to_raw(self) -> dict[str, Any]:
        return {"unique_graphs": self.unique_graphs, "graph_breaks": self.graph_breaks, "frames": self.frames,
                "recompiles": self.recompiles}
