"""Plain training loops of the shapes people write, by ``argv[1]``; STEPS says how many
optimizer steps the program took (forwards for inference).

Shapes: ``optimizer`` (AdamW), ``manual_sgd`` (no optimizer: updates by hand under no_grad),
``accumulation`` (3 micro-batches per step), ``amp`` (CPU bf16 autocast + GradScaler),
``lbfgs`` (step(closure), ~20 closure calls per step), ``gan`` (two optimizers per iteration),
``eval_between`` (no_grad evaluation forwards every other step), ``inference``
(inference_mode, no backward) and ``dataloader`` (a DataLoader with two worker processes).
"""

import sys

import torch
from torch import nn

from common import fact, finish, loss, save_copy_average, seed

seed()
shape = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 6
middle = (n - 1) // 2  # the step after which the "during" checks run


def model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def batches(count, size=8):
    return [(torch.randn(size, 16), torch.randn(size, 1)) for _ in range(count)]


def train_step(opt, x, y):
    opt.zero_grad()
    out = mse(m(x), y)
    out.backward()
    opt.step()
    return out


m, mse = model(), nn.MSELoss()
steps = 0
if shape == "optimizer":
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for i, (x, y) in enumerate(batches(n)):
        out = train_step(opt, x, y)
        steps += 1
        loss(i, out.item())
        if i == middle:
            save_copy_average(m, "during")

elif shape == "manual_sgd":
    for i, (x, y) in enumerate(batches(n)):
        out = mse(m(x), y)
        out.backward()
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.05 * p.grad
                p.grad = None
        steps += 1
        loss(i, out.item())
        if i == middle:
            save_copy_average(m, "during")

elif shape == "accumulation":
    micro = 3
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    opt.zero_grad()
    for j, (x, y) in enumerate(batches(n * micro)):
        out = mse(m(x), y) / micro
        out.backward()
        loss(j, out.item())
        if (j + 1) % micro == 0:
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps - 1 == middle:
                save_copy_average(m, "during")

elif shape == "amp":
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, y) in enumerate(batches(n)):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mse(m(x).float(), y)
        scaler.scale(out).backward()
        scaler.step(opt)
        scaler.update()
        steps += 1
        loss(i, out.item())
        print(f"scale {i} {scaler.get_scale()!r}", flush=True)
        if i == middle:
            save_copy_average(m, "during")

elif shape == "lbfgs":
    # tolerances 0: every step runs its full max_iter, so ~20 closure calls per optimizer step
    opt = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=20, history_size=10,
                            tolerance_grad=0.0, tolerance_change=0.0)
    x, y = batches(1, size=32)[0]
    calls = []
    for i in range(n):
        calls.append(0)

        def closure():
            calls[-1] += 1
            opt.zero_grad()
            out = mse(m(x), y)
            out.backward()
            return out

        out = opt.step(closure)
        steps += 1
        loss(i, out.item())
        if i == middle:
            save_copy_average(m, "during")
    fact("CLOSURE_CALLS", " ".join(map(str, calls)))

elif shape == "gan":
    gen = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    disc = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-3, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    for i in range(n):
        real, noise = torch.randn(8, 16), torch.randn(8, 8)  # drawn in the loop, as GANs do
        fake = gen(noise)
        opt_d.zero_grad()
        d_loss = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = bce(disc(fake), ones)
        g_loss.backward()
        opt_g.step()
        steps += 1
        loss(i, d_loss.item())
        print(f"g_loss {i} {g_loss.item()!r}", flush=True)
        if i == middle:
            save_copy_average(gen, "during gen")
            save_copy_average(disc, "during disc")
    save_copy_average(gen, "after gen")
    save_copy_average(disc, "after disc")

elif shape == "eval_between":
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    val = batches(2)
    for i, (x, y) in enumerate(batches(n)):
        out = train_step(opt, x, y)
        steps += 1
        loss(i, out.item())
        if i % 2 == 1:
            m.eval()
            with torch.no_grad():
                v = sum(mse(m(vx), vy).item() for vx, vy in val)
            m.train()
            print(f"val {i} {v!r}", flush=True)
        if i == middle:
            save_copy_average(m, "during")

elif shape == "inference":
    m.eval()
    with torch.inference_mode():
        for i, (x, _) in enumerate(batches(n)):
            out = m(x)
            steps += 1  # forwards
            loss(i, out.sum().item())
            if i == middle:
                save_copy_average(m, "during")

elif shape == "dataloader":
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(8 * n, 16), torch.randn(8 * n, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for i, (x, y) in enumerate(loader):
        out = train_step(opt, x, y)
        steps += 1
        loss(i, out.item())
        if i == middle:
            save_copy_average(m, "during")

else:
    raise SystemExit(f"unknown shape {shape!r}")

finish(m if shape != "gan" else None, steps)
