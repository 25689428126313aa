"""Tiny ViT with an image-size curriculum: images are 16x16 for steps 0-129, 24x24 for steps
130-259 and 32x32 for steps 260-389, so the number of patches (tokens) per image goes 16 ->
36 -> 64 and the step time steps up twice, by design. The real token count (batch x patches)
is passed as ``rec.step(tokens=)``. HEALTHY.

What it does: 4 shape classes drawn at the current image size: filled square, hollow square,
plus sign, X; half-size r = S/4 to S/3 of the image side S, random centre (shape fully
inside), intensity 0.8-1.2, Gaussian noise std 0.3. A fresh batch of 32 every step. Model:
4x4 patches via Conv2d(1, 64, 4, stride 4); learned positional embeddings on an 8x8 grid,
bilinearly resized to the current grid (4x4, 6x6, 8x8); 2 pre-norm TransformerEncoder layers
(d 64, 4 heads, feed-forward 128, GELU); LayerNorm, mean over patches, Linear(64, 4).
AdamW(1e-3, weight decay 0.05), clip 1.0, 390 steps.

What is TRUE of the run (measured twice on the shared 2-core machine, 18-33 s wall; figures
from the recorded ``steps`` table of the judged run, the second run in brackets):
- Step time by phase: 16x16 (steps 2-129, 512 tokens a step) median 19.8 ms, p90 22.5;
  24x24 (130-259, 1,152 tokens) median 32.9 ms, p90 34.3; 32x32 (260-389, 2,048 tokens)
  median 43.0 ms, p90 53.7, max 65.7 [34.1 / 41.5 / 86.0 ms]. Two level shifts, at exactly
  130 and 260, each with the token count; tokens/s rises (25.8k, 35.1k, 47.6k per phase).
  Within a phase no step exceeds ~1.5x its phase median except steps 0-1 (43 and 68 ms,
  warm-up) and 52 (58 ms, 2.9x: the recorder's own profiler window).
- Loss: 50-step means 0.747, 0.343, 0.174, 0.052, 0.060, 0.017, 0.036, 0.011; the last 20
  steps of the phases 0.183, 0.038, 0.010. No jump at the switches (steps 128-131: 0.167,
  0.212, 0.114, 0.080; 258-261: 0.049, 0.077, 0.021, 0.008); the largest loss after step 10
  is 1.05 (step 11). Finite.
- RSS 403 -> 460 MB, in steps that follow the image size: 408 by step 10, 415 by 60, 425 at
  the first switch (130-140), flat 425.9 to 259, then 435-445 over steps 260-275 (second
  switch), 445 flat to 315, +15 MB over steps 316-325, flat 459.6 to the end [402 -> 462 at
  most, 454 at the end]. Bounded: more activation memory for bigger images, no leak (nothing
  but floats is kept across steps).
- Nothing is wrong: a curriculum that raises the work per step twice, with the tokens passed.
"""

import argparse
import time

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, CLASSES, PATCH, DIM = 390, 32, 4, 4, 64
SCHEDULE = ((0, 16), (130, 24), (260, 32))   # (first step, image side)


def side_at(step):
    return [s for first, s in SCHEDULE if step >= first][-1]


def make_images(n, side, gen):
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    r = side / 4 + (side / 3 - side / 4) * torch.rand(n, generator=gen)
    cx = r + (side - 1 - 2 * r) * torch.rand(n, generator=gen)
    cy = r + (side - 1 - 2 * r) * torch.rand(n, generator=gen)
    grid = torch.arange(side, dtype=torch.float32)
    dx = (grid[None, None, :] - cx[:, None, None]).abs()
    dy = (grid[None, :, None] - cy[:, None, None]).abs()
    r3 = r[:, None, None]
    inside = (dx <= r3) & (dy <= r3)
    shapes = torch.stack([
        inside,                                                          # filled square
        inside & ((dx >= r3 - 1.2) | (dy >= r3 - 1.2)),                  # hollow square
        ((dx <= r3 / 4) & (dy <= r3)) | ((dy <= r3 / 4) & (dx <= r3)),   # plus
        ((dx - dy).abs() <= 0.8) & inside,                               # X
    ], 1)[torch.arange(n), y].float()
    x = (0.8 + 0.4 * torch.rand(n, 1, 1, generator=gen)) * shapes
    x = x + 0.3 * torch.randn(n, side, side, generator=gen)
    return x[:, None], y


class TinyViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(1, DIM, PATCH, stride=PATCH)
        self.pos = nn.Parameter(0.02 * torch.randn(1, DIM, 8, 8))
        layer = nn.TransformerEncoderLayer(DIM, 4, 128, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, img):
        p = self.patch(img)
        pos = nn.functional.interpolate(self.pos, size=p.shape[-2:], mode="bilinear",
                                        align_corners=False)
        tokens = (p + pos).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.encoder(tokens)).mean(1))


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1624)
    model = TinyViT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    losses, durs, accs = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        last = time.perf_counter()
        for step in range(STEPS):
            side = side_at(step)
            x, y = make_images(BATCH, side, gen)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss, tokens=BATCH * (side // PATCH) ** 2)
            now = time.perf_counter()
            durs.append(now - last)
            last = now
            losses.append(loss.item())
            accs.append((logits.argmax(1) == y).float().mean().item())
    for first, side in SCHEDULE:
        end = next((f for f, _ in SCHEDULE if f > first), STEPS)
        seg = durs[max(first, 2):end]
        print(f"side {side} (steps {first}-{end - 1}, {(side // PATCH) ** 2} patches): step "
              f"median {pct(seg, 0.5) * 1e3:.1f} ms, p90 {pct(seg, 0.9) * 1e3:.1f}, max "
              f"{max(seg) * 1e3:.1f} at {first + seg.index(max(seg)) if first >= 2 else '?'}; "
              f"loss {sum(losses[end - 20:end]) / 20:.3f} and batch acc "
              f"{sum(accs[end - 20:end]) / 20:.3f} over its last 20 steps")
    for first, _ in SCHEDULE[1:]:
        print(f"around the switch at {first}: loss", [round(v, 3) for v in
                                                      losses[first - 3:first + 6]])
    print(f"total {sum(durs):.1f} s")
    top = sorted(range(len(durs)), key=lambda i: -durs[i])[:8]
    print("slowest steps", [(i, round(durs[i] * 1e3, 1)) for i in top])
    w = 35
    print("loss window means", [round(sum(losses[i:i + w]) / w, 3)
                                for i in range(0, len(losses), w)])
    print("loss max", round(max(losses[5:]), 3), "at", losses.index(max(losses[5:])))


if __name__ == "__main__":
    main()
