"""A linear probe (SGD) on frozen CNN features whose learning-rate schedule grows the LR by 5%
per step from step 0 (ExponentialLR with gamma = 1.05: a "decay by 5% per step" config turned
into 1 + 0.05). The LR is already above the stability limit at step 0, so the loss and the
gradient norm grow geometrically from the very first update, faster and faster as the LR
keeps growing, until the loss overflows to inf at step 27 and the loop stops.

What it does: 24x24 images with 1-5 Gaussian blobs on faint noise. A 3-layer ReLU CNN with
global average pooling (64 non-negative, uncentred features) is first trained for 120
unrecorded Adam steps to classify the blob count (held-out acc 0.61) -- a stand-in for a
pretrained checkpoint -- and then frozen. The recorded run fits a zero-initialised
Linear(64, 1) probe that regresses the raw count (1-5, mean 3) with MSE: SGD(lr 2e-3, no
momentum), ExponentialLR(gamma=1.05) stepped every step, batch 64, no clipping. For these
features the probe's loss is quadratic with top Hessian eigenvalue 1642 (printed), so SGD is
stable only for lr < 1.22e-3; lr starts at 1.64x that limit and grows from there. The loop
records each step and breaks after the first non-finite loss.

What is TRUE of the run (measured; printed per step):
- LR: 2.0e-3 at step 0, 2.1e-3 at 1, 2.55e-3 at 5, 3.26e-3 at 10, 5.31e-3 at 20, 7.47e-3 at 27.
- Loss: 10.36 at step 0 (predicting 0 for a mean count of 3), then 42.7, 247, 1508, 1.05e4
  (step 4), 1.6e10 (step 10), 6.5e24 (step 20), 1.27e36 (step 26), inf at step 27: it rises at
  every step; it never falls below its step-0 value.
- Gradient norm (float64): 169 at step 0 (the initial gradient, before any update), 372 at
  step 1, 880, 2183, 5736 (step 4), 7.1e6 (step 10), 1.4e14 (step 20), 6.5e19 (step 26; its
  float32 norm overflows to inf although every element is finite), 6.9e20 at step 27. Ratio
  to the previous step: 2.2 at step 1, 2.4, 2.5, 2.6, 2.7, 3.0, ... 4.2 at step 11, 5.8 at
  step 15, 7.3 at step 21, 10.4 at step 26, 10.6 at step 27 -- growth from the first affected
  step (step 1), accelerating.
- 28 steps recorded (0-27); no step is healthy after step 0. The gradient explosion and the
  loss divergence both start with the first update.
"""

import argparse
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 1, "tolerance": 1},
        {"id": "loss_divergence"},
    ],
}

SIZE, BATCH, PRETRAIN_STEPS, STEPS = 24, 64, 120, 200
LR, GAMMA = 2e-3, 1.05


def blobs(g, n):
    """24x24 images with 1-5 Gaussian blobs (random centre, width 1.2-2.2, brightness 0.6-1.4)
    on noise (std 0.1). Returns images and blob counts."""
    yy, xx = torch.meshgrid(torch.arange(SIZE, dtype=torch.float32),
                            torch.arange(SIZE, dtype=torch.float32), indexing="ij")
    img = 0.1 * torch.randn(n, 1, SIZE, SIZE, generator=g)
    count = torch.randint(1, 6, (n,), generator=g)
    for i in range(n):
        for _ in range(int(count[i])):
            cy, cx = (torch.rand(2, generator=g) * (SIZE - 6) + 3).tolist()
            width = 1.2 + torch.rand(1, generator=g).item()
            bright = 0.6 + 0.8 * torch.rand(1, generator=g).item()
            img[i, 0] += bright * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * width ** 2))
    return img, count


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x):
        return self.net(x)


class Probe(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(64, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        with torch.no_grad():
            f = self.backbone(x)
        return self.head(f).squeeze(1)


def pretrain(backbone, g):
    """Stand-in for a pretrained checkpoint (not recorded): 5-way blob-count classification."""
    clf = nn.Sequential(backbone, nn.Linear(64, 5))
    opt = torch.optim.Adam(clf.parameters(), lr=2e-3)
    for _ in range(PRETRAIN_STEPS):
        x, c = blobs(g, BATCH)
        loss = F.cross_entropy(clf(x), c - 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, c = blobs(g, 500)
        acc = (clf(x).argmax(1) == c - 1).float().mean().item()
        f = backbone(x)
    mu2 = f.mean(0).pow(2).sum().item()
    lam = torch.linalg.eigvalsh(2 * f.T @ f / f.shape[0]).max().item()
    print(f"pretraining: last loss {loss.item():.3f}, held-out count acc {acc:.3f}; "
          f"features >= 0, |mean|^2 {mu2:.3f}, top Hessian eigenvalue of the probe's MSE "
          f"(weights) {lam:.3f} -> stability limit lr < {2 / lam:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    backbone = Backbone()
    pretrain(backbone, g)
    backbone.requires_grad_(False)
    model = Probe(backbone)
    opt = torch.optim.SGD(model.head.parameters(), lr=LR)
    # intended: decay the LR by 5% per step; the config's "5%" was turned into gamma = 1 + 0.05
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=GAMMA)
    losses, total, lrs = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, c = blobs(g, BATCH)
            loss = F.mse_loss(model(x), c.float())
            opt.zero_grad()
            loss.backward()
            grad_norm = torch.stack([p.grad.double().norm()
                                     for p in model.head.parameters()]).norm().item()
            total.append(grad_norm)
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            rec.step(loss=loss)
            sched.step()
            losses.append(loss.item())
            print(f"step {step} loss {loss.item():.4g} gn {grad_norm:.4g} lr {lrs[-1]:.4g}",
                  flush=True)
            if not math.isfinite(loss.item()):
                print(f"non-finite loss at step {step}: stopping")
                break
    print("grad norm ratio to the previous step:",
          [round(b / a, 2) for a, b in itertools.pairwise(total) if math.isfinite(b)])


if __name__ == "__main__":
    main()
