"""DCGAN-style generator/discriminator pair on 16x16 grayscale "blob" images (2-3 Gaussian
blobs of random position, width and brightness). G: z(32) -> Linear -> 64x4x4 -> ConvT 4/2
(64->32) + BN + ReLU -> ConvT 4/2 (32->1) + tanh. D: Conv 4/2 (1->32) + LeakyReLU -> Conv
4/2 (32->64) + BN + LeakyReLU -> Linear -> logit. Non-saturating BCE losses, two Adam
optimizers (2e-4, betas 0.5/0.999), batch 64, 400 iterations (one D step then one G step).
Recorded: the generator (model=G, optimizer=G's Adam), one recorded step per iteration, the
generator loss as `loss` and the discriminator loss as a metric.

The self-inflicted stall: every 30 iterations (steps 30, 60, ..., 390: 13 times) the loop
writes a checkpoint synchronously on the training thread — both models, both optimizers and
a 256 MiB "sample bank" (a float32 buffer kept for FID evaluation) — with torch.save into a
temporary directory, flush + os.fsync, then an atomic rename. The write happens after the G
update and before rec.step(), so it lands inside steps 30, 60, ... .

What is TRUE of the run (measured by this script with time.perf_counter, printed below):
- Three recordings: loop 13.3 / 13.2 / 14.6 s, of which the 13 checkpoint writes took 5.4 /
  5.2 / 6.0 s (41% / 39% / 41% of the loop). Each write 222-845 ms (most 230-280 ms, some
  500-850 ms; the disk's speed varies); a step without a write takes 18-19 ms (median; p99
  26-42 ms). Step 0 takes ~200 ms (first step, warm-up).
- The slow steps are 30, 60, 90, ..., 390 (every step > 3x the median besides step 0; in the
  third recording, on a machine busy with other jobs, one ordinary step, 271, took 92 ms —
  still a fraction of any write); the first stall is step 30. Nothing else is slow: the data
  are made inline (no loader).
- Memory flat: RSS 661-686 MiB over the run (the 256 MiB bank is allocated before the first
  step; no growth from the writes).
- The GAN itself trains normally and stays finite: generator loss means per 100 steps 2.14,
  2.40, 2.13, 1.64; discriminator loss 0.30, 0.26, 0.37, 0.61 (D at first wins, then G
  catches up); G gradient norm max 13-29 per 100 steps; generated pixel mean/std
  -0.757/0.427 vs real -0.735/0.454 at the end.
- Root cause: the synchronous checkpoint on the training thread -> periodic step-time
  outliers from step 30, every 30 steps.
- About 17 s on 2 cores (1 thread).
"""

import argparse
import math
import os
import shutil
import tempfile
import time

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "step_time_outlier", "first_step": 30, "tolerance": 1}],
          "forbidden": ["dataloader_bottleneck", "memory_leak"]}

STEPS, BATCH, ZDIM, EVERY, BANK_MIB = 400, 64, 32, 30, 256


def blobs(n, g):
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    img = torch.zeros(n, 16, 16)
    for _ in range(3):
        on = (torch.rand(n, 1, 1, generator=g) < 0.8).float()
        cy, cx = (torch.rand(2, n, 1, 1, generator=g) * 10 + 3)
        s = 1.0 + 1.5 * torch.rand(n, 1, 1, generator=g)
        a = 0.5 + 0.5 * torch.rand(n, 1, 1, generator=g)
        img = img + on * a * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
    return (img.clamp(0, 1) * 2 - 1).unsqueeze(1)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(ZDIM, 64 * 4 * 4)
        self.up1 = nn.ConvTranspose2d(64, 32, 4, 2, 1)
        self.bn1 = nn.BatchNorm2d(32)
        self.up2 = nn.ConvTranspose2d(32, 1, 4, 2, 1)

    def forward(self, z):
        h = F.relu(self.fc(z)).view(-1, 64, 4, 4)
        return torch.tanh(self.up2(F.relu(self.bn1(self.up1(h)))))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 4, 2, 1)
        self.c2 = nn.Conv2d(32, 64, 4, 2, 1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64 * 4 * 4, 1)

    def forward(self, x):
        h = F.leaky_relu(self.c1(x), 0.2)
        h = F.leaky_relu(self.bn2(self.c2(h)), 0.2)
        return self.fc(h.flatten(1)).squeeze(1)


