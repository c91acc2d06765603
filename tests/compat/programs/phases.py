"""A training (or inference) loop whose phases take known, injected times: ground truth for
every way jobprof finds an iteration.

``phases.py MODE DATA STEPS F B D R`` (times in ms):

Each phase "sleeps" its time exactly (a sleep, then a short spin to the deadline):

- F: ``Net.forward`` sleeps F (the model's forward);
- B: ``SlowGrad.backward`` (a custom autograd Function inside the model) sleeps B;
- D: the DataLoader (``num_workers=0``, so the wait is in the loop): each of the BATCH samples
  sleeps D / 2 / BATCH in ``__getitem__``, the collate function sleeps D / 2;
- R: the update sleeps R: inside ``SlowSGD.step`` (modes ``optimizer`` and ``explicit``), or
  inside the hand-written SGD update under ``no_grad`` (mode ``backward``: no optimizer).

MODE: ``optimizer`` (plain ``opt.step()``), ``backward`` (manual SGD: iterations can only be
found from ``backward()``), ``forward`` (an ``inference_mode`` loop: only F and D apply) and
``explicit`` (the optimizer loop ended by a callable its main script passes to :func:`main`).
test_truth.py generates that main script, which calls jobprof's step function; this file must
never spell that call, not even in a comment: jobprof searches the main script's text for it,
and every mode would then run as a script that marks its steps.

DATA: ``plain`` (samples are stored tensors) or ``transform``: each sample also goes through
a parameter-free ``nn.Module`` (``Normalize``, as torchvision's transforms are modules), called
in ``__getitem__`` after the sample's sleep, on the loop's thread (``num_workers=0``).

The model is tiny (8 -> 8 -> 1), so the real compute around the sleeps is a small fraction of a
millisecond.  The loop stamps its own phases with ``time.monotonic_ns`` (jobprof's clock) and
writes them to ``phases.json`` in the working directory, so a test can tell jobprof's error
from sleep overshoot on a noisy machine.  Stdout carries only what must be equal profiled and
unprofiled: the losses (``repr``), STEPS and the RNG tail.

Plain user code: nothing here knows jobprof.
"""

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

from common import fact, loss, rng_tail, seed

BATCH = 2
LR = 0.05
SPIN_MS = 1.0
_now = time.monotonic_ns


def _sleep_ms(ms: float) -> None:
    """Take ``ms`` exactly: sleep, then spin the last SPIN_MS (a plain sleep overshoots by
    0.1-1 ms on a busy machine, and the overshoot would blur the ground truth)."""
    if ms <= 0:
        return
    deadline = _now() + int(ms * 1e6)
    if ms > SPIN_MS:
        time.sleep((ms - SPIN_MS) / 1000)
    while _now() < deadline:
        pass


class SlowGrad(torch.autograd.Function):
    """Identity forward; its backward sleeps B ms."""

    sleep_ms = 0.0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _sleep_ms(SlowGrad.sleep_ms)
        return grad


class Net(nn.Module):
    def __init__(self, forward_ms: float) -> None:
        super().__init__()
        self.forward_ms = forward_ms
        self.lin1 = nn.Linear(8, 8)
        self.lin2 = nn.Linear(8, 1)

    def forward(self, x):
        _sleep_ms(self.forward_ms)
        return self.lin2(torch.relu(SlowGrad.apply(self.lin1(x))))


class Normalize(nn.Module):
    """A data transform that is a module (no parameters), as torchvision's are."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.full((8,), 0.1))
        self.register_buffer("std", torch.full((8,), 1.5))

    def forward(self, x):
        return (x - self.mean) / self.std


class Samples(Dataset):
    def __init__(self, count: int, item_ms: float, transform=None) -> None:
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(count, 8, generator=gen)
        self.y = torch.randn(count, 1, generator=gen)
        self.item_ms = item_ms
        self.transform = transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        _sleep_ms(self.item_ms)
        x = self.x[i]
        if self.transform is not None:
            x = self.transform(x)
        return x, self.y[i]


class SlowCollate:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, items):
        _sleep_ms(self.ms)
        return default_collate(items)


class SlowSGD(torch.optim.SGD):
    """SGD whose step also takes R ms (a heavier optimizer, as seen by the loop)."""

    def __init__(self, params, lr: float, step_ms: float) -> None:
        super().__init__(params, lr=lr)
        self.step_ms = step_ms
        self.done = 0

    def step(self, closure=None):
        out = super().step(closure)
        _sleep_ms(self.step_ms)
        self.done = _now()  # the update's own end, before any post-step hook runs
        return out


def main(mode: str, data: str, steps: int, forward_ms: float, backward_ms: float, data_ms: float,
         update_ms: float, end_step=None) -> None:
    seed()
    SlowGrad.sleep_ms = backward_ms
    model = Net(forward_ms)
    dataset = Samples(steps * BATCH, data_ms / 2 / BATCH, Normalize() if data == "transform" else None)
    loader = DataLoader(dataset, batch_size=BATCH, collate_fn=SlowCollate(data_ms / 2), num_workers=0)
    opt = SlowSGD(model.parameters(), LR, update_ms) if mode in ("optimizer", "explicit") else None
    params = list(model.parameters())
    # per iteration, the loop's own phase boundaries (monotonic ns): next0..next1 the wait in
    # next(); fwd0 right before the model is called; fwd1 its return; bwd0..bwd1 the backward
    # call; upd0..upd1 the update call, upd_done the update's own end (inside it); mark right
    # before end_step(); end the iteration's last statement
    stamps = []
    it = iter(loader)
    for i in range(steps):
        t = {"next0": _now()}
        x, y = next(it)
        t["next1"] = _now()
        if mode == "forward":
            with torch.inference_mode():
                t["fwd0"] = _now()
                out = model(x)
                t["fwd1"] = _now()
            loss(i, out.sum())
            t["end"] = _now()
            stamps.append(t)
            continue
        if opt is not None:
            opt.zero_grad()
        t["fwd0"] = _now()
        pred = model(x)
        t["fwd1"] = _now()
        value = nn.functional.mse_loss(pred, y)
        t["bwd0"] = _now()
        value.backward()
        t["bwd1"] = t["upd0"] = _now()
        if opt is not None:
            opt.step()
            t["upd_done"] = opt.done
        else:  # manual SGD: the update by hand, no optimizer object at all
            with torch.no_grad():
                for p in params:
                    p -= LR * p.grad
                    p.grad = None
                _sleep_ms(update_ms)
            t["upd_done"] = _now()
        t["upd1"] = _now()
        loss(i, value.item())
        t["mark"] = _now()
        if end_step is not None:
            end_step()
        t["end"] = _now()
        stamps.append(t)
    fact("STEPS", steps)
    rng_tail()
    with open("phases.json", "w") as handle:
        json.dump(stamps, handle)


if __name__ == "__main__":
    mode_, data_, steps_, *times = sys.argv[1:]
    main(mode_, data_, int(steps_), *(float(v) for v in times))
