"""torch.compile training loops (default inductor backend), by ``argv[1]``; STEPS says how
many optimizer steps the program took; the compile counters are printed at the end.

Shapes: ``module`` (``torch.compile(model)``, AdamW) and ``function`` (a ``@torch.compile``
train-step function doing forward + loss + backward; the optimizer steps outside it; the
last batch is smaller, as a DataLoader's remainder is, so the function recompiles once).
"""

import sys

import torch
from torch import nn

from common import finish, loss, save_copy_average, seed

seed()
shape = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
middle = (n - 1) // 2


def model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def batches(count, size=8):
    return [(torch.randn(size, 16), torch.randn(size, 1)) for _ in range(count)]


m, mse = model(), nn.MSELoss()
opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
steps = 0
if shape == "module":
    cm = torch.compile(m)
    for i, (x, y) in enumerate(batches(n)):
        opt.zero_grad()
        out = mse(cm(x), y)
        out.backward()
        opt.step()
        steps += 1
        loss(i, out.item())
        if i == middle:
            save_copy_average(m, "during")
            save_copy_average(cm, "during compiled")
    save_copy_average(cm, "after compiled")

elif shape == "function":

    @torch.compile
    def forward_backward(x, y):
        out = mse(m(x), y)
        out.backward()
        return out.detach()

    data = [*batches(n - 1), *batches(1, size=5)]
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        out = forward_backward(x, y)
        opt.step()
        steps += 1
        loss(i, out.item())
        if i == middle:
            save_copy_average(m, "during")

else:
    raise SystemExit(f"unknown shape {shape!r}")

finish(m, steps)
