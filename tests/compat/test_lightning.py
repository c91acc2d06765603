"""PyTorch Lightning's ``Trainer.fit``, profiled and unprofiled in the same test."""

from __future__ import annotations

import re

from harness import check_all, facts, run_matrix

#: Lightning's own lines (GPU available..., `Trainer.fit` stopped...) are the same every run
NOTHING = re.compile(r"(?!)")


def test_lightning_fit(tmp_path):
    base, runs = run_matrix("lightning_fit.py", tmp_path, args=["6"])
    steps = int(facts(base)["STEPS"])
    assert steps == 6, base.describe()
    check_all(base, runs, steps, "optimizer_step", volatile=NOTHING)
