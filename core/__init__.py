"""jobprof: a zero-code-change profiler for PyTorch jobs that writes the msprof file set.

This module is imported at interpreter start when ``PROFILING_MODE`` is set, so it imports
nothing: the public API below reaches the session lazily.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "mstx", "step"]


def __getattr__(name: str) -> object:
    # ``import jobprof; jobprof.mstx.mark(...)`` without paying for the submodule at start-up
    if name == "mstx":
        import importlib

        return importlib.import_module("jobprof.mstx")
    raise AttributeError(f"module 'jobprof' has no attribute {name!r}")


def step() -> None:
    """Mark the end of one training iteration explicitly.

    Optional: jobprof finds iterations by itself (optimizer step, ``backward()``, root-module
    forward).  Once a script calls ``jobprof.step()``, explicit marks win over every automatic
    method for the rest of the run.  A no-op when profiling is off.

    Example::

        for batch in loader:
            train_one(batch)
            jobprof.step()
    """
    from jobprof.runtime import _state

    session = _state.SESSION
    if session is not None:
        session.explicit_step()
