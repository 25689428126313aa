"""Healthy: house-price-style MLP regression on raw, unnormalised features and targets, with Adam.

What it does: synthetic "house" rows with four raw features in their natural units --
living area 600-4000 sqft, lot 2000-12000 sqft, age 0-120 years, garage 0-800 sqft -- and a
price-like target in the thousands (mean ~2360, std ~835, range ~220-4260):
0.8*sqft + 0.05*lot - 6*age + 0.5*garage - 8e-5*(sqft-2300)^2 + 400, plus N(0, 30^2) noise.
Neither inputs nor target are standardised (a common shortcut). Model: ``mlp`` =
Linear(4,64)-ReLU-Linear(64,64)-ReLU-Linear(64,1), MSE. 300 x 64 rows, DataLoader batch 64
(shuffled, seeded), 300 steps of Adam(lr=0.02) with cosine annealing to 0, no clipping.

What is TRUE of the run (ground truth, measured while writing it): healthy. Because the
inputs are in the thousands and the initial predictions are ~0 against targets ~2400, the
first loss (5.0e6) and the first gradient norms (3.0e7 and 3.9e7 at steps 0-1) are huge in
absolute terms -- an innocent consequence of the units, not an explosion: Adam's updates are
scale-free, so nothing blows up. The gradient norm is largest at the very start and falls,
noisily, with the error: median 2.3e6 in steps 0-29 (steps 2-9: 2.6e6-1.2e7), ~1e6 in
steps 30-119, 2.3e5-3.0e5 in the last 90 steps (~100x below steps 0-1; single batches up to
~1.2e6 late on). The loss falls by ~2.5 orders of magnitude and every 30-step mean is below
the one before: 4.9e5 (steps 0-29; first batch 5.0e6), 4.0e4, 3.2e4, 2.5e4, 1.9e4, 1.6e4,
1.4e4, 1.2e4, 1.15e4, 1.07e4 (steps 270-299); held-out MSE ~9.9e3 against a target variance
of 7.1e5 (R^2 0.986), i.e. it learns the function well (the noise floor is 900). No NaN/Inf,
no divergence, no spike. Nothing above info.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["gradient_explosion", "loss_divergence", "loss_spike", "nonfinite"],
}

BATCH, STEPS = 64, 300


def make_houses(gen: torch.Generator, n: int):
    sqft = 600 + 3400 * torch.rand(n, generator=gen)
    lot = 2000 + 10000 * torch.rand(n, generator=gen)
    age = 120 * torch.rand(n, generator=gen)
    garage = 800 * torch.rand(n, generator=gen)
    x = torch.stack([sqft, lot, age, garage], 1)
    price = (0.8 * sqft + 0.05 * lot - 6 * age + 0.5 * garage
             - 8e-5 * (sqft - 2300) ** 2 + 400)
    return x, price


class PriceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_houses(gen, STEPS * BATCH)
    y = y + 30 * torch.randn(len(y), generator=gen)
    xt, yt = make_houses(gen, 2000)
    torch.manual_seed(0)
    model = PriceModel()
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
    losses, norms = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for xb, yb in rec.wrap_loader(loader):
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(torch.norm(torch.stack(
                [p.grad.norm() for p in model.parameters()])).item())
            opt.step()
            rec.step(loss=loss, lr=sched.get_last_lr()[0])
            sched.step()
            losses.append(loss.item())
    print("grad norms steps 0-9:", " ".join(f"{v:.3g}" for v in norms[:10]))
    print("losses steps 0-9:", " ".join(f"{v:.3g}" for v in losses[:10]))
    for a in range(0, STEPS, 30):
        w = sorted(norms[a:a + 30])
        print(f"steps {a:3d}-{a + 29:3d}: mean loss {sum(losses[a:a + 30]) / 30:.4g}  "
              f"grad norm median {w[15]:.3g} max {w[-1]:.3g}")
    with torch.no_grad():
        mse = nn.functional.mse_loss(model(xt), yt).item()
    print(f"held-out MSE {mse:.4g}, target variance {yt.var().item():.4g}, "
          f"R^2 {1 - mse / yt.var().item():.3f}")


if __name__ == "__main__":
    main()
