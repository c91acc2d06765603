"""PyTorch Lightning ``Trainer.fit`` on a tiny module, CPU, two persistent DataLoader workers,
``max_steps`` (argv[1], default 6) spanning more than one epoch.  Losses are printed from a
callback; STEPS is ``trainer.global_step`` (the optimizer steps Lightning took)."""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import compile_counters, fact, loss, rng_tail, save_copy_average, seed

seed()
L.seed_everything(0, workers=True)
max_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.mse = nn.MSELoss()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.mse(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Show(L.Callback):
    """The loss of every step, and the model saved, copied and averaged half-way."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss(trainer.global_step, outputs["loss"].item())
        if trainer.global_step == max_steps // 2:
            save_copy_average(pl_module, "during")


def main():
    # 32 samples in batches of 8: 4 steps an epoch, so 6 steps cross an epoch boundary
    data = TensorDataset(torch.randn(32, 16), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=2, persistent_workers=True)
    model = Tiny()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, deterministic=True,
                        enable_progress_bar=False, enable_model_summary=False, logger=False,
                        enable_checkpointing=False, callbacks=[Show()])
    trainer.fit(model, loader)
    fact("STEPS", trainer.global_step)
    save_copy_average(model, "after")
    rng_tail()
    compile_counters()


if __name__ == "__main__":
    main()
