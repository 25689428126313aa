"""Full-batch gradient descent at the edge of stability: a residual MLP (stem 16 -> 48, 8 blocks
x + fc2(gelu(fc1(x))), head 48 -> 4, no normalisation) fit to a fixed set of 1024 points
(targets tanh(x @ W / 3) + noise sd 0.1). Plain SGD, constant lr 0.36 (just above 2/lambda of
the initial Hessian, lambda ~6.05), the whole set every step, 400 steps, no clipping.

Mechanism: gradient descent with a fixed step keeps sharpening the loss until the curvature
crosses 2/lr; the iterate then oscillates along the sharp direction with a geometrically
growing amplitude, the loss rises, and the dynamics self-stabilise (the curvature drops) and
the loss returns below where it was. Nothing in the loop changes - this is GD's own
behaviour. HEALTHY: one transient burst, recovered, the loss keeps improving to the end.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Before: grad norm ~0.010-0.011 over steps 180-280, 0.0134 at 300; loss 0.0618 (180), 0.0570
  (300), falling smoothly. Median grad 0.0127 over 289-308.
- Burst: grad norm grows x1.2-1.3 per step from ~300: 0.0175 (303), 0.0299 (306), 0.0614
  (309), 0.135 (312), 0.290 (315), peak 0.521 at 319 (x41), then 0.412 (321), 0.170 (324),
  0.069 (327), 0.032 (330), 0.019 (333), 0.016 (335); 21 steps above 3x (309-329). Loss
  0.0567 (307) -> 0.0587 (313) -> peak 0.0808 at 319 (+42%) -> 0.0590 (324) -> 0.0558 (328),
  below the pre-burst level from ~327.
- After: grad 0.0145 (340), 0.0156 (360), 0.0172 (380), 0.0188 at 399 (1.1-1.5x the
  pre-burst level, creeping up again as the next sharpening cycle starts); loss 0.0548
  (340), 0.0532 (360), 0.0513 (380), 0.0491 at 399 (last 20 median 0.0503, 12% below the
  0.0571 before the burst).
- One burst only; no NaN/Inf. (Run longer, GD enters a second, longer oscillation episode
  from ~420; the run is stopped at 400.) About 8 s alone (17 s with a second run beside it).
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [],
          "forbidden": ["gradient_explosion", "loss_divergence", "nonfinite"]}

STEPS, N, FEAT, WIDTH, OUT, BLOCKS = 400, 1024, 16, 48, 4, 8
LR = 0.36


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class ResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEAT, WIDTH)
        self.blocks = nn.Sequential(*[Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def burst_facts(rows, first=30):
    """Print the facts of the first gradient burst: rows are (loss, grad_norm) per step."""
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    onset = next((i for i in range(first, len(gn)) if gn[i] > 4 * med(gn[i - 20:i])), None)
    if onset is None:
        print("no step's grad norm exceeds 4x the median of the 20 before it")
        return
    base = med(gn[onset - 20:onset])
    end = max(i for i in range(onset, min(onset + 60, len(gn))) if gn[i] > 3 * base)
    peak = max(range(onset, end + 1), key=gn.__getitem__)
    print(f"[burst] onset {onset}, peak {peak} ({gn[peak]:.4g} = x{gn[peak] / base:.3g} the "
          f"median {base:.4g} of steps {onset - 20}-{onset - 1}), last step above 3x: {end}, "
          f"steps above 3x: {sum(gn[i] > 3 * base for i in range(onset, end + 1))}")
    others = [i for i in range(first, len(gn)) if not onset <= i <= end + 20
              and gn[i] > 3 * med(gn[i - 20:i])]
    print(f"[burst] other steps over 3x their previous-20 median: {others}")
    after = slice(end + 1, end + 21)
    print(f"[grad] median before {base:.4g}, during {med(gn[onset:end + 1]):.4g}, "
          f"20 after {med(gn[after]):.4g}, last 20 {med(gn[-20:]):.4g}")
    print(f"[loss] median before {med(loss[onset - 20:onset]):.4g}, max during "
          f"{max(loss[onset:end + 1]):.4g}, 20 after {med(loss[after]):.4g}, "
          f"last 20 {med(loss[-20:]):.4g}, step 0 {loss[0]:.4g}, nonfinite "
          f"{sum(not math.isfinite(v) for v in loss + gn)}")
    print("[loss] 40-step medians: "
          + " ".join(f"{med(loss[a:a + 40]):.4g}" for a in range(0, len(loss), 40)))
    print("[grad] 40-step medians: "
          + " ".join(f"{med(gn[a:a + 40]):.4g}" for a in range(0, len(gn), 40)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    teacher = torch.randn(FEAT, OUT, generator=g)
    x = torch.randn(N, FEAT, generator=g)
    y = torch.tanh(x @ teacher / 3) + 0.1 * torch.randn(N, OUT, generator=g)
    model = ResMLP()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            loss = F.mse_loss(model(x), y)          # full batch: the whole table every step
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 20 == 0 or 300 <= step <= 335 or step >= 390:
                print(f"step {step} loss {loss.item():.5f} grad_norm {gn:.4g}", flush=True)
    burst_facts(rows)


if __name__ == "__main__":
    main()
