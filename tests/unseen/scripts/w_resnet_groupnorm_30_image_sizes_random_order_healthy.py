"""Small ResNet (GroupNorm) classifying shapes in images whose size changes every batch: each
batch has one of 30 (height, width) sizes (heights 24-56, widths 24-64, steps of 8), drawn
uniformly at random. Every size first seen makes oneDNN/ATen build convolution kernels for it
and makes the allocator carve out blocks of new sizes, so host memory climbs while new sizes
appear (29 of 30 by step 73, the last at step 110) and then holds. HEALTHY (per-shape caches
and allocator pools that saturate, not a leak).

What it does: 4 classes (disk, square, ring, plus sign) of random radius 4..min(h, w)/3 at a
random place, a random positive RGB colour and contrast, on N(0, 0.3) noise; batches of 12, one
size per batch. Model: Conv 3->24 + GN + ReLU, three residual blocks (24, 48 stride 2, 64
stride 2; GroupNorm(8) everywhere), global average pool, Linear 64->4. AdamW(2e-3, wd 1e-4)
with cosine annealing to 0 over 550 steps.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Sizes: 30 distinct; first seen at steps 0-34 (24 of them), then 39, 44, 52, 73 and 110;
  none new after step 110.
- Heap: 128.0 MiB at step 0, 151.1 at 25, 160.1 at 50, 162.6 at 100, 163.6 at 150; then flat,
  163.5-164.1 MiB over steps 110-549 (slopes: +0.289 MiB/step over 0-99, +0.008 over 100-199,
  0.000 over 200-549).
- RSS: 415.3 MiB at step 0, 568.5 at 25, 598.6 at 50, 605.2 at 100, 605.7 at 150, 627.2 at 200
  (last moves of 8 MiB or more at steps 155 and 171), then 627.2-633.4 MiB from step 200 to
  the end (+6 MiB in 350 steps, in steps of ~2 MiB; slope +0.014 MiB/step over 200-349, +0.018
  over 350-549).
- Training is fine: loss 1.48 at step 0 (ln 4 = 1.39), 55-step window means 1.41, 1.29, 1.04,
  0.95, 0.86, 0.77, 0.71, 0.67, 0.62, 0.64; finite throughout. About 40 s on 2 cores.
- A second recording (the harness's run) gave the same heap figures (within 0.4 MiB) and RSS up
  to 31 MiB higher (629.6 at step 100, 658.1 at 200, 656.4-659.4 over 200-549).
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, CLASSES = 550, 12, 4
HEIGHTS = (24, 32, 40, 48, 56)
WIDTHS = (24, 32, 40, 48, 56, 64)

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


def make_batch(g):
    """BATCH images of one (h, w) drawn from the 30 sizes: a disk, a square, a ring or a plus."""
    h = HEIGHTS[int(torch.randint(0, len(HEIGHTS), (1,), generator=g))]
    w = WIDTHS[int(torch.randint(0, len(WIDTHS), (1,), generator=g))]
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    yy = torch.arange(h, dtype=torch.float32).view(1, h, 1)
    xx = torch.arange(w, dtype=torch.float32).view(1, 1, w)
    r = 4 + torch.rand(BATCH, 1, 1, generator=g) * (min(h, w) / 3 - 3)
    cy = r + torch.rand(BATCH, 1, 1, generator=g) * (h - 2 * r)
    cx = r + torch.rand(BATCH, 1, 1, generator=g) * (w - 2 * r)
    dy, dx = (yy - cy).abs(), (xx - cx).abs()
    dist = torch.sqrt(dy ** 2 + dx ** 2)
    masks = torch.stack([
        (dist <= r).float(),                                        # disk
        ((dy <= r * 0.85) & (dx <= r * 0.85)).float(),              # square
        ((dist <= r) & (dist >= r * 0.6)).float(),                  # ring
        (((dy <= r * 0.3) & (dx <= r)) | ((dx <= r * 0.3) & (dy <= r))).float(),  # plus
    ], 1)                                                           # (B, 4, h, w)
    shape = masks[torch.arange(BATCH), y]
    contrast = 0.6 + 0.8 * torch.rand(BATCH, 1, 1, generator=g)
    colour = 0.5 + torch.rand(BATCH, 3, 1, 1, generator=g)
    img = colour * (contrast * shape).unsqueeze(1) + 0.3 * torch.randn(BATCH, 3, h, w, generator=g)
    return img, y


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.gn1 = nn.GroupNorm(8, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.gn2 = nn.GroupNorm(8, cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.GroupNorm(8, cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        h = F.relu(self.gn1(self.conv1(x)))
        return F.relu(self.gn2(self.conv2(h)) + self.skip(x))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 1, 1, bias=False), nn.GroupNorm(8, 24),
                                  nn.ReLU())
        self.stages = nn.Sequential(Block(24, 24, 1), Block(24, 48, 2), Block(48, 64, 2))
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    model = SmallResNet()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
    trace, seen, first_seen = [], set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = make_batch(g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
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
    report(trace, marks=(0, 25, 50, 100, 150, 200, 250, 300, 350, 400, 450, 500, STEPS - 1),
           segments=((0, 99), (100, 199), (200, 349), (200, STEPS - 1), (350, STEPS - 1)))
    print(f"[shapes] {len(seen)} shapes; first seen at steps {first_seen}")


if __name__ == "__main__":
    main()
