"""Pathological: a small CNN classifies noisy 14x14 glyph images; from step 180 on the input
pipeline loses its ToTensor + Normalize step (a refactor) and the model is fed raw 8-bit
pixel values 0-255 instead of (x/255 - 0.2) / 0.3, for the rest of the run. The gradient
norm jumps ~450x at step 180 and stays ~7-10x its pre-bug level to the end; the loss jumps
~90x and stays above its pre-bug level to the end of the run (worse than the same run
without the bug by ~50%).

What it does: 8 glyph classes, each 3 random strokes (row, column or diagonal segments);
every image is its glyph shifted by up to 2 px, at a low random contrast (0.3-0.7), plus
heavy Gaussian noise (sd 0.35) and a 0.1 offset, clamped to 0-1 and stored as 8-bit
values. Fresh batch of 32 per step. Model: Conv(1-16) - ReLU - MaxPool - Conv(16-32) -
ReLU - MaxPool - Linear(288-64) - ReLU - Linear(64-8), no normalisation layers.
Cross-entropy, Adam(lr 1e-3, constant), 380 steps, no clipping. The batch accuracy is
recorded as the metric acc.

What is TRUE of the run (measured; printed at the end):
- Steps 0-179: loss 2.10 at step 0, 20-step window medians 2.08, 2.04, 1.90, 1.68, 1.50,
  1.48, 1.26, 1.28, 1.19 (160-179); batch accuracy (window means) 0.11 -> 0.53; held-out
  accuracy 0.59 at step 179. Gradient norm window medians 0.52-3.0, median 2.83 over
  80-179 (max 4.30).
- Step 180 (first raw batch): loss 110.1 (step 179: 1.11), gradient norm 1,267 (the run's
  maximum); steps 181-183: loss 49.7, 55.6, 65.1, gradient norm 641, 749, 939.
- Steps 180-379: loss window medians 31.2, 8.61, 3.83, 2.28, 1.73, 1.69, 1.40, 1.51, 1.40,
  1.38 -- above the pre-bug 1.19 for the rest of the run (median 1.78 over 180-379);
  batch accuracy window means 0.49-0.55 (0.53 before). Gradient norm window medians 536,
  132, 71, 36, 27, 26, 22, 24, 24, 21: median 30.5 over 180-379 (10.8x the pre-bug
  median), never below 11.3.
- The same run without the bug (measured separately) reaches loss window medians
  0.87-0.93 over 280-379, batch accuracy ~0.66, gradient norm ~2.6-3.7.
- LR constant 1e-3. No NaN/Inf.
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
        {"id": "gradient_explosion", "first_step": 180, "tolerance": 1},
    ],
}

CLASSES, SIZE, BATCH, STEPS, LR, BUG_STEP = 8, 14, 32, 380, 1e-3, 180
MEAN, STD = 0.2, 0.3                       # the dataset's pixel statistics (0-1 scale)


def prototypes(g):
    """Each class is a glyph of 3 random strokes (row, column or diagonal segments)."""
    protos = torch.zeros(CLASSES, SIZE, SIZE)
    for c in range(CLASSES):
        for _ in range(3):
            kind = torch.randint(0, 3, (1,), generator=g).item()
            a = torch.randint(2, SIZE - 2, (1,), generator=g).item()
            lo = torch.randint(1, 5, (1,), generator=g).item()
            hi = torch.randint(SIZE - 5, SIZE - 1, (1,), generator=g).item()
            for k in range(lo, hi):
                if kind == 0:
                    protos[c, a, k] = 1.0
                elif kind == 1:
                    protos[c, k, a] = 1.0
                else:
                    protos[c, k, (k + a) % SIZE] = 1.0
    return protos


def batch_uint8(g, protos, n):
    """Raw 8-bit frames: the glyph shifted by up to 2 px, low random contrast, heavy noise."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    shifts = torch.randint(-2, 3, (n, 2), generator=g).tolist()
    img = torch.stack([torch.roll(protos[c], (dy, dx), (0, 1))
                       for c, (dy, dx) in zip(y.tolist(), shifts, strict=True)])
    img = img * (0.3 + 0.4 * torch.rand(n, 1, 1, generator=g))
    img = img + 0.35 * torch.randn(n, SIZE, SIZE, generator=g) + 0.1
    return (img.clamp(0, 1) * 255).round().unsqueeze(1), y


def transform(raw, normalize):
    """The pipeline's ToTensor + Normalize; with normalize=False only the float cast."""
    return (raw / 255.0 - MEAN) / STD if normalize else raw


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 3 * 3, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def med(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(9)
    protos = prototypes(g)
    rv, yv = batch_uint8(g, protos, 1024)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses, gnorms, accs = [], [], []

    def val(normalize):
        with torch.no_grad():
            return round((model(transform(rv, normalize)).argmax(1) == yv).float().mean()
                         .item(), 3)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            raw, y = batch_uint8(g, protos, BATCH)
            x = transform(raw, normalize=step < BUG_STEP)   # Normalize dropped at BUG_STEP
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            acc = (logits.argmax(1) == y).float().mean().item()
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters()))
            opt.step()
            rec.step(loss=loss, acc=acc)
            losses.append(loss.item())
            gnorms.append(gn)
            accs.append(acc)
            if step % 20 == 0 or BUG_STEP - 1 <= step <= BUG_STEP + 3 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.5g} acc {acc:.3f} gn {gn:.5g} "
                      f"val acc (normalised / raw inputs) {val(True)} / {val(False)}",
                      flush=True)
    w = 20
    print("loss 20-step window medians", [float(f"{med(losses[i:i + w]):.4g}")
                                          for i in range(0, STEPS, w)])
    print("acc 20-step window means", [round(sum(accs[i:i + w]) / w, 3)
                                       for i in range(0, STEPS, w)])
    print("gnorm 20-step window medians", [float(f"{med(gnorms[i:i + w]):.4g}")
                                           for i in range(0, STEPS, w)])
    pre, post = gnorms[80:BUG_STEP], gnorms[BUG_STEP:]
    print(f"gnorm pre-bug (80-{BUG_STEP - 1}) median", round(med(pre), 4), "max",
          round(max(pre), 4), "| post-bug median", round(med(post), 2), "min",
          round(min(post), 3), "max", round(max(post), 1), "at",
          BUG_STEP + post.index(max(post)), "ratio of medians", round(med(post) / med(pre), 1))
    print(f"loss pre-bug (80-{BUG_STEP - 1}) median", round(med(losses[80:BUG_STEP]), 4),
          "max", round(max(losses[80:BUG_STEP]), 4), f"| at {BUG_STEP}",
          round(losses[BUG_STEP], 2), "post-bug median", round(med(losses[BUG_STEP:]), 4),
          "max", round(max(losses[BUG_STEP:]), 2), "at",
          BUG_STEP + losses[BUG_STEP:].index(max(losses[BUG_STEP:])),
          "nonfinite", sum(not math.isfinite(v) for v in losses))


if __name__ == "__main__":
    main()
