"""MLP regressor (16 -> 64 -> 64 -> 1, tanh) on a smooth synthetic target y = sin(x W1) W2 +
noise sd 0.1 (x ~ N(0, I_16), fixed random W1 16x8 / 4, W2 8x1 / 2). Fresh batch of 64 every
step, MSE. Adam lr 2e-3, no clipping, 350 steps.

What changes: from step 200 the script turns on manual static loss scaling with S = 1024
(as one would before moving to fp16): (loss * S).backward(), every .grad divided by S
before opt.step(), and the SCALED loss is what is handed to the recorder
(rec.step(loss=loss * S)). The update is mathematically the same as before (Adam, unscaled
gradients); only the logged number is x1024 from step 200 on. HEALTHY: training is
unchanged and keeps improving.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm of the
unscaled gradients right before opt.step(); identical in two runs):
- True (unscaled) loss 1.26 at step 0; 25-step medians 0.58, 0.42, 0.37, 0.35, 0.33, 0.30,
  0.24, 0.26 over 0-199; 0.166, 0.143, 0.110, 0.086, 0.095, 0.074 over 200-349. Median
  0.256 over 160-199 -> 0.153 (200-209) -> 0.151 (210-249) -> 0.076 (last 40).
- Logged loss = true loss for 0-199 (median 0.256 over 160-199), = 1024 x true loss from 200:
  median 156 (200-209), 155 (210-249), 78 (last 40). Step 200 itself logged 314 (true 0.306).
- Grad norm median 0.66 (160-199) -> 0.65 (200-209) -> 0.60 (210-249) -> 0.52 (last 40);
  max of the run 1.53 at step 30; never above 1.21 after step 50.
- No NaN/Inf. About 3.5 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [],
          "forbidden": ["loss_divergence", "loss_spike", "gradient_explosion"]}

STEPS, BATCH, DIM = 350, 64, 16
SCALE_FROM, SCALE = 200, 1024.0


def facts(rows, n):
    """rows: (logged, true_loss, grad_norm). Prints the measured facts around step n."""
    med = statistics.median
    lg = [r[0] for r in rows]
    tl = [r[1] for r in rows]
    gn = [r[2] for r in rows]
    bad = sum(not math.isfinite(v) for v in lg + tl + gn)
    print(f"[all] nonfinite {bad}; true loss step 0 {tl[0]:.4g}, last 20 median "
          f"{med(tl[-20:]):.4g}; max grad {max(gn):.4g} at {gn.index(max(gn))}")
    for name, v in (("logged", lg), ("true", tl), ("grad", gn)):
        print(f"[{name}] median {n - 40}-{n - 1}: {med(v[n - 40:n]):.4g} | {n}-{n + 9}: "
              f"{med(v[n:n + 10]):.4g} | {n + 10}-{n + 49}: {med(v[n + 10:n + 50]):.4g} | "
              f"last 40: {med(v[-40:]):.4g}")
    for a in range(0, len(rows), 25):
        print(f"[win] {a}-{min(a + 24, len(rows) - 1)}: logged {med(lg[a:a + 25]):.4g} "
              f"true {med(tl[a:a + 25]):.4g} "
              f"grad {med(gn[a:a + 25]):.4g} max grad {max(gn[a:a + 25]):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)
    w1 = torch.randn(DIM, 8, generator=g) / 4
    w2 = torch.randn(8, 1, generator=g) / 2
    model = nn.Sequential(nn.Linear(DIM, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x = torch.randn(BATCH, DIM, generator=g)
            y = torch.sin(x @ w1) @ w2 + 0.1 * torch.randn(BATCH, 1, generator=g)
            loss = F.mse_loss(model(x), y)
            s = SCALE if step >= SCALE_FROM else 1.0
            opt.zero_grad()
            (loss * s).backward()
            for p in model.parameters():
                p.grad.div_(s)
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            logged = loss * s
            rec.step(loss=logged)
            rows.append((logged.item(), loss.item(), gn))
            if step % 50 == 0:
                print(f"step {step} logged {logged.item():.4g} loss {loss.item():.4g} "
                      f"grad {gn:.4g}")
    facts(rows, SCALE_FROM)


if __name__ == "__main__":
    main()
