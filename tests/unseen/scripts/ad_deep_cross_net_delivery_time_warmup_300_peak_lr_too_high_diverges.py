"""Deep & Cross network (DCN-v2 style: 6 numeric features + 3 categorical features embedded in
4-d each, concatenated to x0 of width 18; two cross layers x_{l+1} = x0 * (W x_l + b) + x_l in
parallel with a deep tower 18 -> 64 -> 32 (ReLU); linear head on both) on a synthetic tabular
regression, a standardised 'delivery time': numeric features N(0, 1), categoricals with 12
levels each; target = linear part + pairwise numeric interactions + per-level category
effects + noise sd 0.2. Fresh batch of 512 rows every step, MSE. SGD (momentum 0.9), no
clipping, 450 steps.

The bug: a linear warm-up over 300 steps to a peak that was meant to be 0.06 and was typed
0.6. The lr is 0.002 at step 0, 0.102 at 50, 0.202 at 100, 0.242 at 120, and would reach
0.6 at 299. (Measured with the same seed and peaks of 0.05 and 0.1 instead: both train
stably for all 450 steps, to a loss of ~0.06-0.1.)

What happens: the early warm-up trains well (the loss falls from 7.6 to ~0.25 by steps
80-99, lr ~0.16-0.20). Once the ramp passes ~0.21-0.22 the update is past what the cross
layers' multiplicative interactions tolerate: from ~104-108 the loss and the gradient start
to grow and never come back - slowly for ~10 steps, then geometrically - to overflow at
123-124. Every step after is NaN (the loop keeps going until 450, as an unattended job
would).

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Steps 0-99: loss 7.60 at step 0; 20-step medians 5.64 (0-19), 1.40, 0.956, 0.414, 0.252
  (80-99, the best window). Grad norm 20-step medians 4.30, 5.09, 3.76 (max 9.36 in 40-59,
  while the loss is still high), 1.73, 1.47 (80-99).
- Growth: loss 0.216-0.350 and grad 1.4-2.2 over 100-106; step 107 0.288 / 2.44; 108: 0.585
  / 3.62 (first step above 2x the 80-99 median grad); 109: 0.706 / 3.94; 110-111 dip to
  0.52 / 2.55 and 0.44 / 1.97; 112: 1.15 / 6.31; 113-118: loss 1.8-4.2, grad 4.2-6.7; 119:
  4.23 / 12.2; 120: 8.17 / 16.5; 121: 21.9 / 34.0; 122: 1400 / 2210; 123: 1.4e17 / 5.3e15;
  124: NaN (first nonfinite step), NaN to the end (326 nonfinite steps).
- The grad norm is above 3x the 80-99 median (1.47) for good from step 115 (lr 0.232);
  onset of the growth ~104-108 (lr ~0.21). About 4 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 108, "tolerance": 10},
                       {"id": "nonfinite", "first_step": 124, "tolerance": 1}]}

STEPS, BATCH, NUM, CATS, CARD, EMB = 450, 512, 6, 3, 12, 4
WARMUP = 300
PEAK_LR = 0.6                          # meant: 0.06
IN = NUM + CATS * EMB


class CrossLayer(nn.Module):
    """x_{l+1} = x0 * (W x_l + b) + x_l (DCN-v2 cross layer)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, IN)

    def forward(self, x0, x):
        return x0 * self.lin(x) + x


class DeepCross(nn.Module):
    def __init__(self):
        super().__init__()
        self.embs = nn.ModuleList([nn.Embedding(CARD, EMB) for _ in range(CATS)])
        self.cross = nn.ModuleList([CrossLayer() for _ in range(2)])
        self.deep = nn.Sequential(nn.Linear(IN, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(IN + 32, 1)

    def forward(self, num, cat):
        x0 = torch.cat([num] + [e(cat[:, k]) for k, e in enumerate(self.embs)], 1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.head(torch.cat([x, self.deep(x0)], 1)).squeeze(1)


def make_truth(g):
    return (torch.randn(NUM, generator=g), torch.randn(NUM, NUM, generator=g) * 0.3,
            torch.randn(CATS, CARD, generator=g) * 0.5)


def delivery_batch(truth, g):
    """Tabular regression, a standardised 'delivery time': 6 numeric features (distance,
    load, ...) N(0, 1) and 3 categorical ones (zone, courier type, hour bucket; 12 levels
    each). Target = linear part + pairwise numeric interactions + category effects +
    noise sd 0.2."""
    w, pair, cat_eff = truth
    num = torch.randn(BATCH, NUM, generator=g)
    cat = torch.randint(0, CARD, (BATCH, CATS), generator=g)
    y = (num @ w + ((num @ pair) * num).sum(1)
         + sum(cat_eff[k, cat[:, k]] for k in range(CATS)))
    return num, cat, y + 0.2 * torch.randn(BATCH, generator=g)


def facts(rows):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    lr = [r[2] for r in rows]
    bad = [i for i in range(len(rows)) if not (math.isfinite(loss[i]) and math.isfinite(gn[i]))]
    first_bad = bad[0] if bad else None
    end = first_bad if first_bad is not None else len(rows)
    best = min(range(40, end - 20, 20), key=lambda a: med(loss[a:a + 20]))
    base = med(gn[best:best + 20])
    above = next((i for i in range(best, end) if all(v > 3 * base for v in gn[i:end])), None)
    print(f"[all] nonfinite steps {len(bad)}, first {first_bad}; loss step 0 {loss[0]:.4g}; "
          f"best 20-step loss window {best}-{best + 19}: loss {med(loss[best:best + 20]):.4g}, "
          f"grad {base:.4g}; grad above 3x that for good from {above}"
          f" (lr there {lr[above] if above is not None else float('nan'):.4g})")
    for a in range(0, len(rows), 20):
        fl = [v for v in loss[a:a + 20] if math.isfinite(v)]
        fg = [v for v in gn[a:a + 20] if math.isfinite(v)]
        if fl and fg:
            print(f"[win] {a}-{a + 19}: lr {lr[a]:.4g} loss {med(fl):.4g} max {max(fl):.4g} "
                  f"grad {med(fg):.4g} max grad {max(fg):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(29)
    truth = make_truth(g)
    model = DeepCross()
    opt = torch.optim.SGD(model.parameters(), lr=PEAK_LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            num, cat, y = delivery_batch(truth, g)
            loss = F.mse_loss(model(num, cat), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn, lr))
            if step % 50 == 0 or 100 <= step <= 126:
                print(f"step {step} lr {lr:.4g} loss {loss.item():.4g} grad_norm {gn:.4g}",
                      flush=True)
    facts(rows)


if __name__ == "__main__":
    main()
