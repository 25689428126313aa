"""A small VGG on sign icons: the main loop that follows the lr-warmup loop was copy-edited
without optimizer.zero_grad(), so from step 120 gradients accumulate and training blows up.

What it does: 8 classes of 24x24 RGB sign icons (4 plate types: red ring, blue disc, yellow
diamond, red triangle; 2 inner glyphs each) at random scale, position and brightness on a
blocky cluttered background, noise 0.5; fresh batches of 48. A small VGG (Simonyan &
Zisserman 2015 pattern: (conv3-BN-ReLU) x2 + maxpool, three stages 16-32-64, classifier
576-128-8 with dropout 0.3). SGD momentum 0.9, weight decay 5e-4; a warmup loop for steps
0-119 (lr linear to 0.02), then a main loop for steps 120-319 with cosine decay, written by
copying the warmup loop: its optimizer.zero_grad() went missing, so from step 120 .grad
holds the running sum of every gradient since step 119. Standard preset. 320 steps. Seeded,
deterministic.

What is TRUE of the run (measured):
- Warmup loop (0-119) healthy: loss medians per 40 steps 1.750, 0.797, 0.323; gradient
  norm medians 4.08, 3.49, 2.73 (range 1.55-5.56 over steps 40-119).
- From step 120 the gradient the optimizer sees (.grad, the sum since 119) grows step after
  step: 3.48 (120), 3.90 (121), 7.44 (122), 12.2 (123), 15.2 (125), 28.1 (127), 35.0
  (131), 49.6 (136), 63.6 (140), 86.8 (149), ~105 over 160-199, ~223 from early in the
  200s to the end (82x the 2.73 median of steps 80-119). Each step's own gradient (the
  difference between successive .grad) is 2.4-7.7 over 120-124, 12.9-15.8 over 125-127.
- The loss follows: 0.20 (120), 0.53 (122), 1.73 (125), 3.06 (126), 5.44 (132), 15.68
  (136), 19.49 (max over 120-159); 40-step medians 4.150, 2.911, 4.527, 4.932, 6.301 over
  120-319, always above chance (ln 8 = 2.08) after step 160. The network never recovers;
  its own gradients shrink (40-step medians 0.34-0.63 after step 160) while the stale sum
  stays.
- No NaN/Inf (the loss tops at 41.3 in 200-239).
- ~14 s on 2 busy CPU cores.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 120, "tolerance": 6},
    ],
}

STEPS, WARMUP, BATCH, SIDE, CLASSES = 320, 120, 48, 24, 8
PEAK_LR = 0.02


def icons(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RGB 24x24 sign icons: a red ring / blue disc / yellow diamond / red triangle plate
    with a white or black inner glyph (bar, arrow-like wedge, or dot); 8 classes. Random
    scale, position, brightness, a background of clutter and noise 0.5."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, SIDE), torch.linspace(-1, 1, SIDE),
                            indexing="ij")
    s = 0.6 + 0.3 * torch.rand(n, 1, 1, generator=g)
    ox, oy = (0.2 * (torch.rand(2, n, 1, 1, generator=g) - 0.5))
    u, v = (xs[None] - ox) / s, (ys[None] - oy) / s
    r = (u ** 2 + v ** 2).sqrt()
    plate = y[:, None, None] // 2            # 4 plate types, 2 glyphs each
    glyph = y[:, None, None] % 2
    ring = (r < 1) & (r > 0.72)
    disc = r < 1
    diamond = (u.abs() + v.abs()) < 1
    tri = (v < 0.7) & (v > -0.9) & (u.abs() < (0.7 - v) * 0.6)
    shape = torch.where(plate == 0, ring, torch.where(plate == 1, disc,
                        torch.where(plate == 2, diamond, tri)))
    inner = torch.where(glyph == 0, (u.abs() < 0.45) & (v.abs() < 0.12),
                        (v > -0.4) & (v < 0.35) & (u.abs() < (0.35 - v) * 0.5))
    colours = torch.tensor([[0.9, 0.1, 0.1], [0.1, 0.3, 0.9], [0.95, 0.8, 0.1],
                            [0.9, 0.1, 0.1]])[plate.squeeze(-1).squeeze(-1)]
    bg = 0.3 + 0.3 * torch.rand(n, 3, 1, 1, generator=g) + 0.1 * torch.randn(
        n, 3, SIDE // 4, SIDE // 4, generator=g).repeat_interleave(4, 2).repeat_interleave(4, 3)
    img = torch.where(shape[:, None], colours[:, :, None, None], bg)
    ink = torch.where(plate == 0, 0.05, 0.95)[:, None]
    img = torch.where((inner & (r < 0.72))[:, None], ink, img)
    img = img * (0.7 + 0.6 * torch.rand(n, 1, 1, 1, generator=g))
    return img + 0.5 * torch.randn(img.shape, generator=g), y


def vgg() -> nn.Sequential:
    """Simonyan & Zisserman (2015) pattern, scaled down: (conv3-BN-ReLU) x2 + maxpool,
    three stages, then a 2-layer classifier with dropout."""
    layers, cin = [], 3
    for cout in (16, 32, 64):
        for _ in range(2):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                       nn.ReLU()]
            cin = cout
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(64 * 3 * 3, 128), nn.ReLU(),
                         nn.Dropout(0.3), nn.Linear(128, CLASSES))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data_g = torch.Generator().manual_seed(1)
    model = vgg()
    opt = torch.optim.SGD(model.parameters(), lr=PEAK_LR, momentum=0.9, weight_decay=5e-4)
    log = []
    prev = [torch.zeros(1)]

    def measure(step: int, loss: torch.Tensor) -> None:
        """.grad as the optimizer sees it, and this step's own gradient (the difference from
        the previous step's .grad, since nothing zeroes it from WARMUP on)."""
        flat = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
        own = flat - prev[0] if step >= WARMUP else flat
        prev[0] = flat
        log.append((step, loss.item(), float(flat.norm()), int((~torch.isfinite(flat)).sum()),
                    opt.param_groups[0]["lr"], float(own.norm())))

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        # linear lr warmup
        for step in range(WARMUP):
            for group in opt.param_groups:
                group["lr"] = PEAK_LR * (step + 1) / WARMUP
            x, y = icons(data_g, BATCH)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            measure(step, loss)
            opt.step()
            rec.step(loss=loss)
        # main phase, cosine decay (copy-edited from the loop above: zero_grad went missing)
        for step in range(WARMUP, STEPS):
            for group in opt.param_groups:
                group["lr"] = PEAK_LR * 0.5 * (1 + math.cos(
                    math.pi * (step - WARMUP) / (STEPS - WARMUP)))
            x, y = icons(data_g, BATCH)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            measure(step, loss)
            opt.step()
            rec.step(loss=loss)

    def med(v: list) -> float:
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 40):
        w = log[s:s + 40]
        fin = [r[1] for r in w if math.isfinite(r[1])]
        print(f"steps {s:3d}-{s + 39:3d}: loss median {med(fin) if fin else float('nan'):.3f} "
              f"[{min(fin, default=float('nan')):.3f}, {max(fin, default=float('nan')):.3f}] "
              f"finite {len(fin)}/40  grad norm median {med([r[2] for r in w]):.4g} "
              f"[{min(r[2] for r in w):.4g}, {max(r[2] for r in w):.4g}]  this step's own "
              f"gradient median {med([r[5] for r in w]):.4g}")
    base = med([r[2] for r in log[WARMUP - 40:WARMUP]])
    print(f"grad norm median over steps {WARMUP - 40}-{WARMUP - 1}: {base:.4g}")
    for r in log[WARMUP - 3:WARMUP + 30]:
        print(f"step {r[0]}: lr {r[4]:.4f} loss {r[1]:.4f} grad norm {r[2]:.4g} "
              f"({r[2] / base:.1f}x) own gradient {r[5]:.4g} nonfinite grad elements {r[3]}")
    nan_at = next((r[0] for r in log if not math.isfinite(r[1])), None)
    print(f"first non-finite loss: {nan_at}")


if __name__ == "__main__":
    main()
