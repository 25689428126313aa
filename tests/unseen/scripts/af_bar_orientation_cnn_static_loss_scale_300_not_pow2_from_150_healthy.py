"""Small CNN (conv 1->8 3x3, ReLU, maxpool 2, conv 8->16 3x3, ReLU, global average pool,
linear 16->4) classifying 12x12 images by the orientation of one short bar (horizontal,
vertical, diagonal, anti-diagonal; 5 pixels of +1.5 at a random offset) in pixel noise sd
0.6. Fresh batch of 48 every step, cross entropy. SGD lr 0.05 momentum 0.9, no clipping,
320 steps.

What changes: from step 150 manual static loss scaling with a NON-power-of-two scale
S = 300: (loss * S).backward(), every .grad multiplied by 1/S before opt.step(), and the
scaled loss is logged (rec.step(loss=loss * S)). The update is the same as without
scaling; only the logged number is x300 from step 150. HEALTHY: the model happens to leave
its initial near-chance plateau around the same time and learns well afterwards.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm of the
unscaled gradients right before opt.step(); identical in two runs):
- True loss ~ln 4 = 1.386 for a long start: 25-step medians 1.386, 1.391, 1.381, 1.380,
  1.369, 1.339 over 0-149 (slow escape from the plateau from ~step 120), then 1.228, 1.019,
  0.875, 0.599, 0.490, 0.321, 0.290 over 150-320. Median 1.351 (110-149) -> 1.288
  (150-159) -> 1.106 (160-199) -> 0.316 (last 40).
- Logged loss: median 1.351 (110-149) -> 386.5 (150-159) -> 331.8 (160-199) -> 94.7 (last
  40); step 149 logged 1.391, step 150 logged 396.9 (true 1.323). Ratio logged/true = 300
  exactly from 150.
- Grad norm median 0.278 (110-149) -> 0.377 (150-159) -> 0.81 (160-199) -> 0.78 (last 40);
  25-step medians 0.13-0.35 before 150, 0.50, 0.93, 1.62, 0.93, 0.85, 0.56, 0.87 after
  (rising as the model starts to learn, not with the scale); max 3.74 at step 211.
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
          "forbidden": ["loss_divergence", "loss_spike", "gradient_explosion"]}

STEPS, BATCH, SIZE, CLASSES = 320, 48, 12, 4
SCALE_FROM, SCALE = 150, 300.0


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


def bar_batch(g):
    """12x12 images holding one short bar (horizontal, vertical, diagonal, anti-diagonal =
    class 0-3) at a random offset, plus pixel noise sd 0.6."""
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    img = 0.6 * torch.randn(BATCH, 1, SIZE, SIZE, generator=g)
    off = torch.randint(2, SIZE - 7, (BATCH, 2), generator=g)
    for i in range(BATCH):
        r, c, k = int(off[i, 0]), int(off[i, 1]), int(y[i])
        for t in range(5):
            rr, cc = [(r + 2, c + t), (r + t, c + 2), (r + t, c + t), (r + t, c + 4 - t)][k]
            img[i, 0, rr, cc] += 1.5
    return img, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(1)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(21)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(16, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = bar_batch(g)
            loss = F.cross_entropy(model(x), y)
            s = SCALE if step >= SCALE_FROM else 1.0
            opt.zero_grad()
            (loss * s).backward()
            for p in model.parameters():
                p.grad.mul_(1.0 / s)
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
