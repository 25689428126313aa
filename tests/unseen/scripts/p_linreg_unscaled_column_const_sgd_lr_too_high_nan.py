"""Linear regression on noisy targets, one unnormalised input column (std 10, the others
std 2), plain SGD with a constant learning rate just above the stability limit that column
sets: the noisy loss never settles, climbs exponentially and overflows to inf.

What it does: x in R^16, x_i ~ N(0, 2^2) for i < 15 and x_15 ~ N(0, 10^2) (a raw,
unscaled column that the target does not use); y = w* . x + N(0, 1) noise with w* ~ N(0, 1)
(w*_15 = 0). Model nn.Linear(16, 1) initialised to zero, MSE, batch 32, fresh samples every
step, SGD(lr 0.0115), constant, no clipping, 400 steps. The curvature along x_15 is
2 * 10^2 = 200, so any lr above 2/200 = 0.01 is unstable along it; 0.0115 multiplies that
direction's error by ~|1 - 0.0115 * 200 * (batch's mean x_15^2 / 100)| ~ 1.3 per step on
average (batch-to-batch it varies, so the growth is noisy, not a clean exponential).

What is TRUE of the run (measured; WINDOW_MEANS printed at the end):
- 20-step means: 1.14e4, 1.14e4, 90, 1.22e4, 8.85e5, 1.11e9, 5.56e15, 1.3e18, 4.5e21,
  4.35e21, 1.06e27, 6.2e30, 3.3e32, then inf; 20-step medians 260, 2.09e3, 68.9, 4.28e3,
  8.82e4, 6.5e8, ... The lowest loss is 21.8 at step 58; from ~step 60 the loss climbs by
  orders of magnitude (noisily: some windows fall back) and never recovers.
- The loss is 4.1e36 at step 277 and inf (float32 overflow) at steps 278-280; steps 281-305
  are finite but 2e35-6e36; from step 306 to the end (399) it is inf at every step (97
  nonfinite steps in all; never NaN as a loss value). The LR is 0.0115 throughout.
- Expected: nonfinite at 278 (the first non-finite loss). The run is also a divergence and
  a gradient explosion, but with the growth starting around step 60 and proceeding in
  noisy jumps, the one date that can be checked exactly is the first inf.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [{"id": "nonfinite", "first_step": 278, "tolerance": 2}],
}

STEPS, BATCH, DIM, LR = 400, 32, 16, 0.0115


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(9)
    scale = torch.full((DIM,), 2.0)
    scale[15] = 10.0
    wstar = torch.randn(DIM, generator=gen)
    wstar[15] = 0.0
    model = nn.Linear(DIM, 1)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.MSELoss()
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for _ in range(STEPS):
            x = torch.randn(BATCH, DIM, generator=gen) * scale
            y = (x @ wstar + torch.randn(BATCH, generator=gen)).unsqueeze(1)
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    first_nan = next((i for i, v in enumerate(losses) if math.isnan(v)), None)
    print("first nonfinite loss at step", first_bad, "first NaN at", first_nan)
    print("20-step means", [f"{sum(losses[i:i + 20]) / 20:.3g}" for i in range(0, STEPS, 20)])
    print("20-step medians", [f"{sorted(losses[i:i + 20])[10]:.3g}" for i in range(0, STEPS, 20)])
    print("min finite", f"{min(v for v in losses if math.isfinite(v)):.3g}",
          "argmin", min(range(STEPS), key=lambda i: losses[i] if math.isfinite(losses[i])
                        else float("inf")))
    print("around first nonfinite", [f"{v:.3g}" for v in losses[first_bad - 5:first_bad + 3]])


if __name__ == "__main__":
    main()
