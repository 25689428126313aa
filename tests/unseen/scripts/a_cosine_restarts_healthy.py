"""A small ResNet trained with SGD + cosine annealing with warm restarts (SGDR): healthy.

What it does: 6-class synthetic 3×16×16 images — a sinusoidal grating whose (spatial
frequency, orientation) pair is the class (2 frequencies × 3 orientations), random phase,
random colour tint and strong Gaussian noise; 3072 images, DataLoader batch 64 (shuffled,
re-iterated over epochs). Model: a ResNet-like CNN (3×3 stem, two residual basic blocks at
16 channels, one strided block to 32 channels, BatchNorm, global average pool, linear).
SGD(lr=0.1, momentum=0.9, weight_decay=5e-4) with
``CosineAnnealingWarmRestarts(T_0=50, eta_min=1e-3)`` stepped every iteration, 300 steps: the
learning rate jumps back to 0.1 at steps 50, 100, 150, 200 and 250.

What is TRUE of the run (ground truth):
- Training is healthy. The loss falls from ~1.83 (ln 6 ≈ 1.79) to ~0.3 over the run (10-step
  means: 1.59 at step 40, 0.83 at 90, 0.61 at 140, 0.42 at 190, 0.35 at 240, 0.31 at 290).
  After each restart (steps 100, 150, 200, 250) the loss rises for 10-20 steps (10-step
  means up by ~0.03-0.1, single batches up to ~1.3) and the gradient norm by up to ~2× —
  the large learning rate knocks the model out of the minimum it annealed into — and then
  falls further than before: the normal, intended behaviour of SGDR, not an instability.
- No divergence, no loss spike that is a problem, no gradient explosion, no NaN/Inf, no dead
  or saturated units, nothing wrong with data loading or memory: nothing above info.
"""

import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_spike", "loss_divergence", "gradient_explosion", "loss_plateau",
                  "nonfinite"],
}

N, SIZE, STEPS, T0 = 3072, 16, 300, 50


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 6, (N,), generator=g)
    freq = torch.tensor([2.0, 4.0])[y // 3] * 2 * math.pi / SIZE
    theta = (y % 3).float() * math.pi / 3
    phase = torch.rand(N, generator=g) * 2 * math.pi
    r = torch.arange(SIZE, dtype=torch.float32)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    proj = xx * theta.cos()[:, None, None] + yy * theta.sin()[:, None, None]
    wave = torch.sin(freq[:, None, None] * proj + phase[:, None, None])
    tint = 0.3 + 0.7 * torch.rand(N, 3, generator=g)
    x = tint[:, :, None, None] * wave[:, None] * 0.5
    x = x + torch.randn(N, 3, SIZE, SIZE, generator=g) * 1.6
    return TensorDataset(x, y)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 6) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.layer1 = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 16))
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(x.mean((2, 3)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    loader = DataLoader(make_data(), batch_size=64, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(1))
    model = SmallResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=T0, eta_min=1e-3)
    losses, step = [], 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        while step < STEPS:
            for x, y in rec.wrap_loader(loader):
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
                sched.step()
                losses.append(loss.item())
                step += 1
                if step >= STEPS:
                    break
    for a in range(0, STEPS, 10):
        print(f"steps {a:3d}-{a + 9:3d}: mean loss {sum(losses[a:a + 10]) / 10:.3f}")


if __name__ == "__main__":
    main()
