"""A small CNN trained with Adam whose loss is silently doubled from step 100 on.

What it does: 4-class synthetic 16×16 images (a bar at one of four orientations, random
position and contrast, heavy Gaussian noise), 2048 images, DataLoader batch 32 (shuffled,
re-iterated over epochs), LeNet-style CNN (conv-relu-pool ×2, linear), Adam(lr=1e-3), 250
steps. From step 100 on, the refactored loss code path adds the cross-entropy term twice,
so the optimised and recorded loss is exactly 2 × cross-entropy.

What is TRUE of the run (ground truth):
- Adam is invariant to a constant scale of the loss: m/√v is unchanged by ×2 once its
  moments have adapted. Right after step 100 the first moment adapts within ~10 steps while
  the (bias-corrected) second moment lags, so the update norm is ~1.3× larger over steps
  100-124 (measured against the same run without the bug), ~1.1× over 125-174 and ~1.06×
  by the end — a mild, transient lr bump, well inside the stable range for this model.
  Training stays healthy: the cross-entropy keeps falling smoothly across step 100
  (1.19 → 1.10 → 1.03 → … → 0.85 per 25 steps), with no instability, NaN/Inf or plateau.
- The only visible trace is a level shift: the recorded loss and the gradient norm double at
  step 100 and stay doubled (it is not a spike: they never come back down). That is not a
  training pathology (a change of loss weighting mid-run, e.g. enabling an auxiliary term,
  looks the same), so an expert would at most note it as info.
- So: healthy (nothing above info); in particular no loss spike, no divergence, no gradient
  explosion.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_spike", "loss_divergence", "gradient_explosion", "nonfinite",
                  "loss_plateau", "update_ratio"],
}

N, SIZE, STEPS, BUG_STEP = 2048, 16, 250, 100


def make_data() -> TensorDataset:
    """Bars at 4 orientations (0, 45, 90, 135 degrees) in noise."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (N,), generator=g)
    r = torch.arange(SIZE, dtype=torch.float32)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    x = torch.randn(N, 1, SIZE, SIZE, generator=g) * 0.8
    centers = torch.randint(4, SIZE - 4, (N, 2), generator=g).float()
    contrast = 0.6 + 0.8 * torch.rand(N, generator=g)
    dirs = torch.tensor([[1.0, 0.0], [0.7071, 0.7071], [0.0, 1.0], [-0.7071, 0.7071]])
    for i in range(N):
        dy, dx = yy - centers[i, 0], xx - centers[i, 1]
        ny, nx = -dirs[y[i], 1], dirs[y[i], 0]          # normal to the bar
        dist = (dy * ny + dx * nx).abs()
        along = (dy * dirs[y[i], 0] + dx * dirs[y[i], 1]).abs()
        x[i, 0] += contrast[i] * ((dist < 1.0) & (along < 5)).float()
    return TensorDataset(x, y)


def loss_terms(out: torch.Tensor, y: torch.Tensor, step: int) -> list[torch.Tensor]:
    terms = [nn.functional.cross_entropy(out, y)]
    if step >= BUG_STEP:     # the refactored path, switched on mid-run, appends it again
        terms.append(nn.functional.cross_entropy(out, y))
    return terms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    loader = DataLoader(make_data(), batch_size=32, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(1))
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ce_log, step = [], 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        while step < STEPS:
            for x, y in rec.wrap_loader(loader):
                out = model(x)
                loss = sum(loss_terms(out, y, step))
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
                ce_log.append(nn.functional.cross_entropy(out.detach(), y).item())
                step += 1
                if step >= STEPS:
                    break
    for a in range(0, STEPS, 25):
        print(f"steps {a:3d}-{a + 24:3d}: mean cross-entropy {sum(ce_log[a:a + 25]) / 25:.3f}")


if __name__ == "__main__":
    main()
