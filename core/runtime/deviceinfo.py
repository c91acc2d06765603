"""What ``info.json``'s ``DeviceInfo`` says about the device's compute units, measured.

msprof writes the Ascend device's AI Core count (``ai_core_num``), its separate vector cores
(``aiv_num``) and clock (``aic_frequency``, MHz); msprof-analyze's advisor reads them (its
block-dim check compares a kernel's Block Dim with the core count).  Their counterparts here:

==================  ======================================  =====================================
key                 CUDA device                             CPU-only job
==================  ======================================  =====================================
ai_core_num         streaming multiprocessors               cores this process may run on
                    (``multi_processor_count``)             (``os.sched_getaffinity``)
aiv_num             0: no vector cores apart from them      0: no vector cores apart from them
aic_frequency       SM clock, MHz (``clock_rate``, torch    the highest clock the kernel reports
                    2.11+; else left out)                   (cpufreq max, else /proc/cpuinfo's
                                                            ``cpu MHz``), MHz; else left out
==================  ======================================  =====================================

``compute_units`` names which it is, so no reader mistakes an SM or a CPU core for an AI Core.
A value that cannot be read is left out, never guessed.
"""

from __future__ import annotations

import os
from typing import Any

CPUFREQ_MAX = "/sys/devices/system/cpu/cpu{}/cpufreq/cpuinfo_max_freq"


def cpu_units() -> dict[str, Any]:
    """The CPU cores this process may use and their clock (MHz), as far as Linux says."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = list(range(os.cpu_count() or 0))
    out: dict[str, Any] = {"compute_units": "CPU cores", "aiv_num": 0}
    if cores:
        out["ai_core_num"] = len(cores)
        mhz = _cpu_mhz(cores[0])
        if mhz:
            out["aic_frequency"] = str(mhz)
    return out


def _cpu_mhz(core: int) -> int | None:
    try:
        with open(CPUFREQ_MAX.format(core)) as handle:
            return round(int(handle.read().strip()) / 1000)  # kHz
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("cpu MHz"):
                    return round(float(line.split(":", 1)[1]))
    except (OSError, ValueError, IndexError):
        pass
    return None


def cuda_units(torch: Any, device: int) -> dict[str, Any]:
    """The CUDA device's SM count and SM clock (MHz) from torch's device properties."""
    out: dict[str, Any] = {"compute_units": "CUDA streaming multiprocessors", "aiv_num": 0}
    try:
        props = torch.cuda.get_device_properties(device)
    except Exception:
        return out
    count = getattr(props, "multi_processor_count", None)
    if isinstance(count, int) and count > 0:
        out["ai_core_num"] = count
    rate = getattr(props, "clock_rate", None)  # kHz, as CUDA's cudaDeviceProp
    if isinstance(rate, int) and rate > 0:
        out["aic_frequency"] = str(round(rate / 1000))
    return out