def checkpoint(path, G, D, opt_g, opt_d, bank, step):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save({"step": step, "G": G.state_dict(), "D": D.state_dict(),
                    "opt_g": opt_g.state_dict(), "opt_d": opt_d.state_dict(), "bank": bank}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(8)
    G, D = Generator(), Discriminator()
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bank = torch.randn(BANK_MIB * 2 ** 20 // 4, generator=g)
    ckdir = tempfile.mkdtemp(prefix="dcgan-ckpt-")
    fixed_z = torch.randn(256, ZDIM, generator=g)
    real_eval = blobs(256, torch.Generator().manual_seed(99))
    rows, saves = [], []
    last = time.perf_counter()
    t_start = last
    try:
        with Recorder(args.run_dir, model=G, optimizer=opt_g) as rec:
            for step in range(STEPS):
                real = blobs(BATCH, g)
                z = torch.randn(BATCH, ZDIM, generator=g)
                fake = G(z)
                d_real = F.binary_cross_entropy_with_logits(D(real), torch.ones(BATCH))
                d_fake = F.binary_cross_entropy_with_logits(D(fake.detach()), torch.zeros(BATCH))
                d_loss = d_real + d_fake
                opt_d.zero_grad()
                d_loss.backward()
                opt_d.step()
                g_loss = F.binary_cross_entropy_with_logits(D(fake), torch.ones(BATCH))
                opt_g.zero_grad()
                g_loss.backward()
                gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in G.parameters())).item()
                opt_g.step()
                save_s = 0.0
                if step > 0 and step % EVERY == 0:
                    t0 = time.perf_counter()
                    checkpoint(os.path.join(ckdir, "last.pt"), G, D, opt_g, opt_d, bank, step)
                    save_s = time.perf_counter() - t0
                    saves.append((step, save_s))
                rec.step(loss=g_loss, d_loss=d_loss)
                now = time.perf_counter()
                rows.append((step, now - last, save_s, g_loss.item(), d_loss.item(), gn,
                             psutil.Process().memory_info().rss / 2 ** 20))
                last = now
                if step % 25 == 0 or save_s:
                    print(f"step {step} dur {rows[-1][1] * 1e3:.1f} ms (checkpoint "
                          f"{save_s * 1e3:.0f} ms) g_loss {g_loss.item():.3f} d_loss "
                          f"{d_loss.item():.3f} g_grad_norm {gn:.3g}", flush=True)
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)
    total = last - t_start
    normal = sorted(r[1] for r in rows[5:] if not r[2])
    stall = sum(s for _, s in saves)
    print(f"[time] loop {total:.2f} s; checkpoint writes {stall:.2f} s = {stall / total:.0%} of "
          f"the loop; steps without a write: median {normal[len(normal) // 2] * 1e3:.1f} ms, "
          f"p99 {normal[int(len(normal) * 0.99)] * 1e3:.1f} ms, max {normal[-1] * 1e3:.1f} ms")
    print("[time] write steps (step: ms): "
          + ", ".join(f"{s}:{d * 1e3:.0f}" for s, d in saves))
    slow = [r[0] for r in rows if r[1] > 3 * normal[len(normal) // 2]]
    print(f"[time] steps slower than 3x the median: {slow}")
    with torch.no_grad():
        G.eval()
        fk = G(fixed_z)
        G.train()
    print(f"[gan] generated mean/std {fk.mean().item():.3f}/{fk.std().item():.3f} vs real "
          f"{real_eval.mean().item():.3f}/{real_eval.std().item():.3f}")
    for a in range(0, STEPS, 100):
        part = rows[a:a + 100]
        print(f"[win] steps {a}-{a + 99}: g_loss mean {sum(r[3] for r in part) / 100:.3f} "
              f"d_loss mean {sum(r[4] for r in part) / 100:.3f} g grad norm max "
              f"{max(r[5] for r in part):.3g}; rss {min(r[6] for r in part):.0f}-"
              f"{max(r[6] for r in part):.0f} MiB; nonfinite "
              f"{sum(not math.isfinite(r[3]) or not math.isfinite(r[4]) for r in part)}")


if __name__ == "__main__":
    main()
