"""Full-batch regression with SGDR: a tanh MLP (16 -> 64 -> 64 -> 64 -> 4) fit to a fixed set
of 1024 points (targets tanh(x @ W / 3) + noise sd 0.1, so the MSE floor is ~0.01). Plain SGD
on the whole set every step; CosineAnnealingWarmRestarts(T_0=250): lr 1.0 -> 0.05 over steps
0-249, warm restart to 1.0 at step 250, 1.0 -> 0.05 again over 250-499. No clipping.

Mechanism: while the learning rate decays, the loss settles into a sharper region (curvature
grows towards 2/lr, "progressive sharpening"). After the warm restart the high learning rate
is unstable there: the gradient grows geometrically along the sharp direction for ~10 steps,
the loss rises, the iterate is catapulted to a flatter region and the loss comes back down
below where it was - the well-known catapult / edge-of-stability spike. HEALTHY: transient,
the training recovers by itself and ends better.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Before the burst: loss 0.0155 at 245, 0.0130 at 274; grad norm 0.012 at 245, falling to
  0.0085 at 274-276 after the restart (median 0.0091 over 266-285).
- Burst: grad norm 0.0087 (277), 0.0112 (280), 0.0200 (283), 0.0421 (286), 0.113 (290),
  peak 0.279 at 296 (x30 the 266-285 median), 0.161 (300), 0.050 (305), 0.023 (310), 0.011
  (316), 0.0071 (320); 23 steps above 3x (286-308). Loss 0.0125 (283) -> 0.0148 (290) ->
  peak 0.0298 at 296 (x2.4) -> 0.0186 (300) -> 0.0124 (305) -> 0.0114 (313), below the
  pre-burst level from step ~304.
- After: grad 0.0052 (325), 0.0040 (350), 0.0030 at the end; loss 0.0108 (350), 0.0104
  (400), 0.01029 at the end (20% below the 0.0129 before the burst; the floor is ~0.01).
- No other burst; no NaN/Inf. About 6 s alone (13 s with a second run beside it).
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

N, FEAT, WIDTH, OUT = 1024, 16, 64, 4
CYCLE, CYCLES, LR_MAX, LR_MIN = 250, 2, 1.0, 0.05
STEPS = CYCLE * CYCLES


class TanhMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEAT, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH),
                                 nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                                 nn.Linear(WIDTH, OUT))

    def forward(self, x):
        return self.net(x)


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
    model = TanhMLP()
    opt = torch.optim.SGD(model.parameters(), lr=LR_MAX)
    # SGDR: cosine from LR_MAX to LR_MIN over each cycle, then a warm restart
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=CYCLE,
                                                                 eta_min=LR_MIN)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            loss = F.mse_loss(model(x), y)            # full batch
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss, lr=lr)
            rows.append((loss.item(), gn))
            if step % 25 == 0 or 245 <= step <= 320 or step >= STEPS - 3:
                print(f"step {step} lr {lr:.4f} loss {loss.item():.5f} grad_norm {gn:.4g}",
                      flush=True)
    burst_facts(rows)


if __name__ == "__main__":
    main()
