"""Is it valid? answered fast; why not? answered well.

jsonschema (Python) explains every error the way the messages need (paths, the failing
keyword, the alternatives of an ``anyOf``), but importing it takes 0.1 s, and 1.1 s where
``rfc3987-syntax`` is installed (a Jupyter environment: jsonschema's format module builds that
package's grammar at import).  Every profiled process pays it at start-up, before the program
runs, and nearly always to hear "valid".  jsonschema-rs (Rust, the same Draft 2020-12) imports
in milliseconds, so it answers that question (are the options valid? is a plugin's fragment a
schema?) and jsonschema is imported only to explain a "no".  Where jsonschema-rs is missing or
cannot take a value (an integer past 64 bits, a NaN), jsonschema answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

jsonschema_rs: Any
try:
    import jsonschema_rs
except ImportError:  # no wheel for this platform: jsonschema does it all
    jsonschema_rs = None


class SchemaProblem(ValueError):
    """A schema that is not a valid Draft 2020-12 schema (``message`` says why)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def is_valid(schema: Mapping[str, Any], instance: Any) -> bool:
    """Whether ``instance`` is valid against the Draft 2020-12 ``schema``."""
    if jsonschema_rs is not None:
        try:
            return bool(jsonschema_rs.Draft202012Validator(dict(schema)).is_valid(instance))
        except Exception:  # a value it cannot convert: jsonschema decides
            pass
    import jsonschema

    return bool(jsonschema.Draft202012Validator(schema).is_valid(instance))


def schema_error(schema: Any) -> str | None:
    """None when ``schema`` is a valid Draft 2020-12 schema, else what is wrong (jsonschema's
    words)."""
    if jsonschema_rs is not None and isinstance(schema, Mapping):
        try:
            if jsonschema_rs.meta.is_valid(dict(schema)):
                return None
        except Exception:
            pass
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return str(exc.message)
    return None
