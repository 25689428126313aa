"""CoordConv-style U-Net denoiser trained on random crops of many sizes: each batch's (height,
width) is drawn uniformly from 289 (17 x 17 sides, 32..96 pixels, multiples of 4), and the
model concatenates the noisy crop with Fourier coordinate features of its size (24 channels:
sin/cos of y and x at 6 frequencies) that it builds on first use and keeps in a dict keyed by
(h, w), ~380 KiB per size on average. New sizes arrive through the run (94, 68, 39 and 24
first sightings in the four quarters; 225 by the end, one new at the last step). Each adds its
coordinate table plus oneDNN primitives for the U-Net's eight convolutions at that size
(their 1024-entry cache fills after a few dozen sizes and then recycles entries, so the heap
per new size falls from ~970 to ~570 KiB), and the heap holds at steps that repeat a size.
HEALTHY (bounded by the number of crop sizes; 84 MiB of coordinate features at the end).

What it does: 6 crops a batch: smooth bicubic colour fields plus 3 soft discs, darkened
towards the crop's corners (vignetting); input = crop + N(0, 0.3), target = the clean crop.
Model: 2-level U-Net (conv3x3 + GroupNorm + SiLU at 24, 48, 96 channels, max pools,
transposed-conv upsampling with skips, 1x1 out) with a residual output. MSE, AdamW(2e-3, wd
1e-4), 450 steps. The batch and the prediction are deleted before rec.step.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Sizes: 42 by step 45, 94 by 112, 117 by 150, 162 by 225, 190 by 300, 200 by 337, 218 by
  405, 225 at 449. New on 50% of steps, on 23% of the last third (35 of 150).
- Coordinate cache: 17.4 MiB at step 50, 42.5 at 150, 63.6 at 250, 75.9 at 350, 84.45 at the
  end.
- Heap: 129.2 MiB at step 0, 184.4 at 45, 222.8 at 112, 239.3 at 150, 264.1 at 225, 281.2 at
  300, 286.2 at 337, 296.7 at 405, 300.9 at 449 (+172 MiB; +14.7 over 337-449).
- Where it rises: steps 1-149 +109.62 MiB at 116 new-size steps (+968 KiB each) vs +0.45 MiB
  at 33 repeat steps; 150-299 +43.59 at 73 (+611 KiB) vs -1.94 at 77; 300-449 +19.45 at 35
  (+569 KiB) vs +0.51 at 115 (+4.5 KiB each). Heap moves of 0.25-0.47 MiB either way at 34
  repeat steps (likely primitives recycled by the full oneDNN cache), summing to about zero.
- RSS: 420.0 MiB at step 0, 666.4 at 45, 846.2 at 112, 962.4 at 225, 1022.6 at 300, 1112.1 at
  405, 1123.5 at 449; by third +399/+77, +112/+14, +44/+57 MiB at new-size/repeat steps.
- Training is fine: loss 0.269 at step 0, 45-step window means 0.078, 0.016, 0.009, 0.007,
  0.006, 0.006, 0.006, 0.005, 0.005, 0.005 (noise variance 0.09); finite throughout. About
  55 s on 2 cores.
"""

import argparse
import ctypes
import math
import random

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, FREQS = 450, 6, 6
SIDES = tuple(range(32, 97, 4))                 # 17 sides -> 289 (height, width) crop sizes
COORD_CH = 4 * FREQS                            # sin/cos of y and x at FREQS frequencies


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


