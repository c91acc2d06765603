"""What the aic_metrics groups share: the :class:`Group` each module defines, and the per-task
arithmetic.

Private to this package (the package is the plugin; plugins of other packages never import
this).

Per task:

* duration: the task's measured duration (``Task Duration``), the denominator of every ratio
  and bandwidth;
* work: the task's FLOPs split by unit -- ``cube`` (matmul/conv family) or ``vector``
  (elementwise, full reductions) -- from :mod:`jobprof.plugin.opmath`; a copy moves data and computes
  nothing, a matmul has no vector work (its bias epilogue is not counted, as in opmath), an
  elementwise op no cube work.  Convolutions are exact where Kineto recorded their stride,
  padding and dilation (``Concrete Inputs``), else unknown;
* time a unit needs: work / the machine's measured peak for the op's dtype (``matmul_flops_per_s``
  / ``vector_flops_per_s`` / ``memory_bytes_per_s`` from the calibration in info.json).  Zero
  work needs zero time whatever the peak; work with no measured peak for its dtype is unknown;
* ratio: unit time / duration, NOT clamped: the calibration is the best torch reached on this
  machine in a short run, so an operator can beat it, and a ratio above 1 says exactly that
  (clamping would hide it);
* CUPTI (CUDA only, UNVERIFIED: no GPU was available where this was written): per-kernel
  counter values Kineto attaches to the kernel's metadata (the task's ``extra`` JSON), read by
  metric name.  Kineto's range profiler may instead emit them as separate
  ``cuda_profiler_range`` events; the core's operator tree would then have to join those to
  their kernels for these columns to fill.

Known limits on CUDA (UNVERIFIED): a task is a kernel and its FLOPs/bytes are those of the
operator that launched it, so an operator that launches several kernels (a GEMM with a split-K
reduction, a bias copy before the GEMM) shows its whole work on each of them; the task does not
say how many kernels its operator launched.

Calibration (the groups that need peaks): once, at the first root-module forward, on the
device of the module's first parameter (the CPU, or the GPU the model runs on).  Not at
``import torch``: a DataLoader worker started with ``spawn`` imports torch too but never runs a
forward, and CUDA must not be initialised by jobprof before the job does it.  The peaks are
measured once per machine and setting and reused (:mod:`jobprof.ops.calcache`: a file in
``$JOBPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/jobprof`` or ``~/.cache/jobprof``, keyed by the
host, CPU, torch build and settings and the device, 30 days at most, never one another
setting measured): a hit costs a few ms (key and file) before the first forward.  A miss
measures (about 0.3-2 s on CPU, seconds more with cold libraries), drawing its operands from
its own seeded generator, never from the program's; the time is jobprof's own, outside every
iteration (info.json's ``own_startup_ms["calibration"]``).  The result lands in info.json
(``jobprof.calibration``, with ``source`` ``measured`` / ``cache``, ``cache_file``,
``measured_at`` and ``cache_note``), where ``jobprof export`` finds it again; a cache that
cannot be used costs one warning and a measurement, never the job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from jobprof.plugin import NA, MetricSet, PluginSession, opmath

#: calibration keys (jobprof.ops.calibrate)
MATMUL_PEAK, VECTOR_PEAK, MEMORY_PEAK = "matmul_flops_per_s", "vector_flops_per_s", "memory_bytes_per_s"
KB = 1024
GB = 1e9

# -- a group ----------------------------------------------------------------------------------
@attrs.frozen
class Group:
    """One built-in group, as its module defines it: the ``op_summary`` columns it appends, the
    function filling them for one task, where each column's value comes from, and what the
    values need from the profiled process.

    ``peaks``: the values need the calibration (measured once, see :func:`calibrate_once`);
    ``cupti``: the CUPTI metrics per kernel the group reads on CUDA.
    """

    name: str
    columns: tuple[str, ...]
    values: Callable[[Any, Mapping], list] = attrs.field(repr=False)
    sources: Mapping[str, str] = attrs.field(repr=False)
    peaks: bool = False
    cupti: tuple[str, ...] = ()

    def metric_set(self) -> MetricSet:
        """What ``jobprof_aic_metrics`` answers for this group."""
        return MetricSet(self.name, self.columns, self.values, needs_shapes=True, needs_peaks=self.peaks,
                         sources=self.sources)

    def start(self, session: PluginSession) -> None:
        """Ask for operators with shapes (and CUPTI metrics), and measure
        the machine's peaks once when the group needs them."""
        session.request_ops(shapes=True, cupti_metrics=self.cupti)
        if self.peaks:
            calibrate_once(session)


