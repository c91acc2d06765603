"""A small loop with no DataLoader; ``raise`` after the third step dies of an uncaught error."""

import sys

import torch
from torch import nn

from common import fact, loss, rng_tail, seed

seed()
m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = 0
for i in range(8):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    opt.zero_grad()
    out = nn.functional.mse_loss(m(x), y)
    out.backward()
    opt.step()
    steps += 1
    loss(i, out.item())
    if steps == 3 and sys.argv[1:] == ["raise"]:
        fact("STEPS", steps)
        raise RuntimeError("the program's own error")
fact("STEPS", steps)
rng_tail()
