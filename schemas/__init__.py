"""JSON Schemas shipped with jobprof: the core options schema and output-file contracts."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any


@cache
def load(name: str) -> dict[str, Any]:
    """Return the parsed schema ``<name>.json`` from this package (cached; do not mutate)."""
    return json.loads(files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8"))
