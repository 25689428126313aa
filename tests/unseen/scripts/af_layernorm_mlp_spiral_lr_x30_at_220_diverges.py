"""MLP with LayerNorm (8 -> 64 -> LN -> ReLU -> 64 -> LN -> ReLU -> 3) classifying three
interleaved 2-d spirals (radius 0.2-1, angle noise sd 0.1, point noise sd 0.05), the 2-d
point lifted to 8 features (p, sin 2p, cos 2p, p^2). Fresh batch of 128 every step, cross
entropy. SGD lr 0.05 momentum 0.9, no clipping, 380 steps. The true loss is logged.

The bug: at step 220 the learning rate is multiplied by 30 (0.05 -> 1.5) and stays there.
The model had essentially solved the task (loss ~4e-4); the first update at lr 1.5 (made at
step 220) throws it out of its basin and it never recovers: the loss goes to and stays at
chance level (ln 3 = 1.099). The logged loss jumps x3000 as in the 'scaled logging'
cases, but here training truly broke. NOT healthy: loss divergence from step 221.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm right before
opt.step(); identical in two runs):
- Steps 0-219: loss 1.15 at step 0; 25-step medians 0.23, 0.0075, 0.0019, 0.0010, 0.0008,
  0.0010, 0.0008, 0.0004 (175-199); median 0.00038 over 180-219; max over 50-219 0.024.
- Step 220 (loss computed before the first lr-1.5 update): 0.00041. Then 221: 0.158, 222:
  9.46, 223: 1.67, 224: 6.61, 225: 2.19, 226: 1.89, 227: 1.53, then 1.2-1.4; never below
  1.077 from step 225 to the end. Median 1.60 (220-229), 1.151 (230-269), 1.113 (last 40)
  = chance.
- Grad norm: median 0.0070 over 180-219 (tiny: the loss is ~0); 220: 0.0075, 221: 3.0,
  222: 7.5, 223: 1.55, 224: 23.9 (max of the run), 225: 2.18, 226: 0.78, then 0.2-0.7;
  medians 1.16 (220-229), 0.21 (230-269), 0.12 (last 40) - a burst of 4 steps, then flat
  at a level ~x20 the converged one (no sustained growth).
- No NaN/Inf. About 3.5 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "loss_divergence", "first_step": 221, "tolerance": 5}],
          "forbidden": ["nonfinite"]}

STEPS, BATCH, CLASSES = 380, 128, 3
BREAK_AT, LR, LR_MULT = 220, 0.05, 30.0


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


def spiral_batch(g):
    """Three interleaved 2-d spirals (class = arm), radius 0.2-1, noise sd 0.05, lifted to 8
    features with fixed sin/cos transforms."""
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    r = 0.2 + 0.8 * torch.rand(BATCH, generator=g)
    th = y.float() * 2.094 + 4.0 * r + 0.1 * torch.randn(BATCH, generator=g)
    p = (torch.stack([r * torch.cos(th), r * torch.sin(th)], 1)
         + 0.05 * torch.randn(BATCH, 2, generator=g))
    feats = torch.cat([p, torch.sin(2 * p), torch.cos(2 * p), p ** 2], 1)
    return feats, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(6)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(71)
    model = nn.Sequential(nn.Linear(8, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 64),
                          nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            if step == BREAK_AT:                    # bug: "lr *= 30" meant for a warmup ratio
                for grp in opt.param_groups:
                    grp["lr"] = LR * LR_MULT
            x, y = spiral_batch(g)
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
