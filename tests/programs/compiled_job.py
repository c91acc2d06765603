"""A torch.compile training job for the fusion_op tests, by ``argv[1]``:

* ``mlp``: ``linear -> relu -> add -> linear`` (the relu and the add fuse into one C++
  kernel), SGD, 4 steps; steps 3 and 4 take a smaller batch, so the forward recompiles
  (Dynamo marks the batch dimension dynamic: the new graphs have symbolic shapes);
* ``break``: the same model with a graph break (a ``print`` in forward): two graphs per pass;
* ``block``: a transformer encoder layer (attention, layer norm, feed-forward), 3 steps.

Prints ``loss <i> <value>`` per step.  At the end it writes the paths of the Inductor output
modules this process loaded (``PyCodeCache.modules``) to ``$GENERATED`` when set: the tests
read Inductor's own generated code from them.
"""

import json
import os
import sys

import torch
from torch import nn

torch.manual_seed(0)
shape = sys.argv[1]


class MLP(nn.Module):
    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2, self.broken = nn.Linear(32, 64), nn.Linear(64, 8), broken

    def forward(self, x):
        h = torch.relu(self.fc1(x)) + 1.0
        if self.broken:
            print("graph break here", flush=True)
        return self.fc2(h)


if shape in ("mlp", "break"):
    model = MLP(broken=shape == "break")
    sizes = [16, 16, 8, 8]
elif shape == "block":
    model = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True)
    sizes = [4, 4, 4]
else:
    raise SystemExit(f"unknown shape {shape!r}")

compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i, size in enumerate(sizes):
    x = torch.randn(size, 32) if shape != "block" else torch.randn(size, 6, 32)
    loss = compiled(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"loss {i} {loss.item():.10g}", flush=True)

if os.environ.get("GENERATED"):
    from torch._inductor.codecache import PyCodeCache

    with open(os.environ["GENERATED"], "w") as handle:
        json.dump([m.__file__ for m in PyCodeCache.modules], handle)
