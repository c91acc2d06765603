"""What differs between the torch versions jobprof supports (2.9 - 2.14), in one place.

Every difference is found by probing the feature (a keyword a constructor takes, an attribute
that exists), never by comparing version strings: a patch release or a vendor build that
backports a feature gets it, one that drops it degrades here and nowhere else.

What the operator capture needs from torch, and where versions differ:

* the profiler entry points ``torch.autograd._prepare_profiler`` / ``_enable_profiler`` /
  ``_disable_profiler`` / ``_profiler_enabled`` and ``_ProfilerResult.save`` (Kineto writes its
  Chrome trace): the same on every supported version;
* ``_ExperimentalConfig(trace_only=True)`` (2.13 on): Kineto skips building the Python-facing
  event list at each disable, ~40% of a cut's cost; older versions build it and jobprof never
  reads it (:func:`experimental_config`);
* ``torch.autograd.profiler._set_is_profiler_enabled``: compiled code reads that flag to open its
  ranges (:func:`set_python_flag`);
* ``_KinetoEvent``'s accessors differ most (``activity_type``, ``structured_input_strides`` and
  ten more appeared in 2.13), which is why jobprof never calls them: operators are read from
  Kineto's trace files, whose fields are the same on every version
  (:mod:`jobprof.files.kinetotrace`).
"""

from __future__ import annotations

from typing import Any


def experimental_config(metrics: list[str]) -> Any:
    """Kineto's experimental config for the capture.  ``metrics``: CUPTI metrics to measure per
    kernel (CUDA; empty for none)."""
    from torch._C._profiler import _ExperimentalConfig

    if metrics:
        return _ExperimentalConfig(profiler_metrics=metrics, profiler_measure_per_kernel=True)
    try:  # no KinetoEvent list built at each disable (save() still works)
        return _ExperimentalConfig(trace_only=True)
    except TypeError:  # a torch without the option builds the list; nothing reads it
        return _ExperimentalConfig()


def profiler_config(shapes: bool, experimental: Any, memory: bool = False) -> Any:
    """The ``ProfilerConfig`` of a Kineto session: input shapes and allocator events
    (``memory``) as asked, no stack, FLOP or module records (jobprof computes FLOPs from shapes;
    the others cost per op)."""
    from torch.autograd import ProfilerConfig, ProfilerState

    return ProfilerConfig(ProfilerState.KINETO, shapes, memory, False, False, False, experimental)


def set_python_flag(profiler_module: Any, on: bool) -> None:
    """torch.profiler's Python-side "a profiler runs" flag, set as torch's own profiler sets
    it: compiled code reads it to open its ranges (Inductor's ``## Call CompiledFxGraph <key>
    ##``, Triton launches, Dynamo's wrappers), and Inductor's autotuner to not start a profiler
    of its own inside ours (which would end our capture).  Absent: nothing to set."""
    setter = getattr(profiler_module, "_set_is_profiler_enabled", None)
    if callable(setter):
        try:
            setter(on)
        except Exception:
            pass
