"""Pathological: an attention-pooling point-set classifier trained on label-smoothed soft
targets with SGD + momentum; from step 150 on a refactored config builder writes the soft
targets in percent (they sum to 100 instead of 1), so the cross-entropy and its gradient are
~100x larger with the learning rate unchanged. The gradient norm is ~85x its pre-bug level
at step 150 and ~6,600x at step 151, the loss reaches 6.8e14 at step 152 and is NaN from
step 153 to the end of the run.

What it does: 2-D point clouds of 24 points from 6 shape classes (circle, segment, square
outline, cross, two clusters, spiral), randomly rotated and scaled, jittered (sd 0.12).
Fresh batch of 32 per step. Model: per-point MLP (2-48-48), one self-attention layer
(4 heads, residual), attention pooling with a learned query (nn.MultiheadAttention), MLP
head 48-48-6. Soft-target cross-entropy with label smoothing 0.1; from step 150 the targets
are multiplied by 100. SGD(lr 0.05, momentum 0.9, constant), 360 steps, no clipping, no NaN
guard. The cross-entropy against the correct (sum-1) targets is recorded as
ce_correct_targets.

What is TRUE of the run (measured; printed at the end):
- Steps 0-149: loss 20-step window medians 1.79, 1.79, 1.77, 1.63, 1.47, 1.43, 1.39
  (120-139); loss 1.397 at step 149 (ln 6 = 1.79); held-out accuracy 0.18 (step 19) ->
  0.41 (149). The gradient norm grows as the model leaves the chance-level plateau
  (ordinary learning, the loss falling): median 0.20 over steps 0-59 (window medians 0.21,
  0.18, 0.26), 0.80 over 60-149 (window medians 0.70, 1.12, 1.08, 0.77), pre-bug maximum
  3.23 at step 81; 1.07 at step 149.
- Step 150: loss 132.5 (= 100 x 1.325), gradient norm 64.8; step 151: loss 2,700, gradient
  norm 5,070; step 152: loss 6.8e14, gradient norm 1.8e14; held-out accuracy 0.17, 0.17,
  0.15 (chance).
- Steps 153-359: loss and gradient norm NaN on every step (207 non-finite steps); held-out
  accuracy stuck at 0.147.
- LR constant 0.05.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 150, "tolerance": 1},
        {"id": "nonfinite", "first_step": 153, "tolerance": 1},
    ],
}

CLASSES, POINTS, D, BATCH, STEPS, LR, SMOOTH, BUG_STEP = 6, 24, 48, 32, 360, 0.05, 0.1, 150
PERCENT = 100.0


def point_sets(g, n):
    """2-D point clouds of 6 shape classes (circle, segment, square outline, cross, two
    clusters, spiral), randomly rotated, scaled and jittered; points in random order."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    u = torch.rand(n, POINTS, generator=g)
    pts = torch.empty(n, POINTS, 2)
    ang = 2 * math.pi * u
    shapes = [
        torch.stack([torch.cos(ang), torch.sin(ang)], -1),                       # circle
        torch.stack([2 * u - 1, torch.zeros_like(u)], -1),                        # segment
        torch.stack([torch.where(u < 0.5, 4 * u - 1, torch.sign(u - 0.75)),
                     torch.where(u < 0.5, torch.sign(u - 0.25), 4 * u - 3)], -1),  # square
        torch.stack([torch.where(u < 0.5, 4 * u - 1, torch.zeros_like(u)),
                     torch.where(u < 0.5, torch.zeros_like(u), 4 * u - 3)], -1),  # cross
        torch.stack([torch.sign(u - 0.5) * 0.7, torch.zeros_like(u)], -1),        # clusters
        torch.stack([u * torch.cos(4 * math.pi * u), u * torch.sin(4 * math.pi * u)], -1),
    ]
    for c in range(CLASSES):
        m = y == c
        pts[m] = shapes[c][m]
    rot = 2 * math.pi * torch.rand(n, generator=g)
    r = torch.stack([torch.stack([rot.cos(), -rot.sin()], -1),
                     torch.stack([rot.sin(), rot.cos()], -1)], -2)
    scale = 0.7 + 0.6 * torch.rand(n, 1, 1, generator=g)
    pts = (pts @ r) * scale + 0.12 * torch.randn(n, POINTS, 2, generator=g)
    return pts, y


class AttnPoolNet(nn.Module):
    """Per-point MLP, one self-attention layer, attention pooling with a learned query."""

    def __init__(self):
        super().__init__()
        self.point = nn.Sequential(nn.Linear(2, D), nn.ReLU(), nn.Linear(D, D))
        self.mix = nn.MultiheadAttention(D, 4, batch_first=True)
        self.query = nn.Parameter(0.1 * torch.randn(1, 1, D))
        self.pool = nn.MultiheadAttention(D, 4, batch_first=True)
        self.head = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, CLASSES))

    def forward(self, pts):
        h = self.point(pts)
        h = h + self.mix(h, h, h, need_weights=False)[0]
        q = self.query.expand(pts.shape[0], -1, -1)
        return self.head(self.pool(q, h, h, need_weights=False)[0].squeeze(1))


def soft_targets(y, in_percent):
    """Label smoothing; the refactored config builder writes the targets in percent."""
    t = torch.full((len(y), CLASSES), SMOOTH / CLASSES)
    t[torch.arange(len(y)), y] += 1 - SMOOTH
    return t * PERCENT if in_percent else t


def med(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(17)
    pv, yv = point_sets(g, 1024)
    model = AttnPoolNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses, gnorms, ces = [], [], []

    def val_acc():
        with torch.no_grad():
            return round((model(pv).argmax(1) == yv).float().mean().item(), 3)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            pts, y = point_sets(g, BATCH)
            logits = model(pts)
            loss = F.cross_entropy(logits, soft_targets(y, in_percent=step >= BUG_STEP))
            with torch.no_grad():
                ce = F.cross_entropy(logits, soft_targets(y, in_percent=False)).item()
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))
            opt.step()
            rec.step(loss=loss, ce_correct_targets=ce)
            losses.append(loss.item())
            gnorms.append(gn)
            ces.append(ce)
            # (no evaluation right after step 0: the recorder counts FLOPs over step 1, and
            # torch's FlopCounterMode fails on a no_grad forward of an expanded parameter)
            if step % 20 == 19 or BUG_STEP - 1 <= step <= BUG_STEP + 8:
                print(f"step {step} loss {loss.item():.5g} ce(correct targets) {ce:.4g} "
                      f"gn {gn:.5g} val acc {val_acc()}", flush=True)
    w = 20
    for name, v in (("loss", losses), ("ce(correct targets)", ces), ("gnorm", gnorms)):
        print(name, "20-step window medians",
              [float(f"{med(v[i:i + w]):.4g}") for i in range(0, STEPS, w)])
    finite = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    gfin = [i for i, v in enumerate(gnorms) if not math.isfinite(v)]
    print("first nonfinite loss at", finite[0] if finite else None, "count", len(finite),
          "| first nonfinite grad norm at", gfin[0] if gfin else None, "count", len(gfin))
    pre = gnorms[50:BUG_STEP]
    print(f"gnorm pre-bug (50-{BUG_STEP - 1}) median", round(med(pre), 4), "max",
          round(max(pre), 4), "| loss pre-bug median", round(med(losses[50:BUG_STEP]), 4))


if __name__ == "__main__":
    main()
