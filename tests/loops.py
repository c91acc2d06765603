"""Real training / inference loops of every shape the step detector must understand.

Run as a script: ``python loops.py <shape> [n]``.  Each shape prints nothing special; the
tests read what jobprof wrote.  Kept in one file so every loop is plain, unchanged user code.
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def data(n, batch=8):
    return [(torch.randn(batch, 16), torch.randn(batch, 1)) for _ in range(n)]


def model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def optimizer_loop(n):
    m, loss_fn = model(), nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for x, y in data(n):
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()


def accumulation(n, every=3):
    m, loss_fn = model(), nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for i, (x, y) in enumerate(data(n * every), 1):
        (loss_fn(m(x), y) / every).backward()
        if i % every == 0:
            opt.step()
            opt.zero_grad()


def grad_scaler(n, poison=3):
    m, loss_fn = model(), nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, y) in enumerate(data(n), 1):
        opt.zero_grad()
        scaler.scale(loss_fn(m(x), y)).backward()
        if i == poison:  # an overflow: GradScaler must skip this optimizer step
            next(m.parameters()).grad.fill_(float("inf"))
        scaler.step(opt)
        scaler.update()


def lbfgs(n):
    m, loss_fn = model(), nn.MSELoss()
    opt = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=4)
    for x, y in data(n):
        def closure(x=x, y=y):
            opt.zero_grad()
            loss = loss_fn(m(x), y)
            loss.backward()
            return loss

        opt.step(closure)


def backward_only(n):
    m, loss_fn = model(), nn.MSELoss()
    for x, y in data(n):
        m.zero_grad()
        loss_fn(m(x), y).backward()
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.01 * p.grad


def tensor_backward_only(n):
    w = torch.randn(16, 1, requires_grad=True)
    for x, y in data(n):
        ((x @ w - y) ** 2).mean().backward()
        with torch.no_grad():
            w -= 0.01 * w.grad
            w.grad = None


def inference(n):
    m = model().eval()
    with torch.no_grad():
        for x, _ in data(n):
            m(x)


def two_optimizers(n):
    gen, disc, loss_fn = model(), model(), nn.MSELoss()
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.01)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    for x, y in data(n):
        opt_d.zero_grad()
        loss_fn(disc(x), y).backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_fn(gen(x), y).backward()
        opt_g.step()


def eval_between(n):
    """Training with a no-grad validation forward inside each step window."""
    m, loss_fn = model(), nn.MSELoss()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for x, y in data(n):
        with torch.no_grad():
            m(x)
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()


if __name__ == "__main__":
    shape, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6
    globals()[shape](count)
