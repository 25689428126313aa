"""An MLP whose hidden ReLU layers start with bias -10: every hidden unit is dead from step 0.

What it does: a 4-class problem in 32 dimensions (balanced, well separated Gaussian class
clusters, standardized features), 6400 rows, DataLoader batch 32, 200 steps, Adam(lr=1e-3),
cross-entropy. Model ``net``: Linear(32,128)-ReLU-Linear(128,128)-ReLU-Linear(128,64)-ReLU-
Linear(64,4). The init code sets the bias of every hidden Linear (``net.0``, ``net.2``,
``net.4``) to BIAS_INIT = -10.0 (a config typo for -0.1). Recorded with the ``debug``
preset (activation statistics every 25 steps).

What is TRUE of the run (ground truth):
- From step 0, every hidden pre-activation is about -10 ± 3 (weights are small), so every
  unit of the three ReLUs (``net.1``, ``net.3``, ``net.5``) outputs exactly 0 on every input:
  100% dead activations. This is the root cause.
- Consequently the weights and biases of ``net.0``, ``net.2``, ``net.4`` and the weight of
  the output layer ``net.6`` get exactly zero gradient at every step (they are in the
  optimizer and have ``.grad`` tensors, all zeros); Adam never moves them, so the units can
  never come back to life. Only ``net.6.bias`` learns.
- The network's output is a constant (the output bias), so the loss sits at the class-prior
  entropy ln 4 ≈ 1.386 from step 0 to the end: a loss plateau from step 0, as a
  consequence. (The same model with default biases reaches a loss of ~0.001 in 200 steps.)
- No NaN/Inf, no explosion, no spike, nothing wrong with data loading or memory.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "dead_activation", "first_step": 0, "tolerance": 1, "top": True},
        {"id": "loss_plateau", "first_step": 0, "tolerance": 10},
    ],
    "forbidden": ["gradient_explosion", "nonfinite", "loss_spike", "loss_divergence",
                  "dataloader_bottleneck", "memory_leak"],
}

DIM, CLASSES, BATCH, STEPS, BIAS_INIT = 32, 4, 32, 200, -10.0


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = BATCH * STEPS
    centers = torch.randn(CLASSES, DIM, generator=g)
    y = torch.arange(n) % CLASSES
    x = centers[y] + 0.8 * torch.randn(n, DIM, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    return TensorDataset(x, y)


class Classifier(nn.Module):
    def __init__(self, bias_init: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
            nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        for layer in list(self.net)[:-1]:
            if isinstance(layer, nn.Linear):
                nn.init.constant_(layer.bias, bias_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    model = Classifier(BIAS_INIT)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug",
                  profile_start=0) as rec:
        for x, y in rec.wrap_loader(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    for a in range(0, STEPS, 25):
        print(f"steps {a:3d}-{a + 24:3d}: mean loss {sum(losses[a:a + 25]) / 25:.4f}")


if __name__ == "__main__":
    main()
