"""MLP autoencoder (48 -> 64 -> 32 -> 8 -> 32 -> 64 -> 48, GELU, linear output) on synthetic
48-channel 'sensor' readings that lie near a 4-d nonlinear manifold: x = tanh(z M1) M2 with
z ~ N(0, I_4), fixed random M1 (4 x 24) and M2 (24 x 48, / 3), plus channel noise sd 0.05.
Fresh batch of 64 every step, reconstruction MSE. SGD (momentum 0.9) lr 0.08, no clipping,
450 steps.

The bug: the schedule is meant to be a step decay, MultiStepLR(milestones=[200],
gamma=0.1), and was written gamma=10 - the lr goes UP x10 to 0.8 at step 200 instead of down
to 0.008. Steps 0-199 are a normal run (a slow start, then steady learning). The first
update at lr 0.8 (step 200) throws the weights out of the basin: the gradient of step 201 is
x10-20 the recent level, it keeps growing by one to several orders of magnitude per step
(one dip at 203), the loss overflows at 207, and everything after is NaN.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Steps 0-199 (lr 0.08): loss 1.55 at step 0; 25-step medians 1.55 (0-24), 1.52, 1.10,
  0.67, 0.347, 0.317, 0.289, 0.170 (175-199); median 0.205 over 160-199. Grad norm 25-step
  medians 0.060, 0.073, 0.35, 0.39, 0.31, 0.18, 0.18, 0.29; median 0.250 over 160-199; max
  before 200: 0.88 (in 50-74).
- Step 200 (first step at lr 0.8, gradient still normal): loss 0.119, grad 0.483.
- After: step 201 loss 0.687 / grad 4.84 (x19 the 160-199 median); 202: 5.05 / 16.5; 203:
  1.63 / 0.39; 204: 2.34 / 12.6; 205: 24.9 / 274; 206: 1.5e8 / 1.3e9; 207: loss inf, grad
  NaN (first nonfinite step); NaN from 208 to the end (243 nonfinite steps).
- Onset of the growth: step 201 (the step after the lr increase); above 3x the baseline
  for good from 204. About 3 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 201, "tolerance": 2},
                       {"id": "nonfinite", "first_step": 207, "tolerance": 1}]}

STEPS, BATCH, DIM, LATENT = 450, 64, 48, 4
LR = 0.08
MILESTONES, GAMMA = [200], 10.0            # meant: gamma=0.1 (decay x10 at 200)


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Linear(64, 32), nn.GELU(),
                                 nn.Linear(32, 8))
        self.dec = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 64), nn.GELU(),
                                 nn.Linear(64, DIM))

    def forward(self, x):
        return self.dec(self.enc(x))


def sensor_batch(mix, g):
    """48-channel 'sensor' readings generated from a 4-d latent state through a fixed random
    nonlinear map (x = tanh(z M1) M2), plus channel noise sd 0.05."""
    z = torch.randn(BATCH, LATENT, generator=g)
    x = torch.tanh(z @ mix[0]) @ mix[1]
    return x + 0.05 * torch.randn(BATCH, DIM, generator=g)


def facts(rows):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    m = MILESTONES[0]
    bad = [i for i in range(len(rows)) if not (math.isfinite(loss[i]) and math.isfinite(gn[i]))]
    first_bad = bad[0] if bad else None
    end = first_bad if first_bad is not None else len(rows)
    base = med(gn[m - 40:m])
    above = next((i for i in range(m, end) if all(v > 3 * base for v in gn[i:end])), None)
    print(f"[all] nonfinite steps {len(bad)}, first {first_bad}; loss step 0 {loss[0]:.4g}; "
          f"grad baseline median {base:.4g} over {m - 40}-{m - 1}; loss median "
          f"{med(loss[m - 40:m]):.4g}; above 3x the grad baseline for good from {above}")
    for i in range(m - 3, min(end + 3, m + 60, len(rows))):
        print(f"  step {i}: loss {loss[i]:.4g} grad {gn[i]:.4g}")
    for a in range(0, len(rows), 25):
        fl = [v for v in loss[a:a + 25] if math.isfinite(v)]
        fg = [v for v in gn[a:a + 25] if math.isfinite(v)]
        if fl and fg:
            print(f"[win] {a}-{a + 24}: loss {med(fl):.4g} grad {med(fg):.4g} max grad "
                  f"{max(fg):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(17)
    mix = (torch.randn(LATENT, 24, generator=g), torch.randn(24, DIM, generator=g) / 3)
    model = AutoEncoder()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=MILESTONES, gamma=GAMMA)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x = sensor_batch(mix, g)
            loss = F.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 50 == 0:
                print(f"step {step} lr {lr:.4g} loss {loss.item():.4g} grad_norm {gn:.4g}",
                      flush=True)
    facts(rows)


if __name__ == "__main__":
    main()
