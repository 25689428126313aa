"""MobileNetV2-style CNN (inverted residuals: 1x1 expand, 3x3 depthwise, linear 1x1 bottleneck,
BatchNorm, ReLU6) classifying synthetic coloured shapes; RMSprop (TF-style settings) with a
polynomial (power 0.9) learning-rate decay to zero. HEALTHY.

What it does: 32x32 RGB images of 6 shape classes (disc, ring, square, cross, two bars,
triangle) at random position, size and colour on a noisy gradient background. Model:
MobileNetV2 layout scaled down (3x3 stem, inverted residual blocks with expansion 1/4,
depthwise 3x3, linear 1x1 bottlenecks, BatchNorm, ReLU6, 1x1 to 128, global average pool,
dropout 0.2, linear). RMSprop(lr 4e-3, alpha 0.9, eps 1e-3, momentum 0.9), weight decay 4e-5 on
weights only, PolynomialLR(power 0.9) from 4e-3 to 0 over the 300 steps (stepped after
rec.step: the recorded lr is the one each step used; 2.4e-5 at step 299). 300 steps of batch
32, fresh images every step.

What is TRUE of the run (measured):
- ln 6 = 1.79. Loss 1.80 at step 0; RMSprop's first steps wobble it up to 1.9-2.28 over steps
  1-10 (the usual start-up transient, back below ln 6 by step 12), then it falls: mean 0.86
  over steps 40-79, 0.43 over 80-119, 0.17 over 160-199, 0.055 over 240-279, 0.045 over the last
  40 steps (per-batch values between 0.002 and 0.36 late in the run: batch-32 noise near zero
  loss). Train accuracy over steps 260-299: 0.98; held-out: loss 0.004, accuracy 1.000.
- Grad norm median 0.86 (1.4 over the first 40 steps, 0.22 over the last 20), max 3.6; no
  NaN/Inf; gradient zero fractions stay below 7% (no dead ReLU6 channels).
- Step time median ~81 ms.
- Nothing is wrong: a healthy run.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
}

STEPS, BATCH, SIZE, CLASSES = 300, 32, 32, 6
LR = 4e-3


def make_images(n, g):
    """Six shape classes (disc, ring, square, cross, horizontal bar pair, triangle) at random
    position, size and colour, on a noisy gradient background."""
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, SIZE), torch.linspace(-1, 1, SIZE), indexing="ij")
    cx = (torch.rand(n, 1, 1, generator=g) - 0.5) * 0.8
    cy = (torch.rand(n, 1, 1, generator=g) - 0.5) * 0.8
    r = 0.3 + 0.25 * torch.rand(n, 1, 1, generator=g)
    dx, dy = xx - cx, yy - cy
    dist = (dx ** 2 + dy ** 2).sqrt()
    masks = torch.stack([
        dist < r,                                                   # disc
        (dist < r) & (dist > 0.6 * r),                              # ring
        (dx.abs() < 0.8 * r) & (dy.abs() < 0.8 * r),                # square
        ((dx.abs() < 0.25 * r) | (dy.abs() < 0.25 * r)) & (dist < r),   # cross
        ((dy - 0.45 * r).abs() < 0.2 * r) | ((dy + 0.45 * r).abs() < 0.2 * r),  # two bars
        (dy < 0.7 * r) & (dy > -0.7 * r + 2 * dx.abs() - 0.3 * r),      # triangle
    ], 1).float()                                                   # n x 6 x H x W
    mask = masks[torch.arange(n), labels]
    colour = torch.rand(n, 3, 1, 1, generator=g) * 1.6 - 0.8
    bg_dir = torch.randn(n, 2, 1, 1, generator=g) * 0.3
    background = (bg_dir[:, :1] * xx + bg_dir[:, 1:] * yy).expand(n, 3, SIZE, SIZE)
    img = background + mask[:, None] * (colour + 0.6 * colour.sign())
    img = img + 0.25 * torch.randn(img.shape, generator=g)
    return img, labels


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout),   # linear bottleneck
        )

    def forward(self, x):
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetV2(nn.Module):
    # (expansion, out channels, repeats, first stride), as in the paper's table, scaled down
    CFG = ((1, 8, 1, 1), (4, 16, 2, 2), (4, 24, 2, 2), (4, 32, 2, 2), (4, 48, 1, 1))

    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True)]
        cin = 16
        for t, c, reps, s in self.CFG:
            for i in range(reps):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 128, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(128, CLASSES))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    val_x, val_y = make_images(512, g)
    model = MobileNetV2()
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim == 1 else decay).append(p)
    opt = torch.optim.RMSprop([{"params": decay, "weight_decay": 4e-5},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=LR, alpha=0.9, eps=1e-3, momentum=0.9)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=STEPS, power=0.9)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = make_images(BATCH, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc)
            sched.step()
            if step % 30 == 0 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} acc {acc.item():.2f} "
                      f"lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    model.eval()
    with torch.no_grad():
        val_logits = model(val_x)
    print(f"val loss {F.cross_entropy(val_logits, val_y).item():.4f} "
          f"acc {(val_logits.argmax(1) == val_y).float().mean().item():.3f}; "
          f"ln C = {math.log(CLASSES):.3f}")


if __name__ == "__main__":
    main()
