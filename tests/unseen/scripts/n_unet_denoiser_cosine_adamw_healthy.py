"""Small U-Net denoiser (GroupNorm + SiLU, skip concatenations), AdamW with cosine decay. HEALTHY.

What it does: 24x24 single-channel images made of soft Gaussian blobs and rectangles
(a pool of 2,048, random horizontal flips), Gaussian noise sigma = 0.35 added on the fly; the
U-Net (16-32-64 channels, two 2x down/up levels with skip concatenation, GroupNorm(8) + SiLU)
predicts the noise and returns x - noise; MSE to the clean image. 400 steps of batch 16,
AdamW(lr 2e-3, weight decay 1e-2), CosineAnnealingLR over the 400 steps to 4e-5 (stepped after
rec.step, so the recorded lr is the one each step used). No dropout, no clipping.

What is TRUE of the run (measured):
- Loss 0.192 at step 0 (the noisy input alone has MSE ~0.12), mean 0.059 over steps 0-9,
  0.0099 over steps 40-79, 0.0079 over 120-159, 0.0070 over 240-279, 0.0068 over the last 40
  steps: a fast first fall, then a slow steady decline to the end as the LR anneals.
  Held-out MSE: 0.190 before training, 0.0068 after (the noisy input itself: 0.123).
- Grad norm 1.31 at step 0, then 0.02-0.06 (median 0.026) for the rest of the run; no NaN/Inf.
- Step time median ~47 ms (p99 81 ms) on the shared 2-core machine; the step-1 FLOP count and
  the profiler window at steps 49-51 are the recorder's own slow steps.
- Every parameter gets a gradient; nothing is wrong: a healthy run.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
}

STEPS, BATCH, SIZE, SIGMA = 400, 16, 24, 0.35
LR, WD = 2e-3, 1e-2


def make_clean(n, g):
    """Piecewise-smooth images: a few soft blobs and axis-aligned rectangles, values ~[-1, 1]."""
    yy, xx = torch.meshgrid(torch.linspace(0, 1, SIZE), torch.linspace(0, 1, SIZE), indexing="ij")
    img = torch.zeros(n, 1, SIZE, SIZE)
    for _ in range(3):
        cx, cy = torch.rand(n, 1, 1, generator=g), torch.rand(n, 1, 1, generator=g)
        r = 0.05 + 0.15 * torch.rand(n, 1, 1, generator=g)
        amp = torch.rand(n, 1, 1, generator=g) * 2 - 1
        img[:, 0] += amp * torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r ** 2))
    for _ in range(2):
        x0, y0 = torch.rand(n, 1, 1, generator=g) * 0.7, torch.rand(n, 1, 1, generator=g) * 0.7
        w = 0.1 + 0.3 * torch.rand(n, 1, 1, generator=g)
        h = 0.1 + 0.3 * torch.rand(n, 1, 1, generator=g)
        amp = torch.rand(n, 1, 1, generator=g) - 0.5
        inside = (xx >= x0) & (xx <= x0 + w) & (yy >= y0) & (yy <= y0 + h)
        img[:, 0] += amp * inside.float()
    return img.clamp(-1.5, 1.5)


def block(cin, cout):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
        nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
    )


class UNet(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.enc1 = block(1, c)
        self.enc2 = block(c, 2 * c)
        self.mid = block(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = block(4 * c, 2 * c)
        self.up1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec1 = block(2 * c, c)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        e1 = self.enc1(x)                      # 24x24
        e2 = self.enc2(F.max_pool2d(e1, 2))    # 12x12
        m = self.mid(F.max_pool2d(e2, 2))      # 6x6
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return x - self.out(d1)                # predicts the noise, returns the denoised image


@torch.no_grad()
def evaluate(model, noisy, clean):
    model.eval()
    out = F.mse_loss(model(noisy), clean).item()
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    clean = make_clean(2048, g)
    val_clean = make_clean(256, g)
    val_noisy = val_clean + SIGMA * torch.randn(val_clean.shape, generator=g)
    model = UNet()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=LR * 0.02)
    val0 = evaluate(model, val_noisy, val_clean)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            idx = torch.randint(0, clean.shape[0], (BATCH,), generator=g)
            y = clean[idx]
            if torch.rand((), generator=g) < 0.5:
                y = y.flip(3)
            x = y + SIGMA * torch.randn(y.shape, generator=g)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            sched.step()
            if step % 50 == 0 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e}",
                      flush=True)
    print(f"val mse before {val0:.4f} after {evaluate(model, val_noisy, val_clean):.4f} "
          f"(noisy input itself {F.mse_loss(val_noisy, val_clean).item():.4f})")

if __name__ == "__main__":
    main()
