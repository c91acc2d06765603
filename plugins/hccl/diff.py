"""hccl's table for ``jobprof diff``: every collective (op, process group) of a device, with its
calls, bytes and time over the selected iterations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobprof.plugin import CollectiveRecord, DiffCount, DiffTable
from jobprof.plugins.hccl.writer import STREAM

if TYPE_CHECKING:
    from jobprof.plugin import Profile


def _collective(raw: Any) -> tuple[tuple[str, str], int, int] | None:
    """A raw hccl record's ((op, group), bytes, ns), or None when it has no usable duration; raises
    ValueError when it is not shaped as this plugin writes it (:class:`CollectiveRecord`, with a
    group)."""
    r = CollectiveRecord.from_raw(raw)
    group = None if r is None else r.group_desc or r.group
    if r is None or not isinstance(group, str):
        raise ValueError("not a hccl record (op, group, start_ns, end_ns, bytes)")
    if r.duration_unknown:
        return None
    return (r.op, group), r.bytes or 0, r.end_ns - r.start_ns


def collective_tables(profile: Profile, device: int) -> list[DiffTable]:
    """The device's collective table; always returned (``present`` is False when the device has
    no hccl record), so the diff can say that only one side has collectives."""
    per: dict[tuple[str, str], list[int]] = {}
    seen = False
    bad = 0
    for r in profile.records(STREAM, device):
        seen = True
        try:
            found = _collective(r) if isinstance(r, dict) else None
        except ValueError:
            bad += 1
            continue
        if found is None:
            continue
        key, size, ns = found
        c = per.setdefault(key, [0, 0, 0])  # calls, bytes, ns
        c[0] += 1
        c[1] += size
        c[2] += ns
    if bad:
        profile.problem(f"{profile.folder(device) / 'data'}: {bad} hccl record(s) not shaped as the "
                         "hccl plugin writes them (op, group, start_ns, end_ns, bytes): left out")
    return [DiffTable(
        "collectives", "Collectives per iteration of one rank ({shown} of {total} by |Δ ms|)",
        ("op", "group"), ("op", "group"),
        {key: DiffCount(calls, ns, bytes=size) for key, (calls, size, ns) in per.items()},
        present=seen, sizes=True, present_key="hccl",
        one_sided_note="only one side has hccl data: no collective comparison", order=20)]
