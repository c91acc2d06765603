"""attrs converters the value, record and result types share.

Typed functions, not ``tuple``/``frozenset`` themselves: attrs' mypy plugin takes an init
parameter's type from its converter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any


def frozen_map(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def name_set(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values)


def row_tuples(rows: Iterable[Iterable[Any]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(map(tuple, rows))
