"""Blob segmentation with a small coordinate-aware U-Net under progressive multi-scale
training, with a SLOW real leak from step 0 hidden among big shape-driven jumps: a
training-progress "video" keeps a 64 x 64 thumbnail of three predicted masks every step
(3 x 64 x 64 floats = 48 KiB a step, never cleared), while each new image size adds 2-16
MiB at once (a per-size cache of coordinate features plus the size's conv kernels).
LEAK from step 0.

What it does: grey images of 1-4 bright ellipses on a textured noisy background, target =
the ellipse mask; batches of 4 square images of one size. The sizes 32, 48, 64, 80, 96,
112, 128, 144 are introduced one by one: size i is used for the first time at step 55 i
(0, 55, ..., 385) and from then on each step draws uniformly among the sizes introduced so
far. Model: conv 1->8 (3x3) + GELU; conv 8->16 stride 2, conv 16->16, upsampled back;
48 Fourier coordinate channels -> 1x1 conv -> 8; decoder conv 32->8 + GELU, 1x1 conv 8->1;
BCE with logits. The coordinate features depend only on the size, so the model builds them
once per size and keeps them already expanded to the batch (4 x 48 x H x W floats: 0.75 MiB
at 32, 15.2 MiB at 144; 53.3 MiB for all 8): healthy, bounded growth. Adam(3e-3), 480
steps, one thread; called directly.

What grows: the thumbnail list, 48 KiB every step from step 0; the coordinate cache and
the per-size conv kernels at the 7 introduction steps (55, 110, ..., 385).

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, read after each step once the
step's batch, logits and loss are dropped):
- Heap jumps at the introduction steps: +2.37 MiB at 55 (size 48), +3.69 at 110, +5.38 at
  165, +7.44 at 220, +9.88 at 275, +12.69 at 330, +15.88 at 385 (144): +57.3 MiB in all.
- Between them the heap rises 48.9-53.0 KiB a step in every span (steps 1-54: +2.79 MiB;
  55-109, 110-164, ..., 330-384: +2.58 to +2.63 MiB over 54 steps each; 386-479: +4.53 MiB
  over 94 steps, 49.4 KiB a step): the thumbnails, 22.50 MiB at the end (480 x 48.0 KiB).
- Heap: 126.4 MiB at step 0, 132.8 at 80, 140.3 at 160, 156.9 at 240, 170.6 at 320, 202.9
  at 400, 206.7 at 479.
- RSS: 403 MiB at step 0, 421 at 80, 436 at 160, 472 at 240, 498 at 320, 560 at 400, 562 at
  479 (it jumps +6 to +41 MiB at the introduction steps; by how much varies from run to
  run, the heap figures do not).
- Training works: loss 0.73 at step 0, 48-step window means 0.19, 0.041, 0.025, 0.015,
  0.012, 0.011, 0.009, 0.007, 0.007, 0.008 (maxima <= 0.094 after step 48); finite
  throughout. About 12 s on 2 cores.
"""

import argparse
import ctypes
import math
import os
import random

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 0, "tolerance": 24}]}

STEPS, BATCH = 480, 4
SIZES = [32, 48, 64, 80, 96, 112, 128, 144]   # image side lengths, introduced one by one
INTRODUCE_EVERY = 55                          # size i is first used at step 55 * i
COORD_CH = 48                                 # Fourier coordinate channels
THUMB = 64                                    # progress-video frames are 64 x 64

# ---- memory measurement (only for the numbers in the docstring; the recorder reads its own) --
class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):            # not glibc: heap figures read nan
    _mallinfo2 = None
_PAGE = os.sysconf("SC_PAGE_SIZE")


def heap_mib():
    """Bytes malloc has handed out and not got back (mallinfo2 uordblks + hblkhd), MiB."""
    if _mallinfo2 is None:
        return float("nan")
    m = _mallinfo2()
    return (m.uordblks + m.hblkhd) / 2 ** 20


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 2 ** 20


