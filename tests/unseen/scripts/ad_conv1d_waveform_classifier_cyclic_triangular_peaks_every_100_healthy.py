"""1-D CNN (three Conv1d + BatchNorm + ReLU layers 1 -> 16 -> 32 -> 32, kernels 7/5/5, two
max-pools, global average pool, linear head) classifying synthetic 128-sample signals into 5
waveform families: sine, square, sawtooth, triangle and linear chirp, at random frequency
(3-8 cycles per window) and phase, random amplitude 0.5-1.5, additive Gaussian noise sd 1.0.
Fresh batch of 64 every step, cross entropy. SGD, no clipping, 500 steps. Schedule:
CyclicLR(mode="triangular", base_lr=0.005, max_lr=0.6, step_size_up=50) with momentum cycled
0.9 -> 0.8 opposite to the lr: lr troughs (0.005) at steps 0, 100, 200, 300, 400 and peaks
(0.6) at 50, 150, 250, 350, 450 - five full triangles.

What happens: the loss falls in the first cycle (1.6 -> 0.8), then improves slowly while it
wobbles with the lr triangle - higher while the lr is near its peak, lower near the troughs
(a ~0.05-0.1 nat swing, period 100 steps). The gradient norm stays within 0.3-1.0 with no
trend up. HEALTHY: the periodic wobble is the cyclic schedule's, nothing grows.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Loss 1.64 at step 0 (ln 5 = 1.61); 25-step medians 1.40 (0-24), 1.02 (25-49), 0.97
  (50-74), 0.83 (75-99), then between 0.68 and 0.92; last-20 median 0.704.
- Wobble, mean loss over the 25 steps with lr > 0.45 vs the 25 with lr < 0.15 in each cycle:
  0.880 vs 0.784 (100-199), 0.831 vs 0.771 (200-299), 0.775 vs 0.753 (300-399), 0.807 vs
  0.710 (400-499). Median loss around the peaks (peak-5 .. peak+14): 0.876, 0.827, 0.772,
  0.825 at 150/250/350/450; at the end of those cycles 0.738, 0.715, 0.720, 0.704.
- Grad norm: 25-step medians 0.52, 0.68, 0.50, 0.41 over the first cycle, then 0.32-0.51;
  max of the run 1.04 at step 36; largest single-step ratio to the previous 20 steps' median
  x2.35 (step 130). Largest loss ratio x1.58 (step 444).
- No NaN/Inf. About 5 s.
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

STEPS, BATCH, LENGTH, CLASSES = 500, 64, 128, 5
BASE_LR, MAX_LR, HALF = 0.005, 0.6, 50
PEAKS = list(range(HALF, STEPS, 2 * HALF))


class SignalCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(1, 16, 7, padding=3), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 5, padding=2), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 32, 5, padding=2), nn.BatchNorm1d(32), nn.ReLU())
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.fc(self.net(x).mean(2))


def waveform_batch(g):
    """Five waveform families (sine, square, sawtooth, triangle, linear chirp) at random
    frequency and phase, random amplitude 0.5-1.5, additive noise sd 1.0."""
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    t = torch.arange(LENGTH, dtype=torch.float32)[None] / LENGTH
    f = 3 + 5 * torch.rand(BATCH, 1, generator=g)
    ph = torch.rand(BATCH, 1, generator=g)
    cyc = f * t + ph
    frac = cyc - cyc.floor()
    waves = torch.stack([
        torch.sin(2 * math.pi * cyc),
        torch.sign(torch.sin(2 * math.pi * cyc)),
        2 * frac - 1,
        4 * (frac - 0.5).abs() - 1,
        torch.sin(2 * math.pi * (f * t + 4 * t * t + ph)),
    ], 1)
    x = waves[torch.arange(BATCH), y]
    x = x * (0.5 + torch.rand(BATCH, 1, generator=g)) + 1.0 * torch.randn(BATCH, LENGTH,
                                                                          generator=g)
    return x[:, None], y


def facts(rows):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    lr = [r[2] for r in rows]
    print(f"[all] nonfinite {sum(not math.isfinite(v) for v in loss + gn)}; "
          f"loss step 0 {loss[0]:.4g}, last 20 median {med(loss[-20:]):.4g}; max grad "
          f"{max(gn):.4g} at {max(range(len(gn)), key=gn.__getitem__)}")
    for p in PEAKS:
        lo = p - HALF
        print(f"[cycle {lo}-{lo + 2 * HALF - 1}] loss med at trough {lo}-{lo + 9}: "
              f"{med(loss[lo:lo + 10]):.4g}, around peak {p - 5}-{p + 14}: "
              f"{med(loss[p - 5:p + 15]):.4g}, end {lo + 90}-{lo + 99}: "
              f"{med(loss[lo + 90:lo + 100]):.4g} | grad trough {med(gn[lo:lo + 10]):.4g}, "
              f"peak {med(gn[p - 5:p + 15]):.4g}, end {med(gn[lo + 90:lo + 100]):.4g}, max "
              f"{max(gn[lo:lo + 100]):.4g}")
    for a in range(100, STEPS, 100):
        hi = [loss[i] for i in range(a, a + 100) if lr[i] > 0.45]
        lo = [loss[i] for i in range(a, a + 100) if lr[i] < 0.15]
        print(f"[phase {a}-{a + 99}] mean loss where lr > 0.45: {statistics.mean(hi):.4g} "
              f"({len(hi)} steps), where lr < 0.15: {statistics.mean(lo):.4g} ({len(lo)} steps)")
    worst = max(range(20, len(gn)), key=lambda i: gn[i] / med(gn[i - 20:i]))
    print(f"[grad] largest ratio to previous-20 median: {gn[worst] / med(gn[worst - 20:worst]):.3g}"
          f" at {worst}")
    worstl = max(range(20, len(loss)), key=lambda i: loss[i] / med(loss[i - 20:i]))
    print(f"[loss] largest ratio to previous-20 median: "
          f"{loss[worstl] / med(loss[worstl - 20:worstl]):.3g} at {worstl}")
    for a in range(0, len(rows), 25):
        print(f"[win] {a}-{a + 24}: lr {lr[a]:.4g} loss {med(loss[a:a + 25]):.4g} "
              f"grad {med(gn[a:a + 25]):.4g} max grad {max(gn[a:a + 25]):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(4)
    model = SignalCNN()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=BASE_LR, max_lr=MAX_LR,
                                              step_size_up=HALF, mode="triangular",
                                              base_momentum=0.8, max_momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = waveform_batch(g)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn, lr))
            if step % 50 == 0:
                print(f"step {step} lr {lr:.4f} loss {loss.item():.4f} grad_norm {gn:.4g}",
                      flush=True)
    facts(rows)


if __name__ == "__main__":
    main()
