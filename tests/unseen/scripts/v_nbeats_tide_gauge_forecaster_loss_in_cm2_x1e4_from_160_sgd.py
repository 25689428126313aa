"""Pathological: an N-BEATS-style MLP forecaster predicts 12 future tide-gauge water
levels from the last 48, with SGD + momentum; from step 160 on a reporting change converts
predictions and targets from metres to centimetres before the MSE, so the loss the
optimizer sees is in cm^2 (x10^4) with the learning rate unchanged. The gradient norm jumps
~6,700x at step 160 and ~8e8x at step 161; the loss is inf at step 162 and NaN from then to
the end of the run.

What it does: water levels in metres: two tidal harmonics (periods 12.4 and 24 samples,
random amplitudes and phases), a slow surge random walk and sensor noise (sd 0.02). Fresh
batch of 32 windows per step. Model: 3 N-BEATS generic blocks (MLP 48-128-128 with ReLU,
linear backcast and forecast heads; the last block has no backcast), doubly residual
stacking. MSE, SGD(lr 0.02, momentum 0.9, constant), 340 steps, no clipping, no NaN guard
(the loop keeps going).

What is TRUE of the run (measured; printed at the end):
- Steps 0-159: loss 0.379 at step 0, 20-step window medians 0.278, 0.054, 0.036, 0.024,
  0.017, 0.013, 0.011, 0.0083; held-out RMSE 60.9 cm (step 0) -> 8.8 cm (159). Gradient
  norm median 0.066 over 60-159 (max 0.139); 0.045 at step 159.
- Step 160: loss 81.6 (0.0085 at step 159), gradient norm 442 (6,700x the pre-bug median);
  step 161: loss 1.8e7, gradient norm 5.2e7; step 162: loss inf, gradient norm NaN.
- Steps 162-339: loss and gradient norm NaN on every step (178 non-finite steps); the
  held-out RMSE is NaN from step 162.
- LR constant 0.02.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 160, "tolerance": 1},
        {"id": "nonfinite", "first_step": 162, "tolerance": 1},
    ],
}

LOOKBACK, HORIZON, WIDTH, BLOCKS, BATCH, STEPS, LR, BUG_STEP = 48, 12, 128, 3, 32, 340, 0.02, 160
UNIT = 100.0                                      # metres -> centimetres


def series(g, n):
    """Tide-gauge-like water levels in metres: two tidal harmonics (periods ~12.4 and ~24
    samples) with random amplitudes/phases, a slow surge random walk and sensor noise."""
    t = torch.arange(LOOKBACK + HORIZON, dtype=torch.float32)
    a1 = 0.5 + 0.5 * torch.rand(n, 1, generator=g)
    a2 = 0.1 + 0.3 * torch.rand(n, 1, generator=g)
    p1 = 2 * math.pi * torch.rand(n, 1, generator=g)
    p2 = 2 * math.pi * torch.rand(n, 1, generator=g)
    surge = 0.01 * torch.randn(n, LOOKBACK + HORIZON, generator=g).cumsum(1)
    level = a1 * torch.sin(2 * math.pi * t / 12.4 + p1) + a2 * torch.sin(2 * math.pi * t / 24
                                                                          + p2)
    level = level + surge + 0.02 * torch.randn(n, LOOKBACK + HORIZON, generator=g)
    return level[:, :LOOKBACK], level[:, LOOKBACK:]


class Block(nn.Module):
    """N-BEATS generic block: an MLP that emits a backcast and a forecast (the last block
    has no backcast: nothing would consume it)."""

    def __init__(self, backcast=True):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(LOOKBACK, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH),
                                nn.ReLU())
        self.backcast = nn.Linear(WIDTH, LOOKBACK) if backcast else None
        self.forecast = nn.Linear(WIDTH, HORIZON)

    def forward(self, x):
        h = self.fc(x)
        return (self.backcast(h) if self.backcast is not None else 0), self.forecast(h)


class NBeats(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(backcast=i < BLOCKS - 1) for i in range(BLOCKS))

    def forward(self, x):
        residual, forecast = x, 0
        for blk in self.blocks:
            b, f = blk(residual)
            residual = residual - b
            forecast = forecast + f
        return forecast


def med(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(21)
    xv, yv = series(g, 512)
    model = NBeats()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses, gnorms = [], []

    def val_rmse_cm():
        with torch.no_grad():
            return round(100 * (model(xv) - yv).pow(2).mean().sqrt().item(), 3)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = series(g, BATCH)
            pred = model(x)
            if step >= BUG_STEP:
                # a reporting change converts prediction and target to cm before the loss;
                # the optimizer still sees the loss, now in cm^2 (x1e4), with the same lr
                loss = (pred * UNIT - y * UNIT).pow(2).mean()
            else:
                loss = (pred - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn)
            if step % 20 == 0 or BUG_STEP - 1 <= step <= BUG_STEP + 12 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.5g} gn {gn:.5g} "
                      f"val rmse (cm) {val_rmse_cm()}", flush=True)
    w = 20
    print("loss 20-step window medians", [float(f"{med(losses[i:i + w]):.4g}")
                                          for i in range(0, STEPS, w)])
    print("gnorm 20-step window medians", [float(f"{med(gnorms[i:i + w]):.4g}")
                                           for i in range(0, STEPS, w)])
    finite = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    gfin = [i for i, v in enumerate(gnorms) if not math.isfinite(v)]
    print("first nonfinite loss at", finite[0] if finite else None, "count", len(finite),
          "| first nonfinite grad norm at", gfin[0] if gfin else None, "count", len(gfin))
    pre = gnorms[60:BUG_STEP]
    print(f"gnorm pre-bug (60-{BUG_STEP - 1}) median", round(med(pre), 4), "max",
          round(max(pre), 4), "| loss pre-bug median", round(med(losses[60:BUG_STEP]), 5))


if __name__ == "__main__":
    main()