def no_source(columns: tuple[str, ...]) -> Callable[[Any, Mapping], list]:
    """The values of a group whose every column has no source here: N/A for every task."""
    row = [NA] * len(columns)
    return lambda task, machine: list(row)


def calibrate_once(session: PluginSession) -> None:
    """info.json's ``jobprof.calibration``: the peaks of the device the model runs on, from the
    calibration cache or measured at its first root-module forward (the CUDA path is UNVERIFIED
    on a GPU here)."""
    import torch

    if session.get_info("calibration") is not None:
        return
    done: list[bool] = []

    def on_root(module: Any) -> None:
        if done:
            return
        done.append(True)
        device = "cpu"
        try:
            parameter = next(module.parameters(), None)
            if parameter is not None:
                device = str(parameter.device)
        except Exception:
            pass
        _record(session, torch, device)

    session.on_root_module(on_root, "calibration")


def _record(session: PluginSession, torch: Any, device: str) -> None:
    from jobprof.ops.calibrate import calibrate_cached

    def warn(text: str) -> None:
        session.reporter.warning(f"aic_metrics: {text}")

    result = calibrate_cached(torch, device, warn=warn)  # never raises: cache problems are one warning
    session.set_info("calibration", result)
    if "error" in result:
        session.reporter.warning(f"aic_metrics: measuring the peaks of {device} failed ({result['error']}); "
                                 "the utilisation columns are N/A")


# -- per task --------------------------------------------------------------------------------
class Peaks:
    """The calibration's peaks by Kineto dtype spelling (built once per calibration mapping)."""

    __slots__ = ("bandwidth", "matmul", "vector")

    def __init__(self, machine: Mapping[str, Any]) -> None:
        self.matmul = _by_kineto_dtype(machine.get(MATMUL_PEAK))
        self.vector = _by_kineto_dtype(machine.get(VECTOR_PEAK))
        value = machine.get(MEMORY_PEAK)
        self.bandwidth = float(value) if isinstance(value, (int, float)) and value > 0 else None


def _by_kineto_dtype(table: Any) -> dict[str, float]:
    if not isinstance(table, Mapping):
        return {}
    out = {}
    for kineto, torch_name in opmath.TORCH_DTYPE.items():
        value = table.get(torch_name)
        if isinstance(value, (int, float)) and value > 0:
            out[kineto] = float(value)
    return out


_last_peaks: tuple[Any, Peaks | None] = (None, None)
#: one Peaks per distinct calibration: every iteration's mapping is a new object with the same
#: content, and the per-operator memo below is keyed by the Peaks object
_PEAKS: dict[tuple[Any, ...], Peaks] = {}


def peaks_of(machine: Mapping[str, Any]) -> Peaks:
    """The Peaks of ``machine`` (the export hands every task of an iteration the same mapping)."""
    global _last_peaks
    last = _last_peaks
    if last[0] is machine and last[1] is not None:
        return last[1]
    fresh = Peaks(machine)
    key = (tuple(sorted(fresh.matmul.items())), tuple(sorted(fresh.vector.items())), fresh.bandwidth)
    result = _PEAKS.setdefault(key, fresh)
    _last_peaks = (machine, result)
    return result


class Work:
    """A task's duration-independent figures, shared by every task of the same operator call
    (same name, FLOPs, bytes, dtype) under the same calibration.

    ``cube``/``vector``: FLOPs per unit; ``read``/``written``: bytes; ``mac``/``vec``/``mte2``/
    ``mte3``: seconds each needs at the measured peak (None: unknown); ``dtype``: Kineto dtype
    of the op's data.  ``cells``: a group's formatted cells that do not depend on the duration,
    kept here so each distinct operator call is formatted once.
    """

    __slots__ = ("cells", "cube", "dtype", "mac", "mte2", "mte3", "read", "vec", "vector", "written")

    def __init__(self, name: str | None, count: int | None, moved: tuple[int, int] | None, kind: str | None,
                 p: Peaks) -> None:
        self.cube, self.vector = work(name, count) if name is not None else (None, None)
        self.read: int | None = moved[0] if moved is not None else None
        self.written: int | None = moved[1] if moved is not None else None
        self.dtype = kind
        self.mac = unit_time(self.cube, None if kind is None else p.matmul.get(kind))
        self.vec = unit_time(self.vector, None if kind is None else p.vector.get(kind))
        self.mte2 = unit_time(self.read, p.bandwidth)
        self.mte3 = unit_time(self.written, p.bandwidth)
        self.cells: dict[str, Any] = {}


