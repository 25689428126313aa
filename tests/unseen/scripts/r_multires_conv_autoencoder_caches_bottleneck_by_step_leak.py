"""Convolutional denoising autoencoder trained on batches at five resolutions (32-64 px,
drawn at random each step); from step CACHE_FROM the loop stores each step's bottleneck
feature map in a dict keyed by the step number ("for a latent-space plot later"), which is
never evicted: HOST MEMORY LEAK from mid-run, its per-step size depending on the resolution.

What it does: 16 images a step of 3-6 soft coloured Gaussian blobs at a resolution drawn from
32, 40, 48, 56, 64 px; input = image + Gaussian noise (std 0.3), target = the clean image.
Model: conv encoder 3 -> 24 -> 32 -> 32 channels (two stride-2 convs: bottleneck at 1/4
resolution), transposed-conv decoder back to 3 channels; MSE. Adam(2e-3), 300 steps. The bug:
from CACHE_FROM = 120 every step stores `z.detach().clone()` (16 x 32 x (size/4)^2 float32:
128-512 KiB by resolution) in a dict keyed by the step, never evicted: 0.306 MiB a step on
average, 55.0 MiB in 180 entries by the end.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- Before step 120 the heap is flat: 132.4-135.4 MiB over steps 30-119 (it moves with the
  step's resolution, no trend); 127.5 MiB at step 0.
- From step 120 it grows by 0.30 MiB/step to the end, in resolution-sized increments, no
  plateau: 143.4 MiB at 150, 165.2 at 225, 189.0 at 299 (quarter slopes 0.035, 0.122 [the
  leak starts in this quarter], 0.312, 0.302 MiB/step).
- RSS: 407 MiB at step 0, 472-475 over steps 30-119 (flat), then grows with the cache: 485 by
  150, 493.5 at 209, 501 at 239, 520 at 299 (+0.30 MiB/step over steps 225-299).
- Training itself is fine: loss 0.089 at step 0, mean 0.030 over 0-29, 0.0116 over 30-59,
  0.0085 over 120-149, 0.0073 over 210-239, 0.0055 over the last 30; finite throughout.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 120, "tolerance": 15},
    ],
}

STEPS, BATCH, CACHE_FROM = 300, 16, 120
SIZES = (32, 40, 48, 56, 64)
LR = 2e-3

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):
    _mallinfo2 = None
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _mallinfo2 is not None:
        mi = _mallinfo2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def summarize(trace):
    """Print the measured truths: (loss, RSS, heap) per step, as Python floats."""
    n = len(trace)
    for s in (0, n // 4, n // 2, 3 * n // 4, n - 1):
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        mean = sum(p[0] for p in part) / len(part)
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean {mean:.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a in range(0, n, n // 4):
        part = trace[a:a + n // 4]
        xs = range(len(part))
        xm = (len(part) - 1) / 2
        den = sum((x - xm) ** 2 for x in xs)
        slope = [sum((x - xm) * p[i] for x, p in zip(xs, part, strict=True)) / den for i in (1, 2)]
        print(f"[slope] steps {a}-{a + len(part) - 1}: rss {slope[0]:+.3f} MiB/step, "
              f"heap {slope[1]:+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1]) for s in range(1, n)
             if abs(trace[s][1] - trace[s - 1][1]) >= 4]
    print("[jumps] rss moves of 4 MiB or more: "
          + ", ".join(f"{s}:{d:+.0f}" for s, d in jumps[:40]))


def blobs(size, g):
    """BATCH images (3 channels) of 3-6 soft coloured Gaussian blobs at random places and
    widths (the clean target) plus Gaussian noise of std 0.3 (the input)."""
    coords = torch.linspace(0, 1, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    img = torch.zeros(BATCH, 3, size, size)
    for _ in range(int(torch.randint(3, 7, (1,), generator=g))):
        cy, cx = torch.rand(2, BATCH, 1, 1, generator=g)
        width = 0.04 + 0.12 * torch.rand(BATCH, 1, 1, generator=g)
        colour = torch.rand(BATCH, 3, 1, 1, generator=g)
        bump = torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * width ** 2))
        img = img + colour * bump[:, None]
    clean = img.clamp(0, 1.5)
    return clean + 0.3 * torch.randn(clean.shape, generator=g), clean


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(3, 24, 3, padding=1), nn.ReLU(),
            nn.Conv2d(24, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU())
        self.dec = nn.Sequential(
            nn.ConvTranspose2d(32, 32, 4, stride=2, padding=1), nn.ReLU(),
            nn.ConvTranspose2d(32, 24, 4, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(24, 3, 3, padding=1))

    def forward(self, x):
        z = self.enc(x)
        return self.dec(z), z


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = AutoEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    latents = {}                    # the leak: step -> bottleneck features, never evicted
    held = 0
    trace = []                                  # (loss, RSS, heap) per step: floats only
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            size = SIZES[int(torch.randint(0, len(SIZES), (1,), generator=g))]
            noisy, clean = blobs(size, g)
            recon, z = model(noisy)
            loss = F.mse_loss(recon, clean)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= CACHE_FROM:
                latents[step] = z.detach().clone()
                held += z.numel() * 4
            rec.step(loss=loss, resolution=size)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step in (CACHE_FROM - 1, CACHE_FROM + 1) or step == STEPS - 1:
                print(f"step {step} size {size} loss {loss.item():.5f} cached {len(latents)} "
                      f"({held / 2 ** 20:.1f} MiB) rss {rss:.1f} MiB heap {heap:.1f} MiB",
                      flush=True)
    summarize(trace)
    n = max(len(latents), 1)
    print(f"[leak] {len(latents)} latents cached from step {CACHE_FROM}, {held / 2 ** 20:.1f} MiB,"
          f" {held / n / 2 ** 20:.3f} MiB per step")


if __name__ == "__main__":
    main()
