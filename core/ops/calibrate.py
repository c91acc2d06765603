"""Machine peaks, measured once, that derived metrics divide by.

aic_metrics turns an operator's FLOPs and bytes into utilisation ratios; the denominators are
what this machine reaches with torch itself -- measured here, never taken from a data sheet, so
a ratio near 1 means "as fast as torch gets on this device".  Three figures, each the best of
several timed runs:

- matmul FLOP/s: ``torch.mm`` on square n x n matrices (2 n^3 FLOP), n grown from 256 until one
  run takes a few ms (smaller sizes are dominated by call overhead);
- vector FLOP/s: ``torch.add(a, b, out=c)`` (1 FLOP per element) on operands that stay in cache,
  so it is the elementwise peak and not memory bandwidth in disguise;
- memory bytes/s: ``dst.copy_(src)`` on a buffer larger than the last-level cache, counted as
  2 x nbytes per copy (every byte is read once and written once).

CPU ops run on torch's intra-op threads, so the CPU figures hold for ``torch.get_num_threads()``
threads, which the result records.  Nothing global is changed (thread count, matmul precision,
allocator, and no random draw from the program's generators: operands come from jobprof's own
seeded ``torch.Generator``); every buffer is released when its phase returns.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIB = 1 << 20
#: one timed run should last about this long: long enough that call overhead does not count
TARGET_RUN_S = 0.002
MIN_RUNS = 3
MAX_RUNS = 20
#: share of the budget per phase
SHARES = {"matmul": 0.4, "vector": 0.2, "memory": 0.4}

METHOD = ("best of >= 3 timed runs each: torch.mm n x n (2*n^3 FLOP, n grown from 256 until a run takes "
          "~2 ms); torch.add(a, b, out=c) on cache-resident operands (1 FLOP/element); dst.copy_(src) on "
          "a buffer larger than the last-level cache (bytes = 2 x nbytes: read + write)")
#: the method's version: bump it whenever what is measured or how changes, so that results cached
#: by an older method (jobprof.ops.calcache) are measured again
METHOD_VERSION = 1
DEFAULT_BUDGET_S = 0.3


def calibrate(torch: Any, device: str = "cpu", budget_s: float = DEFAULT_BUDGET_S) -> dict[str, Any]:
    """Peak matmul and vector FLOP/s and memory bandwidth of ``device``, as a JSON-ready dict.

    Takes roughly ``budget_s`` (each phase stops after its share once it has its minimum of runs).
    Never raises: a failure gives ``{"device": device, "error": message}``.
    """
    started = time.perf_counter()
    try:
        result = _calibrate(torch, device, budget_s)
    except Exception as exc:  # calibration is an extra; it must never take the job down
        return {"device": device, "error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.perf_counter() - started, 4)
    return result


def calibrate_cached(torch: Any, device: str = "cpu", warn: Callable[[str], None] | None = None,
                     **options: Any) -> dict[str, Any]:
    """:func:`calibrate`, measured once per machine and setting: read from the user's
    calibration cache when a usable result is there, else measured and kept
    (:mod:`jobprof.ops.calcache`, imported only when this is called; ``options`` go to its
    ``calibrate``).  Never raises; cache problems go to ``warn`` in one message."""
    from jobprof.ops import calcache

    options.setdefault("measure", calibrate)
    return calcache.calibrate(torch, device, method=method_key(), warn=warn, **options)


def method_key() -> dict[str, Any]:
    """What identifies this method in a cached result's key (:data:`METHOD_VERSION`, the text of
    :data:`METHOD`, the default budget)."""
    return {"version": METHOD_VERSION, "text": hashlib.sha256(METHOD.encode()).hexdigest()[:16],
            "budget_s": DEFAULT_BUDGET_S}


def _calibrate(torch: Any, device: str, budget_s: float) -> dict[str, Any]:
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{device}: CUDA is not available to this torch (torch.cuda.is_available() "
                               "is False)")
        # the device context is restored on exit: the job's current device is left as it was
        with torch.cuda.device(dev):
            return _run(torch, dev, budget_s, _CudaTimer(torch))
    if dev.type != "cpu":
        raise ValueError(f"{device}: only cpu and cuda devices can be calibrated")
    return _run(torch, dev, budget_s, _cpu_time)


def _run(torch: Any, dev: Any, budget_s: float, timer: Callable[[Callable[[], None]], float]) -> dict:
    cuda = dev.type == "cuda"
    # our own stream of random operands: the program's seeded draws must come out as unprofiled
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    dtypes = ("float32", "bfloat16", "float16") if cuda else ("float32",)
    clock = time.perf_counter()
    matmul: dict[str, float] = {}
    matmul_n: dict[str, int] = {}
    share = budget_s * SHARES["matmul"] / len(dtypes)
    for name in dtypes:
        clock += share
        matmul[name], matmul_n[name] = _matmul(torch, dev, getattr(torch, name), timer, clock, cuda, gen)
    clock += budget_s * SHARES["vector"]
    vector, vector_n = _vector(torch, dev, timer, clock, cuda, gen)
    clock += budget_s * SHARES["memory"]
    buffer_bytes = _buffer_bytes(torch, dev)
    memory = _memory(torch, dev, buffer_bytes, timer, clock)
    result: dict[str, Any] = {
        "device": str(dev),
        "method": METHOD,
        "matmul_flops_per_s": matmul,
        "matmul_n": matmul_n,
        "vector_flops_per_s": {"float32": vector},
        "vector_elements": vector_n,
        "memory_bytes_per_s": memory,
        "memory_buffer_bytes": buffer_bytes,
        "memory_bytes_counted": "2 x buffer bytes per copy (read + write)",
        "threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if cuda:
        # float32 matmul on TF32 tensor cores is several times faster: the figure depends on it
        result["tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        result["device_name"] = torch.cuda.get_device_name(dev)
    return result


def _cpu_time(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class _CudaTimer:
    """Device-side time between two CUDA events around ``fn`` (unverified here: no GPU on this machine)."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __call__(self, fn: Callable[[], None]) -> float:
        start = self._torch.cuda.Event(enable_timing=True)
        end = self._torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # ms -> s


