"""Healthy: MLP regression whose targets carry skewed lognormal noise, plain MSE, batch 16,
AdamW with gradient-norm clipping and a cosine LR decay.

What it does: x ~ N(0, I_10); clean target f(x) = 3 sin(x0) + 2 x1 x2 + x3^2 + 2 x4 - 1
(variance ~14); the training target adds centred lognormal noise e = exp(z) - exp(0.5),
z ~ N(0, 1) (mean 0, variance 4.7, right tail: one sample in ~1000 has e > 20). Fresh
samples every step, batch 16, MLP 10-128-128-1 (GELU), MSE loss, AdamW(lr 2e-3, weight decay
1e-4), clip_grad_norm_(1.0), CosineAnnealingLR to 1e-4 over 450 steps. A batch holding one
of the rare large-noise samples has an MSE several times the median; that is the data, not
the model: the next batch is back to the median.

What is TRUE of the run (measured; printed at the end):
- Per-batch MSE, 45-step window medians: 10.43, 7.89, 6.81, 4.75, 3.42, 3.57, 4.36, 2.47,
  3.06, 2.26 (the median falls 78%, to about half the noise variance 4.7); window means
  13.77 -> 4.09.
- The loss has a heavy right tail from the noise: every window after the first holds a
  batch at 25-38 (4-14x its window median, the ratio growing as the median falls); after
  step 50 the largest are step 207 (38.29), 152
  (36.84), 271 (34.04), 102 (33.37), 334 (33.02), 94 (32.52); each is a single batch and the
  next one is back at 1.7-6.3 (207 -> 2.05, 152 -> 1.71, 271 -> 4.51). The largest of the
  whole run is step 9 (85.5, the untrained model). No NaN/Inf.
- Held-out (4,000 rows, same noise) MSE every 75 steps: 9.26, 6.74, 6.03, 5.58, 5.54, 5.39;
  MSE to the clean f: 4.78 (step 74) -> 2.08 -> 1.32 -> 0.91 -> 0.91 -> 0.76 (step 449).
- Gradient norm before clipping: median 10.2, max 58.9 (step 382); clipping to 1.0 acts on
  nearly every step, so an outlier batch moves the weights no more than a typical one.
- LR (cosine): 2.0e-3 at step 0, 1.78e-3 at 100, 1.21e-3 at 200, 5.75e-4 at 300, 1.57e-4 at
  400, 1.0e-4 at 449.
- Healthy: the large batch losses are the lognormal noise of a few targets, not the model.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, DIM = 450, 16, 10


def sample(n, gen):
    x = torch.randn(n, DIM, generator=gen)
    f = 3 * torch.sin(x[:, 0]) + 2 * x[:, 1] * x[:, 2] + x[:, 3] ** 2 + 2 * x[:, 4] - 1
    noise = torch.exp(torch.randn(n, generator=gen)) - math.exp(0.5)
    return x, (f + noise).unsqueeze(1), f.unsqueeze(1)


def report(losses, gnorms, lrs, k=10):
    n = len(losses) // k
    med = [round(sorted(losses[i * n:(i + 1) * n])[n // 2], 3) for i in range(k)]
    mean = [round(sum(losses[i * n:(i + 1) * n]) / n, 3) for i in range(k)]
    print("WINDOW_MEDIANS", med)
    print("WINDOW_MEANS", mean)
    mx = [max(range(i * n, (i + 1) * n), key=lambda j: losses[j]) for i in range(k)]
    print("WINDOW_MAX (step, loss)", [(j, round(losses[j], 2)) for j in mx])
    top = sorted(range(len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES (step, loss, next 3)",
          [(i, round(losses[i], 2), [round(v, 2) for v in losses[i + 1:i + 4]]) for i in top])
    late = sorted(range(50, len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES from step 50",
          [(i, round(losses[i], 2), [round(v, 2) for v in losses[i + 1:i + 4]]) for i in late])
    g = sorted(gnorms)
    print("GNORM median", round(g[len(g) // 2], 3), "max", round(g[-1], 3),
          "at", gnorms.index(g[-1]), "nonfinite", sum(not math.isfinite(v) for v in losses))
    print("LR", [(i, f"{lrs[i]:.2e}") for i in (0, 100, 200, 300, 400, len(lrs) - 1)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(11)
    xv, yv, fv = sample(4000, gen)
    model = nn.Sequential(nn.Linear(DIM, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=1e-4)
    losses, gnorms, lrs = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y, _ = sample(BATCH, gen)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn.item())
            lrs.append(opt.param_groups[0]["lr"])
            sched.step()
            if (step + 1) % 75 == 0:
                with torch.no_grad():
                    pred = model(xv)
                    print(step, "val_mse", round((pred - yv).pow(2).mean().item(), 3),
                          "clean_mse", round((pred - fv).pow(2).mean().item(), 3))
    report(losses, gnorms, lrs)


if __name__ == "__main__":
    main()