def report(trace, spans=()):
    """Print the measured truths; trace holds (loss, RSS MiB, heap MiB, new shape?) per step,
    optionally a fifth column: the heap once the step's batch and outputs are freed (its
    floor). The rise is split into thirds of the run and into the (first, last) spans given."""
    n = len(trace)
    new = [s for s, t in enumerate(trace) if t[3]]
    q = (n + 3) // 4
    print(f"[shapes] {len(new)} distinct shapes; first seen per quarter of the run: "
          + ", ".join(f"{a}-{min(a + q, n) - 1}: {sum(a <= s < a + q for s in new)}"
                      for a in range(0, n, q))
          + f"; last new shape at step {new[-1]}")
    for s in sorted({0, n // 10, n // 4, n // 3, n // 2, 2 * n // 3, 3 * n // 4, 9 * n // 10,
                     n - 1}):
        loss, rss, heap = trace[s][:3]
        floor = f" (floor {trace[s][4]:.1f})" if len(trace[s]) > 4 else ""
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB{floor} "
              f"(shapes so far {sum(x <= s for x in new)})")
    for a, b in ((1, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n), *spans):
        a = max(a, 1)
        rows = []
        cols = ((2, "heap"), (1, "rss")) + (((4, "heap floor"),) if len(trace[0]) > 4 else ())
        for i, name in cols:
            dn = [trace[s][i] - trace[s - 1][i] for s in range(a, b) if trace[s][3]]
            dr = [trace[s][i] - trace[s - 1][i] for s in range(a, b) if not trace[s][3]]
            rows.append(f"{name} {sum(dn):+.2f} MiB at {len(dn)} new-shape steps "
                        f"({sum(dn) / max(len(dn), 1) * 1024:+.1f} KiB each), "
                        f"{sum(dr):+.2f} MiB at {len(dr)} repeat steps "
                        f"({sum(dr) / max(len(dr), 1) * 1024:+.1f} KiB each)")
        print(f"[rise] steps {a}-{b - 1}: " + "; ".join(rows))
    big = [(s, trace[s][2] - trace[s - 1][2]) for s in range(1, n)
           if not trace[s][3] and abs(trace[s][2] - trace[s - 1][2]) >= 0.25]
    print(f"[repeat] heap moves of 0.25 MiB or more at repeat-shape steps: {len(big)} "
          + ", ".join(f"{s}:{d:+.2f}" for s, d in big[:20]))
    w = max(n // 10, 1)
    print("[loss] window means: " + ", ".join(
        f"{sum(t[0] for t in trace[a:a + w]) / len(trace[a:a + w]):.3f}" for a in range(0, n, w)))


class CoordCache:
    """Fourier coordinate features per crop size (COORD_CH, H, W), built on first use and kept
    (a CoordConv-style input that tells the denoiser where in the crop it is, so it can learn
    the lens vignetting); bounded by the number of crop sizes."""

    def __init__(self):
        self.store = {}

    def get(self, h, w):
        if (h, w) not in self.store:
            ys = torch.linspace(-1, 1, h).view(1, h, 1).expand(1, h, w)
            xs = torch.linspace(-1, 1, w).view(1, 1, w).expand(1, h, w)
            f = (2.0 ** torch.arange(FREQS, dtype=torch.float32) * math.pi).view(-1, 1, 1)
            self.store[(h, w)] = torch.cat([torch.sin(f * ys), torch.cos(f * ys),
                                            torch.sin(f * xs), torch.cos(f * xs)], 0)
        return self.store[(h, w)]

    def nbytes(self):
        return sum(t.numel() * 4 for t in self.store.values())


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class CoordUNet(nn.Module):
    """2-level U-Net (24, 48, 96 channels) on the noisy crop concatenated with its cached
    Fourier coordinate features; predicts the clean crop."""

    def __init__(self):
        super().__init__()
        self.coords = CoordCache()
        self.e1 = conv_block(3 + COORD_CH, 24)
        self.e2 = conv_block(24, 48)
        self.mid = conv_block(48, 96)
        self.u2 = nn.ConvTranspose2d(96, 48, 2, stride=2)
        self.d2 = conv_block(96, 48)
        self.u1 = nn.ConvTranspose2d(48, 24, 2, stride=2)
        self.d1 = conv_block(48, 24)
        self.out = nn.Conv2d(24, 3, 1)

    def forward(self, x):
        b, _, h, w = x.shape
        c = self.coords.get(h, w).unsqueeze(0).expand(b, -1, -1, -1)
        s1 = self.e1(torch.cat([x, c], 1))
        s2 = self.e2(F.max_pool2d(s1, 2))
        m = self.mid(F.max_pool2d(s2, 2))
        y = self.d2(torch.cat([self.u2(m), s2], 1))
        y = self.d1(torch.cat([self.u1(y), s1], 1))
        return x + self.out(y)


def make_batch(h, w, g):
    """Clean crops: smooth colour fields with a few soft discs, darkened towards the corners of
    the crop (vignetting); noisy = clean + N(0, 0.3)."""
    low = torch.randn(BATCH, 3, 5, 5, generator=g)
    clean = 0.5 * F.interpolate(low, size=(h, w), mode="bicubic", align_corners=False)
    yy = torch.linspace(-1, 1, h).view(1, 1, h, 1)
    xx = torch.linspace(-1, 1, w).view(1, 1, 1, w)
    for _ in range(3):
        cy, cx = (torch.rand(2, BATCH, 1, 1, 1, generator=g) * 2 - 1)
        r = 0.15 + 0.3 * torch.rand(BATCH, 1, 1, 1, generator=g)
        col = torch.rand(BATCH, 3, 1, 1, generator=g) * 2 - 1
        clean = clean + col * torch.sigmoid((r - ((yy - cy) ** 2 + (xx - cx) ** 2).sqrt()) * 20)
    clean = clean * (1 - 0.35 * (yy ** 2 + xx ** 2))
    return clean + 0.3 * torch.randn(BATCH, 3, h, w, generator=g), clean


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(41)
    pick = random.Random(43)
    sizes = [(h, w) for h in SIDES for w in SIDES]
    model = CoordUNet()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            h, w = pick.choice(sizes)
            new = (h, w) not in model.coords.store
            noisy, clean = make_batch(h, w, g)
            pred = model(noisy)
            loss = F.mse_loss(pred, clean)
            opt.zero_grad()
            loss.backward()
            opt.step()
            del noisy, clean, pred
            rec.step(loss=loss, height=h, width=w, crop_sizes=len(model.coords.store))
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap, new))
            if step % 50 == 0 or step == STEPS - 1:
                print(f"step {step} {h}x{w} loss {loss.item():.4f} sizes "
                      f"{len(model.coords.store)} coord cache "
                      f"{model.coords.nbytes() / 2 ** 20:.1f} MiB rss {rss:.1f} heap {heap:.1f}",
                      flush=True)
    report(trace)
    print(f"[cache] {len(model.coords.store)} crop sizes, "
          f"{model.coords.nbytes() / 2 ** 20:.2f} MiB of coordinate features")


if __name__ == "__main__":
    main()