class Ledger:
    """One row per optimizer step, taken after the step's own tensors are dropped:
    (met a new input shape, heap MiB, RSS MiB, bytes held by the suspect container MiB, loss)."""

    def __init__(self):
        self.rows = []

    def add(self, new_shape, held_bytes, loss):
        self.rows.append((bool(new_shape), heap_mib(), rss_mib(), held_bytes / 2 ** 20, loss))

    def report(self, cuts):
        rows, n = self.rows, len(self.rows)
        first = [s for s, r in enumerate(rows) if r[0]]
        q = (n + 3) // 4
        print(f"[shapes] {len(first)} steps met a new input shape, the last at step "
              f"{first[-1] if first else None}; by quarter: "
              + ", ".join(str(sum(a <= s < a + q for s in first)) for a in range(0, n, q)))
        for s in sorted({0, n // 6, n // 3, n // 2, 2 * n // 3, 5 * n // 6, n - 1}):
            _, heap, rss, held, loss = rows[s]
            print(f"[mem] step {s}: heap {heap:.2f} MiB  rss {rss:.1f} MiB  held {held:.2f} MiB  "
                  f"loss {loss:.4f}")
        edges = sorted({1, *cuts, n})
        for i in range(len(edges) - 1):
            a, b = edges[i], edges[i + 1]
            parts = []
            for col, name in ((1, "heap"), (2, "rss"), (3, "held")):
                dn = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if rows[s][0]]
                dr = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if not rows[s][0]]
                parts.append(f"{name} {sum(dn):+.2f} MiB at {len(dn)} new-shape steps "
                             f"({1024 * sum(dn) / max(len(dn), 1):+.0f} KiB each), "
                             f"{sum(dr):+.2f} at {len(dr)} repeat steps "
                             f"({1024 * sum(dr) / max(len(dr), 1):+.1f} KiB each)")
            print(f"[rise] steps {a}-{b - 1}: " + "; ".join(parts))
        w = max(n // 10, 1)
        print("[loss] window means: " + ", ".join(
            f"{sum(r[4] for r in rows[a:a + w]) / len(rows[a:a + w]):.3f}"
            for a in range(0, n, w)) + "; window maxima: " + ", ".join(
            f"{max(r[4] for r in rows[a:a + w]):.3f}" for a in range(0, n, w)))

def make_batch(g, side):
    """BATCH grey images side x side with 1-4 bright ellipses on a textured background;
    target = ellipse mask. Brighter ellipses sit nearer the centre (so coordinates help)."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, side), torch.linspace(-1, 1, side),
                            indexing="ij")
    img = 0.3 * torch.randn(BATCH, 1, side, side, generator=g)
    img = img + 0.2 * torch.sin(6 * xx + 3 * torch.rand(1, generator=g)) * torch.rand(
        BATCH, 1, 1, 1, generator=g)
    mask = torch.zeros(BATCH, 1, side, side)
    for b in range(BATCH):
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            cy, cx = (torch.rand(2, generator=g) * 1.6 - 0.8).tolist()
            ry, rx = (torch.rand(2, generator=g) * 0.25 + 0.1).tolist()
            m = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) < 1
            mask[b, 0] = torch.maximum(mask[b, 0], m.float())
            img[b, 0] += m.float() * (1.2 - 0.5 * math.hypot(cy, cx))
    return img, mask


class CoordUNet(nn.Module):
    """Small U-Net (8 -> 16 -> 16 -> 8 channels, one downsampling) whose decoder also sees
    COORD_CH Fourier features of the pixel coordinates through a 1x1 conv. The coordinate
    features depend only on the image size: built once per size and kept, already expanded
    to the batch (BATCH x COORD_CH x H x W floats)."""

    def __init__(self):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.GELU())
        self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.GELU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.GELU())
        self.coord = nn.Conv2d(COORD_CH, 8, 1)
        self.dec = nn.Sequential(nn.Conv2d(16 + 8 + 8, 8, 3, padding=1), nn.GELU(),
                                 nn.Conv2d(8, 1, 1))
        self.freqs = torch.exp(torch.linspace(0, math.log(32), COORD_CH // 4))
        self.coord_cache = {}

    def coords(self, side):
        if side not in self.coord_cache:
            c = torch.linspace(-1, 1, side)
            yy, xx = torch.meshgrid(c, c, indexing="ij")
            f = self.freqs.view(-1, 1, 1)
            feats = torch.cat([torch.sin(f * yy), torch.cos(f * yy),
                               torch.sin(f * xx), torch.cos(f * xx)], 0)
            self.coord_cache[side] = feats.unsqueeze(0).expand(BATCH, -1, -1, -1).contiguous()
        return self.coord_cache[side]

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = F.interpolate(self.enc2(e1), size=x.shape[-2:], mode="bilinear",
                           align_corners=False)
        c = self.coord(self.coords(x.shape[-1]))
        return self.dec(torch.cat([e1, e2, c], 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    r, g = random.Random(5), torch.Generator().manual_seed(5)
    model = CoordUNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    video_frames = []        # thumbnails of predictions for a training-progress video
    ledger = Ledger()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(args.steps):
            available = SIZES[: min(len(SIZES), step // INTRODUCE_EVERY + 1)]
            # a size is used on the step it is introduced, then drawn at random with the others
            side = available[-1] if step % INTRODUCE_EVERY == 0 else r.choice(available)
            new = side not in model.coord_cache
            img, mask = make_batch(g, side)
            logits = model(img)
            loss = F.binary_cross_entropy_with_logits(logits, mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # THE BUG: the video was meant to take a frame every 25 steps; every step's
            # thumbnails of three predictions (3 x 64 x 64 floats, 48 KiB) are kept
            video_frames.append(F.interpolate(torch.sigmoid(logits[:3].detach()),
                                              size=(THUMB, THUMB), mode="bilinear",
                                              align_corners=False))
            rec.step(loss=loss)
            lv = loss.item()
            del img, mask, logits, loss
            ledger.add(new, sum(t.numel() * 4 for t in video_frames), lv)
            if step % 60 == 0:
                print(f"step {step} side {side} loss {lv:.3f} sizes {len(model.coord_cache)} "
                      f"heap {heap_mib():.1f} MiB", flush=True)
    ledger.report(cuts=[INTRODUCE_EVERY * i for i in range(1, len(SIZES))])
    cache = {s: t.numel() * 4 / 2 ** 20 for s, t in model.coord_cache.items()}
    held = sum(t.numel() * 4 for t in video_frames)
    print("[cache] coordinate features per size (MiB): "
          + ", ".join(f"{s}: {m:.2f}" for s, m in cache.items())
          + f"; total {sum(cache.values()):.2f}")
    print(f"[held] video frames: {len(video_frames)}, {held / 2 ** 20:.2f} MiB, "
          f"{held / len(video_frames) / 1024:.1f} KiB a step")
    rows = ledger.rows
    for i, s in enumerate(SIZES):
        a = INTRODUCE_EVERY * i
        if 0 < a < len(rows):
            print(f"[jump] step {a} (size {s}): heap {rows[a][1] - rows[a - 1][1]:+.2f} MiB, "
                  f"rss {rows[a][2] - rows[a - 1][2]:+.2f} MiB")


if __name__ == "__main__":
    main()