def _best(timer: Callable[[Callable[[], None]], float], fn: Callable[[], None], deadline: float) -> float:
    """Shortest of at least MIN_RUNS timed runs, more while the phase has time left."""
    best = math.inf
    for run in range(MAX_RUNS):
        best = min(best, timer(fn))
        if run + 1 >= MIN_RUNS and time.perf_counter() >= deadline:
            break
    return best


def _matmul(torch: Any, dev: Any, dtype: Any, timer, deadline: float, cuda: bool,
            gen: Any) -> tuple[float, int]:
    cap = 8192 if cuda else 4096
    best_rate, best_n, n = 0.0, 0, 256
    while True:
        a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
        c = torch.empty(n, n, device=dev, dtype=dtype)

        def mm(a=a, b=b, c=c) -> None:
            torch.mm(a, b, out=c)

        timer(mm)  # warm-up: kernel selection, thread pool start, first touch of c
        seconds = _best(timer, mm, deadline)
        rate = 2 * n**3 / seconds
        if rate > best_rate:
            best_rate, best_n = rate, n
        del a, b, c, mm
        # a larger n takes 8x longer: stop once a run is long enough or the next would overrun
        if seconds >= TARGET_RUN_S or n >= cap or time.perf_counter() + 8 * seconds * MIN_RUNS > deadline:
            return _tidy(best_rate), best_n
        n *= 2


def _vector(torch: Any, dev: Any, timer, deadline: float, cuda: bool, gen: Any) -> tuple[float, int]:
    # CPU: 3 operands of up to 4 MiB stay in a server's L2/L3; a GPU needs more elements to fill it
    sizes = (1 << 20, 1 << 22, 1 << 24) if cuda else (1 << 16, 1 << 18, 1 << 20)
    best_rate, best_n = 0.0, 0
    for index, n in enumerate(sizes):
        a = torch.rand(n, device=dev, generator=gen)
        b = torch.rand(n, device=dev, generator=gen)
        c = torch.empty(n, device=dev)

        def add(a=a, b=b, c=c) -> None:
            torch.add(a, b, out=c)

        # one add is microseconds: time a batch of them, sized to ~TARGET_RUN_S
        timer(add)  # warm-up: first touch of c
        single = max(timer(add), 1e-7)
        repeat = max(1, min(10_000, int(TARGET_RUN_S / single)))

        def batch(add=add, repeat=repeat) -> None:
            for _ in range(repeat):
                add()

        # this size gets an equal slice of what is left of the phase
        now = time.perf_counter()
        seconds = _best(timer, batch, now + (deadline - now) / (len(sizes) - index))
        rate = n * repeat / seconds
        if rate > best_rate:
            best_rate, best_n = rate, n
        del a, b, c, add, batch
    return _tidy(best_rate), best_n


def _memory(torch: Any, dev: Any, nbytes: int, timer, deadline: float) -> float:
    # ones, not empty: untouched pages all map the kernel's zero page and reading them moves nothing
    src = torch.ones(nbytes // 4, device=dev)
    dst = torch.empty_like(src)

    def copy(src=src, dst=dst) -> None:
        dst.copy_(src)

    timer(copy)  # warm-up: first touch of dst
    seconds = _best(timer, copy, deadline)
    del src, dst, copy
    return _tidy(2 * nbytes / seconds)


def _buffer_bytes(torch: Any, dev: Any) -> int:
    """Copy buffer: src + dst together at least 4x the last-level cache, and 64 MiB (256 on a GPU) or more."""
    if dev.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0
        return max(256 * MIB, 2 * l2)
    return min(max(64 * MIB, 2 * _cpu_llc_bytes()), 1024 * MIB)


def _cpu_llc_bytes() -> int:
    """Largest cache of CPU 0 from sysfs (Linux), 0 when unknown."""
    largest = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            largest = max(largest, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return largest


def _tidy(value: float) -> float:
    """Four significant digits: the run-to-run spread is larger than that."""
    return float(f"{value:.4g}")
