"""The one piece of mutable global state: the process's profiling session (or None)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobprof.runtime.session import Session

SESSION: Session | None = None
