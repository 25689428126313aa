"""1-d CNN (conv 1->16 k7, ReLU, maxpool 2, conv 16->32 k5, ReLU, global max pool, linear
32->5) classifying 64-sample waveforms by which of 5 frequencies (0.2-0.92 rad/sample)
their sine has; random phase, amplitude 0.5-1.5, noise sd 0.7. Fresh batch of 64 every
step, cross entropy. Adam lr 3e-3, no clipping, 400 steps. The true loss is logged.

The bug: from step 250 the labels are shuffled within each batch (a permutation applied to
y only), so inputs and targets no longer correspond. The trained, confident model is first
badly wrong (loss ~6-9) and then settles at chance (ln 5 = 1.609) for the rest of the run.
The logged loss jumps x100+ at 250 as in the 'scaled logging' cases, but here training
truly broke. NOT healthy: loss divergence from step 250.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm right before
opt.step(); identical in two runs):
- Steps 0-249: loss 1.65 at step 0; 25-step medians 1.38, 0.71, 0.31, 0.164, 0.126,
  0.090, 0.081, 0.075, 0.071, 0.064; median 0.066 over 210-249; max over 50-249 0.47.
- From 250: 9.04, 8.17, 8.80, 6.46, 7.79, 6.44, 6.49, 4.39, 4.39, 4.08 (250-259), 3.48,
  2.78 ...; medians 6.47 (250-259), 1.73 (260-299), 1.619 (last 40); never below 1.573
  from 255 to the end; 25-step medians 2.20, 1.68, 1.64, 1.63, 1.62, 1.62 over 250-399.
- Grad norm median 0.45 (210-249) -> 4.43 (250-259, max 5.28 at 252) -> 1.55 (260-299) ->
  0.70 (last 40); falling after the first steps (no sustained growth).
- No NaN/Inf. About 5 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "loss_divergence", "first_step": 250, "tolerance": 5}],
          "forbidden": ["nonfinite"]}

STEPS, BATCH, N, CLASSES = 400, 64, 64, 5
BREAK_AT = 250


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


def tone_batch(g):
    """64-sample waveforms: a sine at one of 5 frequencies (the class), random phase and
    amplitude 0.5-1.5, plus noise sd 0.7."""
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    t = torch.arange(N, dtype=torch.float32)
    f = 0.2 + 0.18 * y.float()
    amp = 0.5 + torch.rand(BATCH, 1, generator=g)
    ph = 6.28 * torch.rand(BATCH, 1, generator=g)
    x = amp * torch.sin(f[:, None] * t + ph) + 0.7 * torch.randn(BATCH, N, generator=g)
    return x[:, None], y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(7)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(81)
    model = nn.Sequential(nn.Conv1d(1, 16, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2),
                          nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool1d(1),
                          nn.Flatten(), nn.Linear(32, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = tone_batch(g)
            if step >= BREAK_AT:                   # bug: labels shuffled against their inputs
                y = y[torch.randperm(BATCH, generator=g)]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), loss.item(), gn))
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.4g} grad {gn:.4g}")
    facts(rows, BREAK_AT)


if __name__ == "__main__":
    main()
