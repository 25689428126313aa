"""A pre-activation ResNet on noisy shapes: CutMix on half the batches, off for the last 80 steps.

What it does: 6 shape classes (disc, ring, square, cross, triangle, bar) on 16x16 images at a
random centre, size and rotation, random contrast, a random background gradient and noise
0.35; fresh batches of 64. A pre-activation ResNet (He et al. 2016b: stem + three BN-ReLU-conv
blocks 16-32-48). SGD Nesterov momentum 0.9, weight decay 5e-4, OneCycle to lr 0.08
(15 % warmup). timm-style CutMix (Yun et al. 2019, lambda ~ Beta(1, 1), label weight = area
kept) on each batch with probability 0.5; switched off for the final 80 steps (370-449), the
"no-aug tail" YOLOX and DeiT-style recipes use. 450 steps. Standard preset. Seeded,
deterministic.

What is TRUE of the run (measured):
- Healthy: held-out accuracy (1,000 images, after the recorded run's steps, in eval mode)
  0.397 (step 99), 0.439 (199), 0.571 (299), 0.632 (369), 0.644 (449); held-out loss 1.375,
  1.300, 1.085, 0.992, 0.885.
- The recorded loss mixes two populations on a per-batch coin flip: CutMix batches have a
  much higher loss than clean ones (50-step medians, CutMix / clean: 1.698 / 1.426 (50-99),
  1.646 / 1.128 (150-199), 1.686 / 1.078 (250-299), 1.706 / 0.943 (350-399)); CutMix batches
  reach 2.16, clean ones stay below 1.6 after step 50. So the loss jumps up and down from
  one step to the next (median |change| 0.171 over steps 0-369, 0.063 over 370-449), and
  the all-batch median follows the share of CutMix batches in a window (250-299: 30 of 50
  CutMix, median 1.498; 200-249: 24 of 50, median 1.136).
- Switching CutMix off at 370 drops the loss at once and the spikes stop: median 1.116 over
  steps 330-369, 0.957 over 370-389, 0.868 over 390-449; range 0.71-1.03 over 400-449.
- Gradient norm does not follow the loss: 50-step medians 0.81, 0.89, 1.06, 0.94, 0.94,
  0.98, 0.92, 0.96, 0.97; range 0.56-2.92 (max at step 54, near the OneCycle peak). No NaN/Inf.
- ~17 s on 2 busy CPU cores.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "forbidden": ["loss_spike", "loss_divergence", "loss_plateau", "gradient_explosion"],
}

STEPS, BATCH, SIDE, CLASSES = 450, 64, 16, 6
CUTMIX_PROB, CUTMIX_OFF = 0.5, 370
LR = 0.08


def shapes(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Six shape classes (disc, ring, square, cross, triangle, bar) drawn at a random centre,
    size and rotation, with random contrast, a random background gradient and noise 0.35."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    ys, xs = torch.meshgrid(torch.arange(SIDE).float(), torch.arange(SIDE).float(),
                            indexing="ij")
    cx, cy = 5 + 6 * torch.rand(2, n, generator=g)
    r = 2.5 + 2.5 * torch.rand(n, generator=g)
    a = torch.rand(n, generator=g) * math.pi
    dx, dy = xs[None] - cx[:, None, None], ys[None] - cy[:, None, None]
    u = dx * torch.cos(a)[:, None, None] + dy * torch.sin(a)[:, None, None]
    v = -dx * torch.sin(a)[:, None, None] + dy * torch.cos(a)[:, None, None]
    R = r[:, None, None]
    d = (dx ** 2 + dy ** 2).sqrt()
    masks = torch.stack([
        d < R,
        (d < R) & (d > R - 1.6),
        (u.abs() < R * 0.8) & (v.abs() < R * 0.8),
        ((u.abs() < 1.2) & (v.abs() < R)) | ((v.abs() < 1.2) & (u.abs() < R)),
        (v > -R * 0.6) & (v < R * 0.8) & (u.abs() < (R * 0.8 - v) * 0.6),
        (u.abs() < R) & (v.abs() < 1.3),
    ], 1).float()
    img = masks[torch.arange(n), y] * (0.5 + 0.5 * torch.rand(n, 1, 1, generator=g))
    slope = (torch.rand(n, 2, generator=g) - 0.5) * 0.06
    img = img + slope[:, 0, None, None] * xs + slope[:, 1, None, None] * ys
    img = img + 0.35 * torch.randn(n, SIDE, SIDE, generator=g)
    return img[:, None], y


def cutmix(x: torch.Tensor, y: torch.Tensor, g: torch.Generator):
    """Yun et al. (2019): paste a random box from a shuffled copy of the batch; the label
    weight is the area actually kept. lambda ~ Beta(1, 1)."""
    lam = float(torch.rand((), generator=g))          # Beta(1, 1) is uniform
    perm = torch.randperm(x.shape[0], generator=g)
    h = w = SIDE
    cut = math.sqrt(1 - lam)
    ch, cw = int(h * cut), int(w * cut)
    cy, cx = int(torch.randint(0, h, (), generator=g)), int(torch.randint(0, w, (), generator=g))
    y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, h)
    x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, w)
    x = x.clone()
    x[:, :, y0:y1, x0:x1] = x[perm, :, y0:y1, x0:x1]
    lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)
    return x, y, y[perm], lam


class PreActBlock(nn.Module):
    """He et al. (2016b): BN-ReLU-conv twice, identity (or 1x1) skip."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1,
                                                                bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.short = (None if stride == 1 and cin == cout
                      else nn.Conv2d(cin, cout, 1, stride, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(x))
        skip = x if self.short is None else self.short(h)
        h = self.conv1(h)
        return self.conv2(F.relu(self.bn2(h))) + skip


class PreActResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.blocks = nn.Sequential(PreActBlock(16, 16, 1), PreActBlock(16, 32, 2),
                                    PreActBlock(32, 48, 2))
        self.bn = nn.BatchNorm2d(48)
        self.fc = nn.Linear(48, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.blocks(self.stem(x))))
        return self.fc(h.mean((2, 3)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data_g, mix_g = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    val_x, val_y = shapes(torch.Generator().manual_seed(77), 1000)

    model = PreActResNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4,
                          nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=STEPS,
                                                pct_start=0.15)
    log = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = shapes(data_g, BATCH)
            # timm-style: CutMix on a batch with probability 0.5; switched off for the final
            # 80 steps ("no-aug" tail, as YOLOX and DeiT fine-tuning recipes do)
            mixed = step < CUTMIX_OFF and float(torch.rand((), generator=mix_g)) < CUTMIX_PROB
            if mixed:
                x, ya, yb, lam = cutmix(x, y, mix_g)
                out = model(x)
                loss = lam * F.cross_entropy(out, ya) + (1 - lam) * F.cross_entropy(out, yb)
            else:
                lam = 1.0
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            raw = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                for p in model.parameters()))
            opt.step()
            sched.step()
            rec.step(loss=loss)
            log.append((step, loss.item(), raw, mixed, lam))
            if step % 50 == 49 or step == CUTMIX_OFF - 1:
                model.eval()
                with torch.no_grad():
                    out = model(val_x)
                model.train()
                print(f"step {step}: val loss {F.cross_entropy(out, val_y).item():.3f} "
                      f"acc {(out.argmax(1) == val_y).float().mean().item():.3f}")

    def med(v: list) -> float:
        return sorted(v)[len(v) // 2] if v else float("nan")

    for s in range(0, STEPS, 50):
        w = [r for r in log if s <= r[0] < s + 50]
        for name, part in (("all", w), ("cutmix", [r for r in w if r[3]]),
                           ("clean", [r for r in w if not r[3]])):
            if part:
                print(f"steps {s:3d}-{s + 49:3d} {name:6s} n={len(part):2d}: loss median "
                      f"{med([r[1] for r in part]):.3f} [{min(r[1] for r in part):.3f}, "
                      f"{max(r[1] for r in part):.3f}]  grad norm median "
                      f"{med([r[2] for r in part]):.3f} [{min(r[2] for r in part):.3f}, "
                      f"{max(r[2] for r in part):.3f}]")
    for a, b in ((330, 370), (370, 390), (390, 450)):
        w = log[a:b]
        print(f"steps {a}-{b - 1}: loss median {med([r[1] for r in w]):.3f} "
              f"grad norm median {med([r[2] for r in w]):.3f}")


if __name__ == "__main__":
    main()
