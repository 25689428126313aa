"""Eight stacked gated-linear-unit layers under plain SGD at lr 1.2: the run explodes from step 0.

What it does: regression of y = sin(x_0 + x_1 + x_2 + x_3) + 0.5 x_4 from 16 Gaussian
features (19,200 rows, DataLoader batch 64, 300 steps), MSE. Model ``DeepGLU``: ``inp``
(Linear 16->64), eight ``layers.N`` = Linear 64->128 followed by a gated linear unit
(a * sigmoid(b)), no normalisation, no residual connections, and ``out`` (64->1). Plain
SGD (no momentum, no clipping) at lr 1.2: a sweep value 1.2e-2 typed as 1.2, 100x too
high for this net. Standard preset with ``grad_norm_budget=0`` (gradient norms every
step), profiler off.

What is TRUE of the run (measured):
- Step 0 (before any update) is normal: loss 0.770, total gradient norm 0.155.
- Every update from the first makes things worse, geometrically: loss 0.770, 0.860,
  1.085, 1.789, 3.53, 7.96, 12.4, 1,839, 3.1e15 (steps 0-8); gradient norm 0.155, 0.599,
  1.32, 2.24, 3.39, 6.01, 11.8, 1,248, 2.5e16. The gradient norm is 4x its step-0 value at
  step 1 and grows every step after: the divergence starts with the first update.
- Step 9: after step 8's update (gradient norm 2.5e16 x lr 1.2) the forward overflows;
  loss and gradients are NaN at step 9 and at every step after it (291 of 300 steps NaN:
  the weights are nonfinite from then on).
- ~6 s on 2 CPU cores.
- Ground truth: the learning rate is far too high; gradients (and the loss) explode from
  step 0, and the run goes nonfinite at step 9 as a consequence.
"""

import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 0, "tolerance": 1},
        {"id": "nonfinite", "first_step": 9, "tolerance": 1},
    ],
    "forbidden": ["memory_leak", "dataloader_bottleneck", "vanishing_gradient"],
}

FEATURES, WIDTH, DEPTH, BATCH, STEPS, LR = 16, 64, 8, 64, 300, 1.2


class GLULayer(nn.Module):
    """Linear to 2*width, then a * sigmoid(b) (Dauphin et al.'s gated linear unit); no
    normalisation and no residual connection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 2 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.glu(self.proj(x), dim=-1)


class DeepGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, WIDTH)
        self.layers = nn.Sequential(*[GLULayer(WIDTH) for _ in range(DEPTH)])
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(self.inp(x))).squeeze(1)


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH * STEPS, FEATURES, generator=g)
    y = torch.sin(x[:, :4].sum(1)) + 0.5 * x[:, 4]
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    model = DeepGLU()
    opt = torch.optim.SGD(model.parameters(), lr=LR)     # a sweep's "1.2e-2" typed as 1.2
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0, grad_norm_budget=0.0) as rec:
        for x, y in rec.wrap_loader(loader):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), norm.item()))
    for i, (loss, norm) in enumerate(rows[:12]):
        print(f"step {i:3d}: loss {loss:10.4g}  grad norm {norm:10.4g}")
    bad = [i for i, (loss, _) in enumerate(rows) if not math.isfinite(loss)]
    print(f"nonfinite loss at {len(bad)} steps, first {bad[:1]}")


if __name__ == "__main__":
    main()
