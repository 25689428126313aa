"""Online (streaming) glyph classifier with a rehearsal buffer: each step trains on 32 fresh
samples plus 32 replayed from a deque(maxlen=6400), and then stores each fresh sample in it
as its own 1x20x20 tensor. The buffer fills by step 199 (+62 KiB of heap per step). From then
on every append drops the oldest sample, and memory is flat. HEALTHY: a fixed-capacity replay
buffer that fills, not a leak.

What it does: an endless stream of 20x20 glyphs from 10 classes. Each class is two fixed line
segments with endpoints jittered by N(0, 1 px), shifted up to +-2 px, drawn with Gaussian ink
(sigma 1 px), plus N(0, 0.15) noise. Model: Conv 1->24->48->64 (3x3, ReLU, two max-pools),
global average pool, Linear(64, 10). Adam(1e-3). Step 0 trains on the 32 fresh samples only;
after that each step uses 32 fresh + 32 drawn uniformly from the buffer. 500 steps.

What is TRUE of the run (measured, 2 runs, identical losses; heap = glibc mallinfo2 uordblks +
hblkhd, RSS from psutil, right after rec.step):
- Buffer: 32 samples after step 0, 1,632 at 50, 3,232 at 100, 6,400 (full) at step 199,
  then 6,400 to the end.
- Heap: 125.7 MiB at step 0, 129.7 at 50, 132.5 at 100, 135.5 at 150, 138.5 at 199 (+0.061
  MiB/step over 0-198, linear). Then 138.5-138.7 over 200-499 (+0.001 MiB/step).
- RSS differs between runs and is flat once the buffer is full: run 1 402 at step 0,
  500 at 50, 504.0-504.7 over 100-449, 514.8 from ~430 on. Run 2 404, 427 at 50, 438 at 100,
  443.1-443.7 over 150-449, 453.7 at the end. Both: +0.001 MiB/step over 200-299, one ~10
  MiB step in the last 100 steps.
- Training is healthy: loss 2.29 at step 0, 50-step means 2.30, 2.01, 1.09, 0.66, 0.45,
  0.35, 0.31, 0.28, 0.24, 0.21; accuracy on the fresh samples 0.11 -> 0.93. Finite.
- About 11-12 s of training (16 s wall) on 2 shared cores, 1 thread.
"""

import argparse
import ctypes
import random
import time
from collections import deque

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, FRESH, REPLAY, SIZE, CLASSES, CAPACITY = 500, 32, 32, 20, 10, 6400

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MI = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, heap) in MiB; heap = glibc mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MI is not None:
        mi = _MI()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(trace, a, b, i):
    part = trace[a:b + 1]
    xm = (len(part) - 1) / 2
    return (sum((x - xm) * p[i] for x, p in enumerate(part))
            / sum((x - xm) ** 2 for x in range(len(part))))


class GlyphStream:
    """An endless stream of 20x20 glyphs: class c = two strokes (line segments) fixed per
    class, endpoints jittered by N(0, 1 px), the glyph shifted by up to +-2 px, Gaussian ink
    (sigma 1 px) and N(0, 0.15) pixel noise."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.strokes = torch.rand(CLASSES, 2, 2, 2, generator=self.g) * (SIZE - 8) + 4
        ys, xs = torch.meshgrid(torch.arange(SIZE.__float__()), torch.arange(SIZE.__float__()),
                                indexing="ij")
        self.pix = torch.stack([xs, ys], -1).view(1, 1, -1, 2)        # (1, 1, P, 2)

    def batch(self, n):
        g = self.g
        y = torch.randint(0, CLASSES, (n,), generator=g)
        seg = self.strokes[y] + torch.randn(n, 2, 2, 2, generator=g)
        seg = seg + (torch.rand(n, 1, 1, 2, generator=g) * 4 - 2)
        a, b = seg[:, :, 0, None, :], seg[:, :, 1, None, :]            # (n, 2, 1, 2)
        ab = b - a
        t = (((self.pix - a) * ab).sum(-1) / (ab * ab).sum(-1).clamp(min=1e-6)).clamp(0, 1)
        d2 = ((self.pix - (a + t[..., None] * ab)) ** 2).sum(-1)        # (n, 2, P)
        ink = torch.exp(-d2 / 2.0).amax(1).view(n, 1, SIZE, SIZE)
        return ink + 0.15 * torch.randn(n, 1, SIZE, SIZE, generator=g), y


class GlyphCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 24, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(24, 48, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(48, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(64, CLASSES))

    def forward(self, x):
        return self.net(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = random.Random(7)
    stream = GlyphStream(seed=9)
    model = GlyphCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rehearsal = deque(maxlen=CAPACITY)     # (image 1x20x20 float32, label) per sample
    trace = []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x_new, y_new = stream.batch(FRESH)
            if rehearsal:
                picks = [rehearsal[rng.randrange(len(rehearsal))] for _ in range(REPLAY)]
                x = torch.cat([x_new, torch.stack([p[0] for p in picks])])
                y = torch.cat([y_new, torch.tensor([p[1] for p in picks])])
            else:
                x, y = x_new, y_new
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            for i in range(FRESH):                          # each fresh sample, stored alone
                rehearsal.append((x_new[i].clone(), int(y_new[i])))
            acc = (logits[:FRESH].argmax(-1) == y_new).float().mean().item()
            rss, heap = memory_mib()
            trace.append((step, loss.item(), acc, rss, heap, len(rehearsal)))
            if step % 25 == 0:
                print(f"step {step} loss {loss.item():.4f} fresh acc {acc:.2f} rss {rss:.1f} heap "
                      f"{heap:.1f} buffer {len(rehearsal)}", flush=True)
    print(f"[time] {time.time() - t0:.1f} s")
    full = next(t[0] for t in trace if t[5] >= CAPACITY)
    print(f"[buffer] full ({CAPACITY} samples) at step {full}")
    for a, b in ((0, 49), (50, 149), (0, 198), (200, 299), (300, 499), (200, 499), (250, 499)):
        print(f"[slope] steps {a}-{b}: rss {slope(trace, a, b, 3):+.4f} MiB/step, heap "
              f"{slope(trace, a, b, 4):+.4f} MiB/step")
    for s in (0, 1, 10, 25, 50, 100, 150, 190, 198, 199, 200, 210, 250, 300, 400, 499):
        t = trace[s]
        print(f"[mem] step {s}: rss {t[3]:.1f} heap {t[4]:.1f} buffer {t[5]}")
    for a in range(0, STEPS, 50):
        part = trace[a:a + 50]
        n = len(part)
        print(f"[win] steps {a}-{a + n - 1}: loss {sum(p[1] for p in part) / n:.4f} fresh acc "
              f"{sum(p[2] for p in part) / n:.3f} rss {min(p[3] for p in part):.1f}-"
              f"{max(p[3] for p in part):.1f} heap {min(p[4] for p in part):.1f}-"
              f"{max(p[4] for p in part):.1f}")


if __name__ == "__main__":
    main()
