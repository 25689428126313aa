"""Texture-classification CNN fed whole images at their own size: every batch has one of 36
(height, width) shapes (6 x 6 from 32..72 pixels), drawn at random. Each new shape makes
oneDNN build and cache convolution primitives (forward, backward-data, backward-weights) and
makes the allocator carve out blocks of new sizes, so host memory climbs while new shapes
keep appearing (most in the first ~80 steps) and holds once all 36 have been seen. HEALTHY
(per-shape caches that saturate, not a leak).

What it does: 6 texture classes drawn as 1-channel images with noise: horizontal stripes,
vertical stripes, diagonal stripes, checkerboard, dots and a smooth blob field, with random
period 4-10 pixels, phase and contrast 0.5-1.5, plus N(0, 1) noise; batches of 16, one shape per
batch. Model: Conv 1->16 (3x3) -> BN -> ReLU -> Conv 16->32 (stride 2) -> BN -> ReLU ->
Conv 32->64 (stride 2) -> BN -> ReLU -> Conv 64->64 (stride 2) -> ReLU -> global average pool
-> Linear 64->6. AdamW(2e-3, weight decay 0.01), 400 steps.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- New shapes: 19 seen by step 25, 28 by 50, 31 by 75; the last five first appear at steps
  92, 105, 114, 132 and 190, then none (all 36 seen).
- The heap rises ~0.8 MiB with each new shape: 126.7 MiB at step 0, 139.9 at 25, 146.6 at
  50, 148.7 at 80, 151.6 at 150, 152.3 at 200; then flat, 152.3-152.7 over steps 200-399
  (slopes: 0.267 MiB/step over 0-79, 0.045 over 80-159, 0.001 over 200-399).
- RSS: 419.6 MiB at step 0, 564.8 at 50, 587.3 at 80, 601.5 at 150, 611.9 at 200, 628.4 at
  250, then 635.1 from step ~300 to the end (slopes 2.03 MiB/step over 0-79, 0.26 over
  80-159, 0.10 over 200-399, 0.000 over 300-399); its last moves of 8 MiB or more are at
  steps 160 (+10) and 239 (+11).
- Training is fine: loss 1.78 at step 0 (ln 6 = 1.79), mean 1.06 over 0-39, 0.24 over 40-79,
  then 0.03-0.09 per 40-step window; finite throughout. About 23 s.
"""

import argparse
import ctypes
import math

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, CLASSES = 400, 16, 6
SIDES = (32, 40, 48, 56, 64, 72)

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


_MALLINFO2 = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MALLINFO2 is not None:
        mi = _MALLINFO2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(part, i):
    """Least-squares slope of column i of part (MiB per step)."""
    if len(part) < 2:
        return 0.0
    xm = (len(part) - 1) / 2
    den = sum((x - xm) ** 2 for x in range(len(part)))
    return sum((x - xm) * p[i] for x, p in enumerate(part)) / den


def report(trace, marks, segments):
    """Print the measured truths from trace, a list of (loss, RSS MiB, heap MiB) per step."""
    n = len(trace)
    for s in marks:
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean "
              f"{sum(p[0] for p in part) / len(part):.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a, b in segments:
        part = trace[a:b + 1]
        print(f"[slope] steps {a}-{b}: rss {slope(part, 1):+.3f} MiB/step, "
              f"heap {slope(part, 2):+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1], trace[s][2] - trace[s - 1][2])
             for s in range(1, n) if abs(trace[s][1] - trace[s - 1][1]) >= 8
             or abs(trace[s][2] - trace[s - 1][2]) >= 4]
    print("[jumps] RSS moves of 8 MiB or heap moves of 4 MiB or more (step:rss/heap): "
          + ", ".join(f"{s}:{d:+.0f}/{h:+.1f}" for s, d, h in jumps[:40]))


def texture(kind, h, w, g):
    """One (h, w) image of texture kind."""
    yy = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w)
    xx = torch.arange(w, dtype=torch.float32)[None, :].expand(h, w)
    period = 4 + 6 * float(torch.rand((), generator=g))
    phase = float(torch.rand((), generator=g)) * 2 * math.pi
    k = 2 * math.pi / period
    if kind == 0:
        img = torch.sin(k * yy + phase)
    elif kind == 1:
        img = torch.sin(k * xx + phase)
    elif kind == 2:
        img = torch.sin(k * (xx + yy) / math.sqrt(2) + phase)
    elif kind == 3:
        img = torch.sign(torch.sin(k * xx + phase) * torch.sin(k * yy + phase))
    elif kind == 4:
        img = (torch.sin(k * xx + phase) * torch.sin(k * yy + phase) > 0.6).float() * 2 - 1
    else:
        low = torch.randn(1, 1, h // 8 + 1, w // 8 + 1, generator=g)
        img = F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)[0, 0]
    contrast = 0.5 + float(torch.rand((), generator=g))
    return contrast * img + 1.0 * torch.randn(h, w, generator=g)


def make_batch(g):
    h = SIDES[int(torch.randint(0, len(SIDES), (1,), generator=g))]
    w = SIDES[int(torch.randint(0, len(SIDES), (1,), generator=g))]
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    x = torch.stack([texture(k, h, w, g) for k in labels.tolist()]).unsqueeze(1)
    return x, labels


class TextureCNN(nn.Module):
    def __init__(self):
        super().__init__()
        def block(cin, cout, stride, bn=True):
            layers = [nn.Conv2d(cin, cout, 3, stride=stride, padding=1)]
            return layers + ([nn.BatchNorm2d(cout)] if bn else []) + [nn.ReLU()]
        self.features = nn.Sequential(*block(1, 16, 1), *block(16, 32, 2), *block(32, 64, 2),
                                      *block(64, 64, 2, bn=False))
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    model = TextureCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    trace, seen, first_seen = [], set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = make_batch(g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc, height=x.shape[2], width=x.shape[3])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            shape = tuple(x.shape[2:])
            if shape not in seen:
                seen.add(shape)
                first_seen.append(step)
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} shape {shape} loss {loss.item():.4f} acc {acc.item():.3f} "
                      f"shapes seen {len(seen)} rss {rss:.1f} MiB heap {heap:.1f} MiB",
                      flush=True)
    report(trace, marks=(0, 25, 50, 80, 100, 150, 200, 250, 300, 350, 399),
           segments=((0, 79), (80, 159), (160, 399), (200, 399), (300, 399)))
    print(f"[shapes] {len(seen)} shapes; first seen at steps {first_seen}")


if __name__ == "__main__":
    main()
