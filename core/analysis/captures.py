"""The captures of dynamic mode in ``jobprof summary`` / ``report``: a capture's own folder
says why it ran (info.json ``jobprof.capture``); the job's folder lists every capture its
ranks made (their status files in ``control/``, see :mod:`jobprof.files.control`)."""

from __future__ import annotations

import json
from typing import Any

from jobprof.analysis.profile import Profile
from jobprof.files import control, fsio
from jobprof.plugin.results import Section

#: status files read from a job's control folder at most (a profile from elsewhere is untrusted)
MAX_STATUS_FILES = 4096


def sections(profile: Profile) -> list[Section]:
    """The ``capture`` section (this folder is a capture) and the ``captures`` section (this
    folder is a job in dynamic mode that made captures); none when neither."""
    found: list[Section] = []
    rows: dict[Any, list[Any]] = {}
    for device in profile.devices:
        capture = profile.info(device).get("jobprof", {}).get("capture")
        if not isinstance(capture, dict):
            continue
        key = capture.get("id")
        ranks = rows.setdefault(key, [capture, []])[1]
        ranks.append(f"{profile.rank(device)}: {capture.get('first', 'N/A')}-{capture.get('last', 'N/A')}")
    if rows:
        table = []
        for capture, ranks in rows.values():
            asked = capture.get("asked") or ["N/A", "N/A"]
            table.append((capture.get("id"), capture.get("trigger"), f"{asked[0]}-{asked[1]}",
                          ", ".join(ranks),
                          capture.get("reason"), capture.get("by"), capture.get("job")))
        found.append(Section("Capture (dynamic mode)",
                             ("capture", "trigger", "asked", "captured (rank: iterations)",
                                                        "why", "by", "job folder"), table, key="capture"))
    listed = _listed(profile)
    if listed:
        found.append(Section("Captures of this job (dynamic mode)",
                             ("capture", "trigger", "iterations", "state", "folder", "why"),
                             [(c.get("id"), c.get("trigger"), f"{c.get('first')}-{c.get('last')}",
                               c.get("state"), c.get("prof_dir"), c.get("reason")) for c in listed],
                             key="captures",
                             notes=("each capture is a PROF_ folder of its own beside this one: "
                                    "`jobprof summary <output>/<folder>`",)))
    return found


def _listed(profile: Profile) -> list[dict[str, Any]]:
    folder = control.folder_of(profile.path)
    try:
        names = control.entries(folder)[2][:MAX_STATUS_FILES]
    except OSError:
        return []
    seen: dict[int, dict[str, Any]] = {}
    for name in names:
        try:
            with fsio.open_read(folder / name) as handle:
                data = json.loads(handle.read(control.MAX_BYTES))
        except (OSError, ValueError):
            continue
        for entry in data.get("captures", []) if isinstance(data, dict) else []:
            if isinstance(entry, dict) and isinstance(entry.get("id"), int):
                seen.setdefault(entry["id"], entry)
    return [seen[k] for k in sorted(seen)]
