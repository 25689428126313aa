"""Small U-Net for blob segmentation that saves a checkpoint synchronously to a slow
(simulated network) file system every 50 steps: each save blocks the training loop for ~1.5 s,
inside the step (before ``rec.step()``), on steps 49, 99, ..., 399. PATHOLOGICAL.

What it does: 32x32 single-channel images with 1-4 random elliptical blobs (foreground,
intensity 0.5-1.0) on a smooth random background gradient plus Gaussian noise std 0.25; the
target is the binary blob mask. Batches of 16 come from a generator wrapped with
``rec.wrap_loader`` (made on the fly, ~1 ms). Model: U-Net with two downsamplings
(1-8-16-32 channels, two 3x3 convs + BatchNorm + ReLU per level, max-pool down, transposed
conv up, skip connections), 1x1 conv to one logit per pixel; BCE-with-logits + soft Dice.
Adam(2e-3), 400 steps. After the optimizer step of every 50th step the loop writes
{model, optimizer, step} with ``torch.save`` to a temporary directory, then ``os.fsync`` and
a 1.5 s ``time.sleep`` standing in for the flush to a slow network mount (what a synchronous
save to a congested NFS/Lustre looks like from the training process: it waits, idle).

Why ``step_time_outlier``: every 50th step takes 22-35x the median and these 8 steps are a
third or more of the run's time. The data wait is ~0 (the stall is not in the input pipeline),
so ``dataloader_bottleneck`` is forbidden; the fix is an asynchronous / background
checkpoint.

What is TRUE of the run (measured twice on the shared 2-core machine, 35-48 s wall; figures
from the recorded ``steps`` table of the judged run, the second run in brackets):
- Checkpoint steps 49, 99, 149, 199, 249, 299, 349, 399: 1.60, 1.56, 1.58, 1.58, 1.62, 1.59,
  1.60, 1.57 s (the save itself 1.51-1.54 s [script's timer]), 22-24x the median of the other
  steps [35x]; the first is step 49. Together 12.7 s of 39.5 s of recorded step time (32%)
  [12.5 of 29.9 s, 42%].
- Other steps (2-398): median 69 ms, p10 44, p90 93 [45, p90 52]; the next slowest are step 1
  (270 ms, warm-up), 52 (172 ms, the recorder's own profiler window) and 257 (155 ms, 105 ms
  of it run-queue wait from other processes on the shared cores): <= 2.5x the median after
  warm-up.
- Data wait small and flat: 3.8 s in all, median 9.5 ms a step (the batch is drawn in
  Python), max 35 ms after step 1; not higher at the checkpoint steps (4-16 ms).
- Training is fine: loss (BCE + Dice; 50-step means) 1.077, 0.741, 0.473, 0.294, 0.197, 0.146,
  0.117, 0.096; finite. RSS 410 -> 444 MB by step 106, 434-438 MB from step 200 to the end.
"""

import argparse
import os
import tempfile
import time

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "step_time_outlier", "first_step": 49, "tolerance": 1},
    ],
    "forbidden": ["dataloader_bottleneck", "memory_leak", "nonfinite", "gradient_explosion",
                  "loss_divergence", "straggler"],
}

STEPS, BATCH, SIDE, CKPT_EVERY, SLOW_FS_S = 400, 16, 32, 50, 1.5


def batches(gen):
    grid = torch.arange(SIDE, dtype=torch.float32)
    yy, xx = grid[:, None], grid[None, :]
    while True:
        mask = torch.zeros(BATCH, SIDE, SIDE)
        img = torch.zeros(BATCH, SIDE, SIDE)
        for b in range(BATCH):
            for _ in range(int(torch.randint(1, 5, (1,), generator=gen))):
                cy, cx = (4 + 24 * torch.rand(2, generator=gen)).tolist()
                ry, rx = (2 + 5 * torch.rand(2, generator=gen)).tolist()
                blob = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
                mask[b][blob] = 1.0
                img[b][blob] = 0.5 + 0.5 * float(torch.rand(1, generator=gen))
        gy, gx = (0.02 * torch.randn(2, BATCH, 1, 1, generator=gen)).unbind(0)
        img = img + gy * yy + gx * xx + 0.25 * torch.randn(BATCH, SIDE, SIDE, generator=gen)
        yield img[:, None], mask[:, None]


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down1, self.down2, self.mid = block(1, 8), block(8, 16), block(16, 32)
        self.up2, self.dec2 = nn.ConvTranspose2d(32, 16, 2, stride=2), block(32, 16)
        self.up1, self.dec1 = nn.ConvTranspose2d(16, 8, 2, stride=2), block(16, 8)
        self.out = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(nn.functional.max_pool2d(d1, 2))
        m = self.mid(nn.functional.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], 1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], 1))
        return self.out(u1)


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(50)
    model = UNet()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses, durs, waits, ckpt = [], [], [], {}
    with tempfile.TemporaryDirectory() as mount, \
            Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        last = time.perf_counter()
        for step, (x, m) in enumerate(rec.wrap_loader(batches(gen))):
            if step == STEPS:
                break
            waits.append(time.perf_counter() - last)
            logits = model(x)
            p = torch.sigmoid(logits)
            dice = 1 - (2 * (p * m).sum() + 1) / (p.sum() + m.sum() + 1)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, m) + dice
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if (step + 1) % CKPT_EVERY == 0:
                t0 = time.perf_counter()
                path = os.path.join(mount, f"unet-{step:06d}.pt")
                with open(path, "wb") as fh:
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                "step": step}, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                    time.sleep(SLOW_FS_S)       # the network mount acknowledges the flush
                ckpt[step] = time.perf_counter() - t0
            rec.step(loss=loss)
            now = time.perf_counter()
            durs.append(now - last)
            last = now
            losses.append(loss.item())
    normal = [t for i, t in enumerate(durs) if i not in ckpt and i > 1]
    med = pct(normal, 0.5)
    print(f"other steps: median {med * 1e3:.1f} ms, p90 {pct(normal, 0.9) * 1e3:.1f}, max "
          f"{max(normal) * 1e3:.1f} at {durs.index(max(normal))}")
    print("checkpoint steps (step, save s, step s, x median):",
          [(s, round(c, 3), round(durs[s], 3), round(durs[s] / med)) for s, c in ckpt.items()])
    total, stall = sum(durs), sum(durs[s] for s in ckpt)
    print(f"total step time {total:.1f} s; checkpoint steps {stall:.1f} s "
          f"({100 * stall / total:.0f}%); data wait {sum(waits):.2f} s in all, max "
          f"{max(waits) * 1e3:.1f} ms")
    top = sorted(range(len(durs)), key=lambda i: -durs[i])[:12]
    print("slowest steps", [(i, round(durs[i], 3)) for i in sorted(top)])
    w = 50
    print("loss window means", [round(sum(losses[i:i + w]) / w, 3)
                                for i in range(0, len(losses), w)])


if __name__ == "__main__":
    main()
