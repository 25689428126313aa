"""Blob locator: a GELU CNN (conv 16 -> conv 32 /2 -> conv 32 /2 -> 64 -> 3) regresses the
centre (normalised to [-1, 1]) and the amplitude of a Gaussian blob in noisy 12x12 images.
SGD lr 0.05, momentum 0.9, batch 64 of fresh images, MSE, 400 steps, no clipping.

What goes wrong at step 200: one batch comes from a shard whose targets were written in other
units - every target multiplied by 110. Its loss (1450) and gradient kick the weights; for two
steps it looks like a transient (the loss is back to 0.29-0.45 at 203-205), but the kick has
put the network where lr 0.05 with momentum is unstable, and the gradient grows
geometrically into NaN.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Steps 0-199: loss ~0.12-0.13 until ~180, 0.08 at 196-199 (starting to learn); grad norm
  median 0.068 over 150-199 (at most 0.134).
- Step 200 (the bad batch): loss 1450, grad 24.3 (x360). 201: loss 7.6, grad 44. 202-205:
  loss 0.51, 0.29, 0.45, 0.41, grad 4.0, 1.0, 2.0, 4.7 (still 15-70x the baseline). Then it
  grows: grad 6.3, 19.7, 6.6, 17.1 (206-209), 241 (210), 277 (211), 2570 (212), 6.4e5 (213),
  inf (214); loss 0.99, 1.5, 2.5, 2.1, 101, 20, 133, 9.6e4, 2.3e23, NaN from 215 to the end
  (186 nonfinite steps; the loop keeps going).
- The explosion starts at the bad batch, step 200 (sharp), and the gradient never returns to
  its pre-200 range.
- About 7 s alone (15 s with a second run beside it on the 2 cores).
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 200, "tolerance": 2}]}

STEPS, BATCH, SIZE, LR = 400, 64, 12, 0.05
BAD_STEP, BAD_SCALE = 200, 110.0


def blobs(g, n):
    """One Gaussian blob per image; targets: its centre (normalised to [-1, 1]) and its
    amplitude offset."""
    yy, xx = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(),
                            indexing="ij")
    c = 2 + (SIZE - 4) * torch.rand(n, 2, generator=g)
    a = 0.5 + torch.rand(n, 1, generator=g)
    d2 = (xx - c[:, 0, None, None]) ** 2 + (yy - c[:, 1, None, None]) ** 2
    img = a[:, :, None] * torch.exp(-d2 / 4)
    img = img[:, None] + 0.05 * torch.randn(n, 1, SIZE, SIZE, generator=g)
    return img, torch.cat([(c - SIZE / 2) / (SIZE / 2), a - 1], 1)


class BlobLocator(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.GELU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.GELU(), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32 * 9, 64), nn.GELU(), nn.Linear(64, 3))

    def forward(self, x):
        return self.head(self.conv(x))


def growth_facts(rows, base_steps):
    """Print the facts of the growth: rows are (loss, grad_norm) per step; base_steps the
    steps whose median is the baseline."""
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    base = med(gn[base_steps[0]:base_steps[1]])
    bad = [i for i in range(len(gn)) if not (math.isfinite(gn[i]) and math.isfinite(loss[i]))]
    first_bad = bad[0] if bad else None
    end = first_bad if first_bad is not None else len(gn)
    stay3 = next((i for i in range(base_steps[1], end)
                  if all(g > 3 * base for g in gn[i:end])), None)
    print(f"[grad] baseline median {base:.4g} over steps {base_steps[0]}-{base_steps[1] - 1}; "
          f"above 3x the baseline for good from step {stay3}; first nonfinite step {first_bad}"
          f" ({len(bad)} nonfinite steps)")
    for a in range(0, len(rows), 20):
        fl = [v for v in loss[a:a + 20] if math.isfinite(v)]
        fg = [v for v in gn[a:a + 20] if math.isfinite(v)]
        if not fl:
            print(f"[win] {a}-{a + 19}: all nonfinite")
            continue
        print(f"[win] {a}-{a + 19}: loss median {med(fl):.4g} grad median "
              f"{med(fg) if fg else float('nan'):.4g} max {max(fg) if fg else float('nan'):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(4)
    model = BlobLocator()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = blobs(g, BATCH)
            if step == BAD_STEP:
                y = y * BAD_SCALE          # one shard exported in other units
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 20 == 0 or BAD_STEP - 3 <= step <= BAD_STEP + 20:
                print(f"step {step} loss {loss.item():.4g} grad_norm {gn:.4g}", flush=True)
    growth_facts(rows, (150, 200))


if __name__ == "__main__":
    main()
