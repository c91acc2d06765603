"""hccl's table for ``jobprof diff``: every collective (op, process group) of a device, with its
calls, bytes and time over the selected iterations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobprof.plugin import DiffCount, DiffTable
from jobprof.plugins.hccl.writer import STREAM

if TYPE_CHECKING:
    from jobprof.plugin import Profile


def _collective(r: dict[str, Any]) -> tuple[tuple[str, str], int, int] | None:
    """A hccl record's ((op, group), bytes, ns), or None when it has no usable duration; raises
    ValueError when it is not shaped as this plugin writes it."""
    if r.get("duration_unknown") or r.get("end_ns") is None:
        return None
    start, end, size = r.get("start_ns"), r["end_ns"], r.get("bytes") or 0
    group = r.get("group_desc") or r.get("group")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, size)) \
            or not isinstance(r.get("op"), str) or not isinstance(group, str) or end < start:
        raise ValueError("not a hccl record (op, group, start_ns, end_ns, bytes)")
    return (r["op"], group), size, end - start


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
        c = per.setdefault(found[0], [0, 0, 0])
        c[0] += 1
        c[1] += found[1]
        c[2] += found[2]
    if bad:
        profile.problem(f"{profile.folder(device) / 'data'}: {bad} hccl record(s) not shaped as the "
                         "hccl plugin writes them (op, group, start_ns, end_ns, bytes): left out")
    return [DiffTable(
        "collectives", "Collectives per iteration of one rank ({shown} of {total} by |Δ ms|)",
        ("op", "group"), ("op", "group"),
        {key: DiffCount(calls, ns, bytes=size) for key, (calls, size, ns) in per.items()},
        present=seen, sizes=True, present_key="hccl",
        one_sided_note="only one side has hccl data: no collective comparison", order=20)]
