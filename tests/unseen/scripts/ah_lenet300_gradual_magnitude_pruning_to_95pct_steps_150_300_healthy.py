"""LeNet-300-100 with gradual magnitude pruning (Zhu & Gupta 2017) to 95% sparsity at steps 150-300.

What it does: 10-class 16x16 glyph images (three thick random strokes per class, shifted by
up to 2 px, random contrast, Gaussian noise 0.55), generated per batch, flattened. The model
is LeNet-300-100 (256-300-100-10, ReLU). SGD lr 0.05, momentum 0.9, weight decay 1e-4,
batch 128, 400 steps. Pruning follows Zhu & Gupta's cubic schedule s_t = 0.95 (1 - (1 - (t -
100) / 200)^3), applied every 50 steps: at steps 150, 200, 250 and 300 the smallest-magnitude
weights of fc1 and fc2 are masked to reach 54.9%, 83.1%, 93.5% and 95.0% sparsity (the
classifier fc3 stays dense). Masked weights are kept at zero after each update and their
gradients are masked by tensor hooks. Debug preset (tensor, update and activation statistics
every 25 steps). Seeded, deterministic.

What is TRUE of the run (measured):
- Loss 50-step medians: 1.596, 0.631, 0.395, 0.296, 0.284, 0.365, 0.313, 0.266 (steps 0-49
  ... 350-399). Each pruning event bumps the loss and it recovers within ~15-40 steps:
  at 150 10-step median before 0.352 -> 0.373 at the step; at 200 0.271 -> 0.454; at 250
  0.243 -> 0.530, 0.474, 0.489 (median of steps 255-264 still 0.433), which makes the 250-299
  window's median (0.365) higher than the one before; at 300 0.326 -> 0.352.
- Held-out accuracy (2,000 samples) keeps the dense level: 0.833 at step 99, 0.873 at 149,
  0.916 at 249, 0.835 right after the 250 cut, 0.911 at the end (95% of fc1/fc2 zero).
- 95% of fc1.weight and fc2.weight and of their gradients are exactly zero from step 300
  (54.9% from 150, 83.1% from 200, 93.5% from 250). Units stay alive: fc1 units that never
  fire on the validation set are 0 until step 249, 3.3% after the 250 cut, 4.3% at the end
  (the recorded activations are the Linear outputs, the ReLU being functional; no zeros).
- Gradient norm 50-step medians 0.99, 1.26, 1.25, 0.86, 0.65, 0.59, 0.58, 0.53; max 2.07;
  it drops gently as the loss falls and the layers thin. No NaN/Inf. Steps ~5 ms (max
  60 ms); ~7 s in all on 2 CPU cores.
- Healthy: the loss bumps at the pruning steps and the mostly-zero weights and gradients
  are the pruning working as designed; the network keeps its accuracy.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_spike", "loss_divergence", "dead_activation", "vanishing_gradient",
                  "gradient_explosion", "update_ratio", "loss_plateau"],
}

STEPS, BATCH, SIDE, CLASSES = 400, 128, 16, 10
PRUNE_START, PRUNE_END, PRUNE_EVERY, FINAL_SPARSITY = 100, 300, 50, 0.95


def make_templates(g: torch.Generator) -> torch.Tensor:
    """Ten 16x16 glyphs, each three thick strokes between random points (shared grid, so
    classes overlap)."""
    ys, xs = torch.meshgrid(torch.arange(SIDE).float(), torch.arange(SIDE).float(),
                            indexing="ij")
    out = torch.zeros(CLASSES, SIDE, SIDE)
    for c in range(CLASSES):
        for _ in range(3):
            p, q = torch.rand(2, 2, generator=g) * (SIDE - 5) + 2
            d = q - p
            t = (((xs - p[0]) * d[0] + (ys - p[1]) * d[1]) / d.pow(2).sum()).clamp(0, 1)
            dist = ((xs - p[0] - t * d[0]) ** 2 + (ys - p[1] - t * d[1]) ** 2).sqrt()
            out[c] = torch.maximum(out[c], (1.6 - dist).clamp(0, 1))
    return out


def batch(templates: torch.Tensor, g: torch.Generator, n: int) -> tuple[torch.Tensor, ...]:
    """Shifted by up to 2 px, random contrast, Gaussian pixel noise; flattened, standardised."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    img = templates[y]
    sx, sy = torch.randint(-2, 3, (2, n), generator=g)
    img = torch.stack([torch.roll(im, (int(a), int(b)), (0, 1))
                       for im, a, b in zip(img, sy, sx, strict=True)])
    img = img * (0.6 + 0.8 * torch.rand(n, 1, 1, generator=g))
    img = img + 0.55 * torch.randn(n, SIDE, SIDE, generator=g)
    return ((img - 0.2) / 0.6).flatten(1), y


