"""Tiny ViT with a 4-head classifier ensemble on noisy synthetic gratings, batch 16, Adam with
cosine lr; from step 250 the per-head losses are summed instead of averaged (x4).

What it does: every step draws 16 fresh 1x16x16 images of sinusoidal gratings (10 classes =
5 orientations x 2 spatial frequencies, with orientation/frequency jitter, random phase and
contrast, pixel noise sd 0.8). Model: 4x4 patch embedding (width 48), CLS token, 2 pre-norm
transformer layers (4 heads, GELU), LayerNorm, and 4 linear classifier heads on the CLS
token (an ensemble). Adam, lr 1e-3 cosine-annealed to 2e-5 over 600 steps. The loss is the
cross-entropy of each head, reduced over the heads with .mean() for steps 0-249 and, after a
refactor that lands at step 250, with .sum(): exactly 4x the same quantity. The mean
per-head cross-entropy is recorded as the metric "ce".

What is TRUE of the run (measured, and against the same run without the change):
- Learning is healthy and noisy (fresh batches of 16): cross-entropy median 2.32 (steps
  0-24) -> 1.52 (75-99) -> 1.12 (150-249), per-step sd ~0.2.
- From step 250 the recorded loss is exactly 4 x the mean cross-entropy: median 1.12 over
  150-249 -> 4.48 (250-259), ~3.8-4.0 (275-349), 3.27 (350-449), 3.29 (450-599). The grad
  norm scales with it: median 4.5 (150-249) -> 27 (250-259), ~18.5 for the rest of the run
  (4.7-5.0 in the unscaled run).
- Adam normalises the scale away: the cross-entropy is the same as in the unscaled run
  (medians 1.07 vs 0.99 over 260-274, 0.95 vs 0.92 over 275-299, 0.82 vs 0.84 over 350-449,
  0.82 vs 0.82 over 450-599; accuracy ~0.70 in both at the end). No instability, no NaN/Inf.
- So: a rescaled objective that training absorbs: healthy (nothing above info). After step
  250 the loss just sits at 4x its previous level (and keeps falling slowly as the lr
  decays): not a divergence.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "forbidden": ["loss_divergence"]}

CLASSES, SIZE, PATCH, D, HEADS = 10, 16, 4, 48, 4
BATCH, STEPS, SWITCH, PEAK_LR = 16, 600, 250, 1e-3


def grating_batch(g, n):
    """Class c is a sinusoidal grating with its own orientation and spatial frequency
    (5 orientations x 2 frequencies); random phase and contrast, strong pixel noise."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    theta = (y % 5).float() * math.pi / 5 + 0.15 * torch.randn(n, generator=g)
    freq = torch.where(y < 5, 0.35, 0.7) * (1 + 0.1 * torch.randn(n, generator=g))
    phase = 2 * math.pi * torch.rand(n, generator=g)
    r = torch.arange(SIZE, dtype=torch.float32) - SIZE / 2
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    u = xx[None] * theta.cos()[:, None, None] + yy[None] * theta.sin()[:, None, None]
    img = torch.sin(freq[:, None, None] * u + phase[:, None, None])
    img = img * (0.6 + 0.6 * torch.rand(n, 1, 1, generator=g))
    img = img + 0.8 * torch.randn(img.shape, generator=g)
    return img[:, None], y


class TinyViT(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        n_patches = (SIZE // PATCH) ** 2
        self.embed = nn.Conv2d(1, D, PATCH, PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, D))
        self.pos = nn.Parameter(0.02 * torch.randn(1, n_patches + 1, D))
        layer = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.heads = nn.ModuleList(nn.Linear(D, CLASSES) for _ in range(HEADS))

    def forward(self, x):
        p = self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(x), -1, -1), p], 1) + self.pos
        z = self.norm(self.encoder(h)[:, 0])
        return torch.stack([hd(z) for hd in self.heads], 1)       # (B, HEADS, CLASSES)


def ensemble_loss(logits, y, step):
    per_head = torch.stack([F.cross_entropy(logits[:, k], y) for k in range(HEADS)])
    # The loss helper was "simplified" in a refactor that landed mid-run (hot reload at
    # step SWITCH): .mean() over the ensemble heads became .sum(), i.e. exactly x HEADS.
    return per_head.mean() if step < SWITCH else per_head.sum(), per_head.detach().mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = TinyViT()
    opt = torch.optim.Adam(model.parameters(), lr=PEAK_LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=PEAK_LR * 0.02)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = grating_batch(g, BATCH)
            logits = model(x)
            loss, mean_ce = ensemble_loss(logits, y, step)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            acc = (logits.mean(1).argmax(1) == y).float().mean()
            rec.step(loss=loss, ce=mean_ce, acc=acc)
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.3f} ce {mean_ce.item():.3f} "
                      f"acc {acc.item():.2f}", flush=True)


if __name__ == "__main__":
    main()
