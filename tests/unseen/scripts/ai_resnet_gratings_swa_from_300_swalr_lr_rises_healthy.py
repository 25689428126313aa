"""A small ResNet on noisy grating textures, stochastic weight averaging from step 300.

What it does: 8-class 16x16 grating textures (4 orientations x 2 spatial frequencies, random
phase and contrast, +-17 deg orientation jitter, a random disc occluder, Gaussian noise 1.6:
single images are genuinely ambiguous), fresh batches of 64. A small ResNet (He et al. 2016:
stem + three basic blocks 16-32-48, BatchNorm, global average pool). SGD lr 0.1, Nesterov
momentum 0.9, weight decay 5e-4, cosine decay from 0.1 to 0.005 over steps 0-299. Then the
standard stochastic weight averaging recipe (Izmailov et al. 2018, torch.optim.swa_utils):
from step 300 SWALR anneals the lr (cosine, 30 steps) UP from 0.005 to the constant SWA lr
0.05, and an AveragedModel is updated in place after every step 300-449. After the recorded
run, update_bn recomputes BatchNorm statistics for the averaged weights and both models are
scored on 1,000 held-out images. Standard preset. 450 steps. Seeded, deterministic.

What is TRUE of the run (measured):
- Healthy. Loss medians per 50 steps: 1.644, 0.947, 0.819, 0.735, 0.727, 0.705 (steps 0-299,
  the cosine phase), then 0.760, 0.772 (300-399, while the lr is raised tenfold to 0.05 for
  SWA) and 0.711 (400-449). Per-step losses span 0.44-1.23 after step 100 (batch noise of a
  noisy task); max 2.20 at the very start.
- The lr rise at 300 makes the training model's own loss go UP by ~0.06 (about 8 %) and its
  held-out loss from 0.699 (step 299) to 0.765 (step 449): that is what SWA does, not a
  fault. The averaged model is the better one: held-out loss 0.670 / accuracy 0.783 against
  0.765 / 0.748 for the final SGD weights (0.699 / 0.759 at step 299).
- Gradient norm (total, before the step) steady throughout: 50-step medians 1.18, 1.09,
  1.00, 0.93, 0.86, 0.87, 0.94, 0.94, 0.89; overall range 0.64-1.66. No NaN/Inf.
- ~16 s on 2 busy CPU cores.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "forbidden": ["loss_divergence", "loss_spike", "loss_plateau", "gradient_explosion"],
}

STEPS, BATCH, SIDE, CLASSES = 450, 64, 16, 8
SWA_START, SWA_LR, ANNEAL = 300, 0.05, 30
LR0, LR_END = 0.1, 0.005


def gratings(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class = (orientation, spatial frequency) of a sinusoidal grating: 4 orientations x 2
    frequencies. Random phase, random contrast in [0.3, 1], orientation jitter of +-17 deg,
    a random blob occluder and Gaussian noise 1.6: single images are genuinely ambiguous."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    theta = (y % 4).float() * math.pi / 4 + (torch.rand(n, generator=g) - 0.5) * 0.6
    freq = torch.where(y < 4, 0.55, 1.05) * (1 + 0.12 * (torch.rand(n, generator=g) - 0.5))
    phase = torch.rand(n, generator=g) * 2 * math.pi
    contrast = 0.3 + 0.7 * torch.rand(n, generator=g)
    ys, xs = torch.meshgrid(torch.arange(SIDE).float(), torch.arange(SIDE).float(),
                            indexing="ij")
    u = xs[None] * torch.cos(theta)[:, None, None] + ys[None] * torch.sin(theta)[:, None, None]
    img = contrast[:, None, None] * torch.sin(freq[:, None, None] * u + phase[:, None, None])
    cx, cy = (torch.rand(2, n, generator=g) * SIDE)
    occ = ((xs[None] - cx[:, None, None]) ** 2 + (ys[None] - cy[:, None, None]) ** 2) < 12
    img = torch.where(occ, 0.0, img) + 1.6 * torch.randn(n, SIDE, SIDE, generator=g)
    return img[:, None], y


class Block(nn.Module):
    """He et al. (2016) basic block: two 3x3 conv-BN, ReLU, identity/1x1 projection skip."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.layer1 = Block(16, 16, 1)
        self.layer2 = Block(16, 32, 2)
        self.layer3 = Block(32, 48, 2)
        self.fc = nn.Linear(48, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(h.mean((2, 3)))


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        out = model(x)
    model.train()
    return F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data_g = torch.Generator().manual_seed(1)
    val_x, val_y = gratings(torch.Generator().manual_seed(99), 1000)

    model = ResNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR0, momentum=0.9, weight_decay=5e-4,
                          nesterov=True)
    # Izmailov et al. (2018) recipe: decay to a small lr before SWA starts, then SWALR anneals
    # the lr (cosine, 30 steps) up to the constant SWA lr, and the running average of the
    # weights is updated in place after every step from SWA_START.
    decay = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (LR_END / LR0) + (1 - LR_END / LR0) * 0.5 * (
            1 + math.cos(math.pi * min(s, SWA_START) / SWA_START)))
    swa_model = AveragedModel(model)
    swa_sched = SWALR(opt, swa_lr=SWA_LR, anneal_epochs=ANNEAL, anneal_strategy="cos")
    log = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = gratings(data_g, BATCH)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            raw = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                for p in model.parameters()))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            rec.step(loss=loss)
            if step >= SWA_START:
                swa_model.update_parameters(model)
                swa_sched.step()
            else:
                decay.step()
            log.append((step, loss.item(), raw, lr))
            if step % 50 == 49:
                vl, va = evaluate(model, val_x, val_y)
                print(f"step {step}: lr {lr:.4f} val loss {vl:.3f} acc {va:.3f}")
    # after the recorded run: recompute BN statistics for the averaged weights and compare
    update_bn(((gratings(data_g, BATCH)[0],) for _ in range(30)), swa_model)
    print("final SGD model val loss/acc", evaluate(model, val_x, val_y))
    print("SWA model val loss/acc", evaluate(swa_model, val_x, val_y))
    for s in range(0, STEPS, 50):
        w = log[s:s + 50]

        def med(j: int, w: list = w) -> float:
            return sorted(r[j] for r in w)[len(w) // 2]

        print(f"steps {s:3d}-{s + 49:3d}: lr {w[0][3]:.4f}->{w[-1][3]:.4f} loss median "
              f"{med(1):.3f} [{min(r[1] for r in w):.3f}, {max(r[1] for r in w):.3f}]  "
              f"grad norm median {med(2):.3f} [{min(r[2] for r in w):.3f}, "
              f"{max(r[2] for r in w):.3f}]")


if __name__ == "__main__":
    main()
