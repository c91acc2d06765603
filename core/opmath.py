"""FLOPs, bytes moved and output shapes of an operator, computed from its input shapes.

(Stub: filled in with the aic_metrics groups.)
"""

from __future__ import annotations

from typing import Any


def flops(name: str, shapes: list[Any], dtypes: list[Any]) -> int | None:
    return None


def bytes_moved(name: str, shapes: list[Any], dtypes: list[Any]) -> tuple[int, int] | None:
    return None


def output_meta(name: str, shapes: list[Any], dtypes: list[Any]) -> tuple[list[Any], list[str]] | None:
    return None