#: (op name, FLOPs, bytes, dtype, peaks) -> Work
_WORK: dict[tuple[Any, ...], Work] = {}
_WORK_LIMIT = 65536


def derive(task: Any, machine: Mapping[str, Any]) -> tuple[float | None, Work]:
    """(the task's duration in seconds or None, its :class:`Work`); rules in the module docstring."""
    p = peaks_of(machine)
    host = task.host
    seconds = task.dur / 1e9 if task.dur > 0 else None
    if host is None:  # a device task no operator launched: nothing is known of its work
        key: tuple[Any, ...] = (None, None, None, None, p)
        name = count = moved = kind = None
    else:
        name, count, moved, outputs = host.name, task.flops, task.bytes_moved, task.outputs
        kind = outputs[1][0] if outputs is not None and outputs[1] else _first_tensor_dtype(task.dtypes)
        key = (name, count, moved, kind, p)
    found = _WORK.get(key)
    if found is None:
        found = Work(name, count, moved, kind, p)
        if len(_WORK) >= _WORK_LIMIT:
            _WORK.clear()
        _WORK[key] = found
    return seconds, found


def _first_tensor_dtype(dtypes: Any) -> str | None:
    for d in dtypes or ():
        if d in opmath.DTYPE_BYTES:
            return d
    return None


def work(name: str, count: int | None) -> tuple[int | None, int | None]:
    """(cube FLOPs, vector FLOPs) of operator ``name`` whose opmath FLOPs are ``count``."""
    unit = opmath.unit(name)
    if unit == opmath.CUBE:
        return count, 0
    if unit == opmath.VECTOR:
        return 0, count
    if unit == opmath.COPY or count == 0:
        return 0, 0
    return None, None


def seconds(task: Any) -> float | None:
    return task.dur / 1e9 if task.dur > 0 else None


def unit_time(amount: int | None, rate: float | None) -> float | None:
    """Seconds ``amount`` (FLOPs or bytes) takes at ``rate`` per second; zero work takes none."""
    if amount is None:
        return None
    if amount == 0:
        return 0.0
    return None if rate is None else amount / rate


def ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return part / whole


def ratio_cell(part: float | None, whole: float | None) -> str:
    """``part / whole`` with 3 decimals, or N/A."""
    if part is None or not whole:
        return NA
    return f"{part / whole:.3f}"


# -- cells -----------------------------------------------------------------------------------
def f3(value: float | None) -> str:
    return NA if value is None else f"{value:.3f}"


def us(value_s: float | None) -> str:
    return NA if value_s is None else f"{value_s * 1e6:.3f}"


def duration_us(task: Any) -> str:
    return f"{task.dur / 1000:.3f}"


def integer(value: int | float | None) -> str:
    return NA if value is None else str(int(value))


# -- CUPTI (CUDA, UNVERIFIED) ----------------------------------------------------------------
def counters(task: Any, names: tuple[str, ...]) -> dict[str, float]:
    """The CUPTI metric values among ``names`` in the task's Kineto metadata (``extra``); empty on
    CPU or when none were recorded.  Kineto writes metadata as JSON members, sometimes without
    the outer braces; a metric may sit at the top level or one level down."""
    extra = task.extra
    if not extra or not names:
        return {}
    if isinstance(extra, str):
        text = extra.strip()
        try:
            extra = json.loads(text if text.startswith("{") else "{" + text + "}")
        except ValueError:
            return {}
    if not isinstance(extra, Mapping):
        return {}
    found: dict[str, float] = {}
    scopes = [extra, *(v for v in extra.values() if isinstance(v, Mapping))]
    for name in names:
        for scope in scopes:
            value = scope.get(name)
            if isinstance(value, (int, float)) or (isinstance(value, str) and _number(value)):
                found[name] = float(value)
                break
    return found


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
