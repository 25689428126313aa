"""Tabular regression MLP (12 -> 64 -> 64 -> 1, GELU) on 8192 rows (a linear trend plus sine
interactions, noise sd 0.1), SGD momentum 0.9, batch 128, MSE, 480 steps, no clipping.

The bug: the schedule is a linear warm-up over 400 steps to PEAK_LR, meant to be 0.1 and
written as 1.0 - ten times too high. The learning rate is 0.0025 at step 0, 0.25 at 100, 0.40
at 160, 0.50 at 200, 1.0 from 399.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Steps 0-159 train well: loss 2.2 (0-19) -> 0.15 (80-99) -> 0.11 (100-139) -> 0.064
  (median 140-159, the best window); grad norm median 0.42-0.86 per 20 steps over 40-159
  (0.686 over 40-99), 0.42 over 140-159.
- From ~160 (lr ~0.40) the gradient and the loss grow together and never come back: 20-step
  medians grad 0.84 / loss 0.139 (160-179), 1.36 / 0.367 (180-199); loss 0.10 at 162, 0.18
  at 165, 0.44 at 184, 0.69 at 194; then a sharp finish: grad 5.5 (205), 14.7 (210), 56
  (213), 645 (214), 6.3e8 (215); loss 1.46 (205), 4.6 (210), 15 (213), 300 (214), 4.4e9
  (215), inf at 216, NaN from 217 to the end (264 nonfinite steps; the loop keeps going).
- Onset of the growth: ~160 (gradual over ~45 steps, then geometric from ~205); the cause
  is the warm-up taking the learning rate past what this network tolerates (~0.4).
- About 5 s alone (9 s with a second run beside it on the 2 cores).
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 160, "tolerance": 24}]}

STEPS, BATCH, FEAT = 480, 128, 12
WARMUP, PEAK_LR = 400, 1.0        # intended: PEAK_LR = 0.1


def make_data(g, n=8192):
    """A tabular regression: a linear trend plus a few sine interactions, small noise."""
    w = torch.randn(FEAT, 1, generator=g)
    x = torch.randn(n, FEAT, generator=g)
    y = x @ w * 0.5 + torch.sin(x[:, :3]).sum(1, keepdim=True)
    return x, y + 0.1 * torch.randn(n, 1, generator=g)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEAT, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                                 nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)


def growth_facts(rows, base_steps):
    """Print the facts of the growth: rows are (loss, grad_norm) per step; base_steps the
    steps whose median is the baseline."""
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    base = med(gn[base_steps[0]:base_steps[1]])
    bad = [i for i in range(len(gn)) if not (math.isfinite(gn[i]) and math.isfinite(loss[i]))]
    first_bad = bad[0] if bad else None
    end = first_bad if first_bad is not None else len(gn)
    stay3 = next((i for i in range(base_steps[1], end)
                  if all(g > 3 * base for g in gn[i:end])), None)
    print(f"[grad] baseline median {base:.4g} over steps {base_steps[0]}-{base_steps[1] - 1}; "
          f"above 3x the baseline for good from step {stay3}; first nonfinite step {first_bad}"
          f" ({len(bad)} nonfinite steps)")
    for a in range(0, len(rows), 20):
        fl = [v for v in loss[a:a + 20] if math.isfinite(v)]
        fg = [v for v in gn[a:a + 20] if math.isfinite(v)]
        if not fl:
            print(f"[win] {a}-{a + 19}: all nonfinite")
            continue
        print(f"[win] {a}-{a + 19}: loss median {med(fl):.4g} grad median "
              f"{med(fg) if fg else float('nan'):.4g} max {max(fg) if fg else float('nan'):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(2)
    xs, ys = make_data(g)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=PEAK_LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            idx = torch.randint(0, len(xs), (BATCH,), generator=g)
            x, y = xs[idx], ys[idx]
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 20 == 0 or 140 <= step < 230:
                print(f"step {step} lr {lr:.4g} loss {loss.item():.4g} grad_norm {gn:.4g}",
                      flush=True)
    growth_facts(rows, (40, 100))


if __name__ == "__main__":
    main()
