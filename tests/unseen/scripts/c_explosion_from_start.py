"""MLP regressor trained with plain SGD at a learning rate far above its stability limit.

A LeakyReLU MLP (16 -> 64 -> 64 -> 1) fits a noisy linear-plus-sine target with MSE. The
optimiser is SGD without momentum, warm-up or clipping at lr=0.25 (this net oscillates at 0.1
and trains normally around 0.03). Every update overshoots, so from the first step on the
weights and the gradient norm grow geometrically, faster and faster: measured gradient norms
3.5, 5.5, 11.9, 273, 5.0e3, 4.3e12 at steps 0-5 (the loss dips at steps 1-2, then climbs to
1.4e14 at step 5). At step 6 the forward pass overflows: the loss is Inf and every gradient
NaN; from then on the weights are NaN. The loop keeps going until step 39, as a job that does
not check for NaN would.

What is true of the run: gradient explosion from step 0 (the root cause: lr too high, no
clipping), non-finite loss and gradients from step 6 as its consequence.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 0, "tolerance": 1, "top": True},
        {"id": "nonfinite", "first_step": 6, "tolerance": 1},
    ],
}

STEPS = 40
BATCH = 64


class MLPRegressor(nn.Module):
    def __init__(self, d_in=16, width=64):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(d_in, width), nn.LeakyReLU(),
            nn.Linear(width, width), nn.LeakyReLU(),
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.body(x))


def batch(gen, w):
    x = torch.randn(BATCH, 16, generator=gen)
    return x, x @ w + 0.5 * torch.sin(3 * x[:, :1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(16, 1, generator=gen)
    model = MLPRegressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    loss_fn = nn.MSELoss()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step in range(STEPS):
            x, y = batch(gen, w)
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 5 == 0:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
