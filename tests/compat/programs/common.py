"""What every matrix program does around its own training code: seed, determinism, and the
checks of what the program can see (saving, copying, averaging, RNG streams) printed to stdout.

Plain user code: nothing here knows jobprof.  Imported by the programs beside it.
"""

import copy
import io
import itertools
import os
import random
import sys
import time

import numpy as np
import torch


def seed(value: int = 0) -> None:
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


_loss_times: list[float] = []


def loss(step: int, value) -> None:
    """One loss, exactly: repr of a float round-trips, so equal text means equal bits.

    With ``COMPAT_SLOW_STEP=k`` the program then sleeps twice its longest step since step 0
    (plus 20 ms) after step ``k``, so the next iteration is the slow one a dynamic-mode trigger
    (``slow_iteration``) must see whatever the machine's load: the median of the three
    iterations before it is at most the longer of the last two.  Only time changes."""
    print(f"loss {step} {float(value)!r}", flush=True)
    _loss_times.append(time.perf_counter())
    if str(step) == os.environ.get("COMPAT_SLOW_STEP") and len(_loss_times) >= 2:
        longest = max(b - a for a, b in itertools.pairwise(_loss_times))
        time.sleep(2 * longest + 0.02)


def save_copy_average(model, label: str) -> None:
    """torch.save, copy.deepcopy and AveragedModel of the program's own model must work."""
    from torch.optim.swa_utils import AveragedModel

    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=False)
    copy.deepcopy(model)
    AveragedModel(model)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    print(f"saved {label} hooks={hooks}", flush=True)


def rng_tail() -> None:
    """The program's RNG streams after training: CPU torch, random, numpy."""
    print("rng torch", repr(torch.rand(3).tolist()), flush=True)
    print("rng random", repr(random.random()), flush=True)
    print("rng numpy", repr(np.random.rand(2).tolist()), flush=True)
    if torch.cuda.is_available():
        print("rng cuda", repr(torch.rand(2, device="cuda").tolist()), flush=True)


def compile_counters() -> None:
    """torch.compile's own counts: graphs, recompiles, graph breaks."""
    from torch._dynamo.utils import counters

    shown = {k: sorted(dict(v).items()) for k, v in counters.items()
             if k in ("stats", "recompiles", "graph_break", "frames") and v}
    print("compile", repr(shown), flush=True)


def fact(key: str, value) -> None:
    print(f"{key} {value}", flush=True)
    sys.stdout.flush()


def finish(model, steps: int) -> None:
    """What every program shows at its end: its steps, that its model still saves, copies and
    averages (``model`` None: shown already), its RNG streams and torch.compile's counters."""
    fact("STEPS", steps)
    if model is not None:
        save_copy_average(model, "after")
    rng_tail()
    compile_counters()
