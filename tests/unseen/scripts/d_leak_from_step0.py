"""Small CNN whose training loop keeps every step's feature map alive: a leak from step 0.

What it does: 10-class synthetic 1×28×28 "digit-like" images (each class is a fixed random
smooth template, shifted by up to 2 pixels, scaled, plus Gaussian noise); batch 32, 300 steps,
Adam(lr=1e-3). Model: conv(1→16, 3×3) → ReLU → maxpool → conv(16→32, 3×3) → ReLU → maxpool
→ linear(32·7·7 → 10).

The bug: the loop collects the first block's pooled feature map "for a t-SNE plot after
training" — ``feature_log.append(feats.detach())``. ``detach()`` shares storage, so every
step keeps its whole 32×16×14×14 float32 activation alive: 401,408 bytes (≈392 KiB) per step,
appended at every step from step 0 (the first iteration) to step 299, never cleared. By the
end ≈115 MiB of activations are held by the list (300 × 392 KiB).

What is TRUE of the run (ground truth):
- Host memory leaks from the very first step: the live heap grows by ≈392 KiB at every step,
  from step 0 to the end, linearly, with no plateau (memory_leak, first step 0). Measured: the
  live heap rises by 392-393 KiB at every step from the first, 126.1 → 240.9 MiB; RSS 401 → 524 MiB.
- The training itself is otherwise healthy: the loss falls from ≈2.3 (ln 10) to near zero on
  this easy task; no divergence, no NaN/Inf.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 0, "tolerance": 2},
    ],
    "forbidden": ["loss_divergence", "nonfinite"],
}

STEPS, BATCH, CLASSES, SIZE = 300, 32, 10, 28


def make_templates(g: torch.Generator) -> torch.Tensor:
    t = torch.randn(CLASSES, 1, 7, 7, generator=g)
    return nn.functional.interpolate(t, size=(SIZE, SIZE), mode="bilinear",
                                     align_corners=False)


def batch(templates: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    x = templates[y]
    dx, dy = torch.randint(-2, 3, (2,), generator=g).tolist()
    x = torch.roll(x, shifts=(dy, dx), dims=(2, 3))
    x = x * (0.8 + 0.4 * torch.rand(BATCH, 1, 1, 1, generator=g))
    x = x + 0.3 * torch.randn(x.shape, generator=g)
    return x, y


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(32 * 7 * 7, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.block1(x)
        return self.fc(self.block2(feats).flatten(1)), feats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    templates = make_templates(g)

    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    feature_log = []  # the leak: grows by one 392 KiB activation every step
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for _ in range(STEPS):
            x, y = batch(templates, g)
            logits, feats = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            feature_log.append(feats.detach())  # "for a t-SNE plot later"
            rec.step(loss=loss)
            losses.append(loss.item())
    held = sum(f.untyped_storage().nbytes() for f in feature_log)
    print(f"loss first {losses[0]:.3f} last-10 mean {sum(losses[-10:]) / 10:.4f}; "
          f"feature_log holds {len(feature_log)} tensors, {held / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
