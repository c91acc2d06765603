"""HuggingFace transformers: a tiny random GPT-2 trained by a plain loop and by ``Trainer``,
profiled and unprofiled in the same test."""

from __future__ import annotations

import re

import pytest

from harness import check_all, facts, run_matrix

#: Trainer's closing line of wall-clock rates ({'train_runtime': ..., 'train_samples_per_second': ...})
TRAIN_SPEED = re.compile(r"^\{'train_runtime': ")
#: the loop prints nothing that varies run to run
NOTHING = re.compile(r"(?!)")


VOLATILE = {"loop": NOTHING, "trainer": TRAIN_SPEED}


@pytest.mark.parametrize("shape", list(VOLATILE))
def test_gpt2(tmp_path, shape):
    volatile = VOLATILE[shape]
    base, runs = run_matrix("hf_gpt2.py", tmp_path, args=[shape, "6"])
    steps = int(facts(base)["STEPS"])
    assert steps == 6, base.describe()
    check_all(base, runs, steps, "optimizer_step", volatile=volatile)
