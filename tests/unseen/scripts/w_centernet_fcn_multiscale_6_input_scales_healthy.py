"""CenterNet-style fully convolutional box detector trained multi-scale: every batch is drawn
at one of K = 6 square input sizes (64, 80, 96, 112, 128, 144) picked at random, as multi-scale
detection training does. The first batch of each scale builds that scale's convolution kernels and
allocator blocks (all 6 scales seen by step 21); after that memory holds. HEALTHY.

What it does: 6 images per batch, 1-3 bright axis-aligned boxes (1/8 to 1/3 of the side) on
noise with a faint stripe pattern. Targets at stride 4: a Gaussian heat map of box centres and
each box's (w, h) / side. Model: conv-BN-ReLU backbone to stride 8 (16-32-64 channels), a
stride-4 neck (lateral 1x1 + nearest upsampling), a heat-map head (bias -2.19) and a size head.
Loss: CenterNet's penalty-reduced focal loss + 5 x L1 on the sizes at the centres. Adam(1e-3),
420 steps.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Scales first seen at steps 0, 1, 3, 7, 9 and 21; none new after step 21.
- RSS: 421.9 MiB at step 0, 461.8 at 10, 475.2 at 25, 482.7 at 100, 483.9 at 150-200, one
  step of +16 MiB around step 203-225 (499.7), then 496.6-499.8 MiB to the end (slope +0.003
  MiB/step over 200-419, -0.008 over 300-419).
- Heap: 129.6 MiB at step 0, 134.5 at 10, then 134.9-136.9 MiB from step 25 to the end (it
  moves with the scale in hand; slope +0.002 MiB/step over 50-419).
- Training is fine: loss 4.99 at step 0, 42-step window means 2.08, 0.97, 0.74, 0.64, 0.53,
  0.47, 0.42, 0.44, 0.41, 0.40; finite throughout. About 23 s on 2 cores.
- A second recording (the harness's run) gave the same heap figures (within 0.4 MiB) and RSS
  within 6 MiB.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, STRIDE, MAX_OBJ = 420, 6, 4, 3
SCALES = (64, 80, 96, 112, 128, 144)       # multi-scale training: one square size per batch

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
    """BATCH images of one scale with 1-3 bright axis-aligned boxes on textured noise; targets
    are CenterNet's: a Gaussian heat map of box centres at stride 4, and each box's (w, h)."""
    s = SCALES[int(torch.randint(0, len(SCALES), (1,), generator=g))]
    img = 0.3 * torch.randn(BATCH, 3, s, s, generator=g)
    img += 0.2 * torch.sin(torch.arange(s, dtype=torch.float32) / 3).view(1, 1, 1, s)
    n = s // STRIDE
    heat = torch.zeros(BATCH, 1, n, n)
    centres, sizes = [], []
    yy = torch.arange(n, dtype=torch.float32).view(n, 1)
    xx = torch.arange(n, dtype=torch.float32).view(1, n)
    for b in range(BATCH):
        k = int(torch.randint(1, MAX_OBJ + 1, (1,), generator=g))
        for _ in range(k):
            bw, bh = (torch.randint(s // 8, s // 3, (2,), generator=g)).tolist()
            x0 = int(torch.randint(0, s - bw, (1,), generator=g))
            y0 = int(torch.randint(0, s - bh, (1,), generator=g))
            colour = 0.8 + 0.7 * torch.rand(3, 1, 1, generator=g)
            img[b, :, y0:y0 + bh, x0:x0 + bw] += colour
            cx, cy = (x0 + bw / 2) / STRIDE, (y0 + bh / 2) / STRIDE
            sigma = max(0.5, min(bw, bh) / STRIDE / 6)
            blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma ** 2))
            heat[b, 0] = torch.maximum(heat[b, 0], blob)
            ci, cj = min(int(cy), n - 1), min(int(cx), n - 1)
            heat[b, 0, ci, cj] = 1.0
            centres.append((b, ci, cj))
            sizes.append((bw / s, bh / s))
    return img, heat, torch.tensor(centres), torch.tensor(sizes)


def conv_bn(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class CenterNetLite(nn.Module):
    """Stride-4 fully convolutional detector: a small backbone with one upsampled skip, a
    centre heat-map head and a box-size head."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(conv_bn(3, 16, 2), conv_bn(16, 16))          # /2
        self.c2 = nn.Sequential(conv_bn(16, 32, 2), conv_bn(32, 32))         # /4
        self.c3 = nn.Sequential(conv_bn(32, 64, 2), conv_bn(64, 64))         # /8
        self.lat = nn.Conv2d(32, 64, 1)
        self.neck = conv_bn(64, 64)
        self.heat = nn.Sequential(conv_bn(64, 32), nn.Conv2d(32, 1, 1))
        self.size = nn.Sequential(conv_bn(64, 32), nn.Conv2d(32, 2, 1))
        nn.init.constant_(self.heat[1].bias, -2.19)         # prior 0.1, as CenterNet does

    def forward(self, x):
        f2 = self.c2(self.c1(x))
        f3 = self.c3(f2)
        f = self.neck(self.lat(f2) + F.interpolate(f3, size=f2.shape[2:], mode="nearest"))
        return self.heat(f), self.size(f)


def focal_loss(logit, target):
    """CenterNet's penalty-reduced focal loss, normalised by the number of objects."""
    p = logit.sigmoid().clamp(1e-4, 1 - 1e-4)
    pos = target.eq(1).float()
    neg = (1 - pos) * (1 - target) ** 4
    loss = -(pos * (1 - p) ** 2 * p.log() + neg * p ** 2 * (1 - p).log()).sum()
    return loss / pos.sum().clamp_min(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(17)
    model = CenterNetLite()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    trace, first_seen = [], {}
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            img, heat, centres, sizes = make_batch(g)
            heat_logit, size_pred = model(img)
            hm = focal_loss(heat_logit, heat)
            b, i, j = centres.unbind(1)
            wh = F.l1_loss(size_pred[b, :, i, j], sizes)
            loss = hm + 5.0 * wh
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, heatmap_loss=hm, size_loss=wh, scale=img.shape[-1],
                     objects=len(centres))
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            first_seen.setdefault(img.shape[-1], step)
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} scale {img.shape[-1]} loss {loss.item():.4f} "
                      f"(heat {hm.item():.4f} size {wh.item():.4f}) rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 10, 25, 50, 100, 150, 200, 250, 300, 350, 400, STEPS - 1),
           segments=((0, 49), (50, 199), (200, STEPS - 1), (300, STEPS - 1)))
    print(f"[shapes] {len(first_seen)} scales; first seen at steps {sorted(first_seen.values())}")


if __name__ == "__main__":
    main()
