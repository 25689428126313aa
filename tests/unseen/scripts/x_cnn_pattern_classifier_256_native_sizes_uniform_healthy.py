"""Pattern-classification CNN fed whole images at their own size: each batch has one (height,
width) drawn uniformly from 256 sizes (16 x 16 sides, 32..92 pixels), so new sizes keep
arriving for the whole run at a slowly falling rate (97, 61, 37 and 22 first sightings in
the four quarters; 217 sizes by the end, the last new one at step 493). Each new size makes
oneDNN build and cache the primitives of the one convolution that runs at the image's size
(forward and backward-weights, plus their reorders; well under the 1024-entry caches), so
the heap steps up by ~80-100 KiB at every step with a new size and holds at steps that repeat
one. HEALTHY (per-shape caches bounded by the number of sizes, not a leak).

What it does: 5 classes (horizontal, vertical and diagonal stripes, a checkerboard, rings)
with random period 4-12 pixels, phase, centre and colour, plus N(0, 0.8) noise; 12 images a
batch, 3 channels. Model: Conv 3->32 (5x5, stride 2) at the image's size -> BN -> ReLU ->
adaptive average pool to 12 x 12 -> Conv 32->64 -> BN -> ReLU -> Conv 64->64 (stride 2) ->
BN -> ReLU -> Conv 64->64 -> ReLU -> global average pool -> Linear 64->5. AdamW(2e-3,
wd 0.01), 500 steps. The step's batch and logits are still alive when rec.step samples memory
(they are freed afterwards only to measure the floor).

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step; "floor" = the heap
once that step's batch, logits and loss are freed, measured after rec.step):
- Sizes: 1 at step 0, 46 by 50, 98 by 125, 159 by 250, 183 by 333, 209 by 450, 217 at 499.
  New sizes on 43% of steps overall; on 20% of the steps of the last third (34 of 167).
- Heap: 127.4 MiB at step 0, 131.4 at 50, 135.1 at 125, 140.5 at 250, 142.2 at 333, 144.2 at
  450, 145.0 at 499 (+17.6 MiB, still rising in the last third: +2.8 MiB over 333-499).
- Where it rises (floor): steps 1-165 +9.83 MiB at 120 new-size steps (+84 KiB each) vs +0.13
  MiB at 45 repeat steps (+3 KiB each); 166-332 +4.98 MiB at 62 new-size steps (+82 KiB) vs
  +0.22 at 105 repeats (+2 KiB); 333-499 +2.73 MiB at 34 new-size steps (+82 KiB) vs +0.14
  at 133 repeats (+1 KiB).
- The heap at the step's end (what the recorder reads) also carries the live batch, whose
  size follows the image size: it moves by 0.25-0.6 MiB either way at 132 repeat steps, and
  by third reads +9.95/-0.53, +6.18/-0.40, +5.25/-2.86 MiB (new-size/repeat steps).
- RSS: 410.9 MiB at step 0, 446.3 at 50, 477.5 at 125, 503.9 at 250, 506.4 at 333, 519.1 at
  450, 527.4 at 499; by third +57/+14, +4/+20, +1/+20 MiB at new-size/repeat steps (the
  allocator's pages, not the heap in use).
- Training is fine: loss 1.57 at step 0 (ln 5 = 1.61), 50-step window means 0.53, 0.20,
  0.12, 0.05, 0.10, 0.17, 0.24, 0.07, 0.06, 0.05; accuracy 1.00 on most late batches; finite
  throughout. About 11 s on 2 cores.
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

STEPS, BATCH, CLASSES = 500, 12, 5
SIDES = tuple(range(32, 93, 4))                 # 16 sides -> 256 (height, width) sizes


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


def make_batch(h, w, g):
    """BATCH images of size (h, w), 3 channels: stripes (horizontal, vertical, diagonal),
    a checkerboard or concentric rings, with random period, phase, centre and colour."""
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    yy = torch.arange(h, dtype=torch.float32).view(1, h, 1)
    xx = torch.arange(w, dtype=torch.float32).view(1, 1, w)
    k = (2 * math.pi / (4 + 8 * torch.rand(BATCH, 1, 1, generator=g)))
    ph = 2 * math.pi * torch.rand(BATCH, 1, 1, generator=g)
    cy = h * torch.rand(BATCH, 1, 1, generator=g)
    cx = w * torch.rand(BATCH, 1, 1, generator=g)
    pats = torch.stack([
        torch.sin(k * yy + ph).expand(BATCH, h, w),
        torch.sin(k * xx + ph).expand(BATCH, h, w),
        torch.sin(k * (xx + yy) / math.sqrt(2) + ph),
        torch.sign(torch.sin(k * xx + ph) * torch.sin(k * yy + ph)),
        torch.sin(k * torch.sqrt((yy - cy) ** 2 + (xx - cx) ** 2) + ph),
    ], 1)                                                         # (B, 5, h, w)
    img = pats[torch.arange(BATCH), labels]                       # (B, h, w)
    colour = 0.5 + torch.rand(BATCH, 3, 1, 1, generator=g)
    x = colour * img.unsqueeze(1) + 0.8 * torch.randn(BATCH, 3, h, w, generator=g)
    return x, labels


class PatternCNN(nn.Module):
    """One strided convolution at the image's own size, then an adaptive pool to 12 x 12 and
    three convolutions at that fixed size."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 5, stride=2, padding=2), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(12))
        self.body = nn.Sequential(
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES))

    def forward(self, x):
        return self.body(self.stem(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(7)
    pick = random.Random(11)
    sizes = [(h, w) for h in SIDES for w in SIDES]
    model = PatternCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    seen, trace = set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            h, w = pick.choice(sizes)
            new = (h, w) not in seen
            seen.add((h, w))
            x, y = make_batch(h, w, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean().item()
            rec.step(loss=loss, acc=acc, height=h, width=w)
            rss, heap = memory_mib()              # what the recorder sees at the step's end
            lv = loss.item()
            del x, logits, loss                   # measuring only: the step's floor
            trace.append((lv, rss, heap, new, memory_mib()[1]))
            if step % 50 == 0 or step == STEPS - 1:
                print(f"step {step} {h}x{w} loss {lv:.4f} acc {acc:.2f} "
                      f"sizes {len(seen)} rss {rss:.1f} heap {heap:.1f}", flush=True)
    report(trace)


if __name__ == "__main__":
    main()