class LeNet300100(nn.Module):
    """LeNet-300-100 (LeCun et al. 1998), the fully connected net of the pruning papers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(SIDE * SIDE, 300)
        self.fc2 = nn.Linear(300, 100)
        self.fc3 = nn.Linear(100, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class GradualMagnitudePruner:
    """Zhu & Gupta (2017): sparsity s_t = s_f * (1 - (1 - (t - t0) / (t1 - t0))^3), applied
    every ``every`` steps from t0 to t1 by global-per-layer magnitude masks on the weights of
    fc1 and fc2 (fc3, the classifier, is left dense, as in the paper). Masked weights are kept
    at zero after each update and their gradients are masked."""

    def __init__(self, model: LeNet300100) -> None:
        self.layers = [model.fc1, model.fc2]
        self.masks = [torch.ones_like(m.weight) for m in self.layers]
        for i, layer in enumerate(self.layers):
            layer.weight.register_hook(lambda g, i=i: g * self.masks[i])

    def target(self, step: int) -> float:
        if step < PRUNE_START:
            return 0.0
        frac = min(1.0, (step - PRUNE_START) / (PRUNE_END - PRUNE_START))
        return FINAL_SPARSITY * (1 - (1 - frac) ** 3)

    @torch.no_grad()
    def maybe_prune(self, step: int) -> float | None:
        if step <= PRUNE_START or step > PRUNE_END or (step - PRUNE_START) % PRUNE_EVERY:
            return None
        s = self.target(step)
        for i, layer in enumerate(self.layers):
            w = layer.weight.abs().flatten()
            k = int(s * w.numel())
            if k:
                thresh = w.kthvalue(k).values
                self.masks[i] = (layer.weight.abs() > thresh).float()
            layer.weight.mul_(self.masks[i])
        return s

    @torch.no_grad()
    def apply(self) -> None:
        for layer, mask in zip(self.layers, self.masks, strict=True):
            layer.weight.mul_(mask)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    templates = make_templates(torch.Generator().manual_seed(3))
    data_g = torch.Generator().manual_seed(1)
    val_x, val_y = batch(templates, torch.Generator().manual_seed(7), 2000)

    model = LeNet300100()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    pruner = GradualMagnitudePruner(model)
    losses, norms = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug") as rec:
        for step in range(STEPS):
            s = pruner.maybe_prune(step)
            x, y = batch(templates, data_g, BATCH)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            norms.append(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item())
            opt.step()
            pruner.apply()
            rec.step(loss=loss, sparsity=pruner.target(step))
            losses.append(loss.item())
            if s is not None or step % 50 == 49:
                with torch.no_grad():
                    acc = (model(val_x).argmax(1) == val_y).float().mean().item()
                    h1 = torch.relu(model.fc1(val_x))
                    dead = (h1.amax(0) == 0).float().mean().item()
                zero = (model.fc1.weight == 0).float().mean().item()
                print(f"step {step}: {'pruned to ' + format(s, '.3f') if s is not None else ''}"
                      f" fc1 zero frac {zero:.3f} fc1 units never active on val {dead:.3f}"
                      f" val acc {acc:.3f} loss {loss.item():.3f} "
                      f"grad norm {norms[-1]:.3f}")
    for e in range(PRUNE_START + PRUNE_EVERY, PRUNE_END + 1, PRUNE_EVERY):
        before = sorted(losses[e - 10:e])[5]
        after = sorted(losses[e + 5:e + 15])[5]
        print(f"prune at {e}: loss median 10 before {before:.3f}, at {losses[e]:.3f}, "
              f"{losses[e + 1]:.3f}, {losses[e + 2]:.3f}; median steps +5..+14 {after:.3f}; "
              f"grad norm before {sorted(norms[e - 10:e])[5]:.3f} at {norms[e]:.3f}")
    for s in range(0, STEPS, 50):
        w, n = sorted(losses[s:s + 50]), sorted(norms[s:s + 50])
        print(f"steps {s:3d}-{s + 49:3d}: loss median {w[25]:.3f} [{w[0]:.3f}, {w[-1]:.3f}]  "
              f"grad norm median {n[25]:.3f} max {n[-1]:.3f}")


if __name__ == "__main__":
    main()
