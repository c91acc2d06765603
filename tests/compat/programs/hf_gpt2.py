"""A tiny HuggingFace GPT-2 (random weights, built from its config: no download), trained for
``argv[2]`` steps (default 6) either by a plain AdamW loop (``argv[1] == "loop"``) or by
``transformers.Trainer`` (``"trainer"``).  STEPS says how many optimizer steps were taken."""

import sys
import tempfile

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

from common import finish, loss, save_copy_average, seed

seed()
transformers.set_seed(0)
shape = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 6
VOCAB, LENGTH = 128, 16


def model():
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    """Random token sequences as a tokenizer would hand them to Trainer: dicts of tensors."""

    def __init__(self, count):
        self.ids = torch.randint(0, VOCAB, (count, LENGTH))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.ids[i]}


m = model()
steps = 0
if shape == "loop":
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for i in range(n):
        ids = torch.randint(0, VOCAB, (4, LENGTH))
        opt.zero_grad()
        out = m(input_ids=ids, labels=ids).loss
        out.backward()
        opt.step()
        steps += 1
        loss(i, out.item())
        if i == n // 2:
            save_copy_average(m, "during")
elif shape == "trainer":
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Show(TrainerCallback):
        """Every logged loss (logging_steps=1: each step's), and the model saved half-way;
        16 samples in batches of 4 make 4 steps an epoch, so 6 steps cross an epoch boundary."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                loss(state.global_step, logs["loss"])

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == n // 2:
                save_copy_average(model, "during")

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=n, use_cpu=True, report_to=[],
                                 per_device_train_batch_size=4, logging_steps=1, save_strategy="no",
                                 seed=0, dataloader_num_workers=0, disable_tqdm=True)
        trainer = Trainer(model=m, args=args, train_dataset=Tokens(16), callbacks=[Show()])
        trainer.train()
        steps = trainer.state.global_step
        m = trainer.model
else:
    raise SystemExit(f"unknown shape {shape!r}")
finish(m, steps)
