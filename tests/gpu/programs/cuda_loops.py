"""The compatibility matrix's programs on ``cuda:0``, by ``argv[1]``; plain user code that knows
nothing of jobprof (run by tests/gpu/test_compat_cuda.py through tests/compat/harness.py).

Shapes: ``loop`` (an MLP with LayerNorm and dropout, AdamW, batches made on the host and copied
in from pinned memory), ``compiled`` (the same model through ``torch.compile``, inductor) and
``lightning`` (``Trainer.fit(accelerator="gpu", devices=1)``).  ``argv[2]`` is the number of
optimizer steps.  Losses are printed as ``repr`` floats, so equal text is bit-identical floats;
STEPS, the RNG streams (CUDA's too) and torch.compile's counters come at the end, as in
tests/compat/programs.
"""

import sys
from pathlib import Path

import torch
from torch import nn

# the matrix's own helpers (seed, loss, save/copy/average, RNG tail), not copies
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compat" / "programs"))
from common import compile_counters, fact, finish, loss, rng_tail, save_copy_average, seed

seed()  # also torch.use_deterministic_algorithms(True); the harness sets CUBLAS_WORKSPACE_CONFIG
shape = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 6
middle = (n - 1) // 2
dev = torch.device("cuda:0")


def model():
    return nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Dropout(0.1),
                         nn.Linear(256, 1))


def batches(count, size=32):
    # drawn on the host (CPU RNG) and pinned, as a DataLoader with pin_memory hands them over
    return [(torch.randn(size, 64).pin_memory(), torch.randn(size, 1).pin_memory()) for _ in range(count)]


def fit(m, forward, n):
    """AdamW steps over ``n`` batches; ``forward`` is ``m`` or its compiled form."""
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    mse = nn.MSELoss()
    for i, (x, y) in enumerate(batches(n)):
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        opt.zero_grad()
        out = mse(forward(x), y)  # dropout draws from CUDA's generator
        out.backward()
        opt.step()
        loss(i, out.item())
        if i == middle:
            save_copy_average(m, "during")
    return n


if shape == "loop":
    m = model().to(dev)
    finish(m, fit(m, m, n))

elif shape == "compiled":
    m = model().to(dev)
    steps = fit(m, torch.compile(m), n)
    finish(m, steps)

elif shape == "lightning":
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    L.seed_everything(0, workers=True)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model()
            self.mse = nn.MSELoss()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.mse(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    class Show(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss(trainer.global_step, outputs["loss"].item())
            if trainer.global_step == n // 2:
                save_copy_average(pl_module, "during")

    # 4 batches an epoch: n steps cross an epoch boundary; workers 0 keeps start-up short
    data = TensorDataset(torch.randn(128, 64), torch.randn(128, 1))
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=0, pin_memory=True)
    module = Module()
    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=n, deterministic=True,
                        enable_progress_bar=False, enable_model_summary=False, logger=False,
                        enable_checkpointing=False, callbacks=[Show()])
    trainer.fit(module, loader)
    fact("STEPS", trainer.global_step)
    save_copy_average(module, "after")
    rng_tail()
    compile_counters()

else:
    raise SystemExit(f"unknown shape {shape!r}")
