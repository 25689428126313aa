"""1-D CNN regressor, Adam; at step 150 the MSE switches from mean to sum over the batch (x10).

What it does: regress a scalar from a 1x32 signal (a random mix of 3 sinusoids with random
phases; the target is a fixed nonlinear function of the three amplitudes plus small noise).
Model: conv1d 1->16 k5, GELU, conv1d 16->16 k5 stride 2, GELU, global average pool, linear
16->32, GELU, linear 32->1. Adam(lr=2e-3), 320 steps of BATCH = 10 signals, no clipping.

Until SWITCH = 150 the loss is F.mse_loss(..., reduction="mean"); from step 150 on a refactor
uses reduction="sum" over the batch of fixed size 10, so the objective (and every gradient)
is exactly 10x larger. Nothing else changes; Adam's normalised updates absorb the factor.

What is TRUE of the run (measured, two runs identical):
- Steps 40-149: loss (mean squared error) ~0.1 (window means 0.098, 0.102; median 0.095 over
  110-149), grad norm median ~0.3-0.4.
- Step 150 (the switch): loss 0.57, step 151: 1.29; from then on the loss sits at ~10x its
  old level: window means 1.11 (160-199), 1.00 (200-239), 0.97 (240-279), 1.04 (280-319),
  i.e. the per-sample error is still ~0.1, exactly as before the switch. The grad norm moves
  by the same factor (median ~4-6, max 18 over 170-250) and stays on that level without
  growth.
- The objective was rescaled by the code; the model is unaffected (Adam) and keeps its
  accuracy. This is not a divergence, not an explosion and not a loss spike. Healthy run,
  no NaN.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_divergence", "gradient_explosion", "loss_spike"],
}

STEPS, BATCH, LENGTH, SWITCH = 320, 10, 32, 150


def make_data(n, g):
    t = torch.linspace(0, 1, LENGTH)
    amps = torch.rand(n, 3, generator=g)
    phases = 6.28 * torch.rand(n, 3, generator=g)
    freqs = torch.tensor([2.0, 5.0, 9.0])
    x = (amps[:, :, None] * torch.sin(6.28 * freqs[None, :, None] * t + phases[:, :, None])).sum(1)
    y = amps[:, 0] * amps[:, 1] + torch.sin(3 * amps[:, 2]) + 0.02 * torch.randn(n, generator=g)
    return x[:, None, :], y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    xs, ys = make_data(STEPS * BATCH, g)
    model = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.GELU(),
                          nn.Conv1d(16, 16, 5, stride=2, padding=2), nn.GELU(),
                          nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 32), nn.GELU(),
                          nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = xs[step * BATCH:(step + 1) * BATCH]
            y = ys[step * BATCH:(step + 1) * BATCH]
            reduction = "mean" if step < SWITCH else "sum"  # the refactor: x BATCH from here
            loss = F.mse_loss(model(x).squeeze(1), y, reduction=reduction)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or SWITCH - 1 <= step <= SWITCH + 1:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
