"""Bearing-fault classifier (3-block 2-D CNN over vibration spectrograms) trained with
gradient accumulation: 3 micro-batches per optimizer step, each of recordings of its own
length T (frames, multiples of 8, 48 up to a limit that grows from 96 to 480 over steps
0-340) and as many recordings as fit a budget of 1024 frames (B = max(2, 1024 // T)). So
the micro-batches of one step have different shapes, and new (B, T) shapes keep arriving
until the limit stops growing. Each new shape makes oneDNN build and cache the conv
primitives for it (~390 KiB of heap); repeats add nothing. HEALTHY: 55 possible shapes, the
per-shape cache is bounded; it is not a leak. rec.step is called once per optimizer step
with the summed micro-batch loss.

What it does: log-power spectrograms (40 bins x T frames) of 4 classes (healthy noise,
outer-race fault: harmonic lines with periodic impacts, inner-race: lines modulated at the
shaft rate, imbalance: a strong low line) in heavy noise. Model: conv 1->16, 16->32, 32->48
(3x3, BN, ReLU; 2x2 max pool after the first two), mean over time, max over frequency,
linear 48->4. SGD (0.03, Nesterov momentum 0.9), grad-norm clip 2.0, 400 optimizer steps,
one thread. The model is called directly on tensors built in the loop.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step, when the micro-
batches are already freed):
- Shapes: 55 distinct (B, T); 52 optimizer steps met at least one new shape, 16 / 14 / 13 /
  9 in the four quarters; the last at step 366.
- Heap: 125.5 MiB at step 0, 131.0 at 66, 134.4 at 133, 137.9 at 200, 140.5 at 266, 144.2
  at 333, 145.5 at 399 (+20 MiB).
- Where it rises: steps 1-132 +8.49 MiB at 21 steps meeting 22 new shapes (395 KiB a
  shape) vs -0.01 MiB over 111 repeat steps; 133-265 +6.18 at 16 steps / 17 shapes (372 KiB
  a shape) vs +0.27 over 117 (2.4 KiB a step); 266-399 +5.06 at 14 steps / 14 shapes (370
  KiB) vs +0.00 over 120.
- Not a leak: heap 145.52 MiB at step 376, 145.53 at 399; extended to 800 steps (no new
  shape after 366) steps 400-799 add +0.07 MiB, heap 145.59 MiB at 799, RSS 514.5 MiB at
  step 400 and 515.9 at 799.
- RSS of this run: 417 MiB at step 0, 478 at 133, 489 at 266, 492 at 399.
- Training is fine: loss 1.62 at step 0, 40-step window means 0.54, 0.24, 0.14, 0.11, 0.08,
  0.07, 0.07, 0.04, 0.09, 0.09; finite throughout. About 26 s on 2 cores.
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

STEPS, ACCUM, BUDGET, CLASSES, FREQ = 400, 3, 1024, 4, 40
MIN_T, START_T, END_T, GROW_UNTIL = 48, 96, 480, 340   # frames per recording (multiples of 8)

# ---- memory measurement (measuring only; the recorder does not see any of this) ----------
class _MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]


try:
    _MI2 = ctypes.CDLL(None).mallinfo2
    _MI2.restype = _MallInfo2
except (OSError, AttributeError):     # not glibc: heap numbers read nan
    _MI2 = None
_ME = psutil.Process()


def heap_mib():
    """Live malloc heap (glibc mallinfo2: uordblks + hblkhd), MiB."""
    if _MI2 is None:
        return float("nan")
    m = _MI2()
    return (m.uordblks + m.hblkhd) / 2 ** 20


def rss_mib():
    return _ME.memory_info().rss / 2 ** 20


def tell(rows, cuts):
    """Print what the run did to memory. rows: one (new_shape, heap_at_step_end, rss, loss,
    heap_floor) per optimizer step; the heap rise is split into the spans between cuts and,
    in each, into steps that met a new shape and steps that only repeated known ones."""
    n = len(rows)
    first = [s for s, r in enumerate(rows) if r[0]]
    print(f"[shapes] {sum(int(r[0]) for r in rows)} distinct shapes; {len(first)} optimizer "
          f"steps met a new one, the last at step {first[-1]}; "
          "per quarter: " + ", ".join(str(sum(a <= s < a + (n + 3) // 4 for s in first))
                                     for a in range(0, n, (n + 3) // 4)))
    for s in sorted({0, n // 6, n // 3, n // 2, 2 * n // 3, 5 * n // 6, n - 1}):
        _, heap, rss, loss, floor = rows[s]
        print(f"[mem] step {s}: heap {heap:.2f} MiB (floor {floor:.2f}) rss {rss:.1f} MiB "
              f"loss {loss:.4f} new-shape steps so far {sum(x <= s for x in first)}")
    edges = sorted({1, *cuts, n})
    for i in range(len(edges) - 1):
        a, b = edges[i], edges[i + 1]
        out = [f"{sum(int(rows[s][0]) for s in range(a, b))} new shapes"]
        for col, name in ((4, "floor"), (1, "heap"), (2, "rss")):
            d_new = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if rows[s][0]]
            d_rep = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if not rows[s][0]]
            out.append(f"{name} {sum(d_new):+.2f} MiB over {len(d_new)} new "
                       f"({1024 * sum(d_new) / max(len(d_new), 1):+.0f} KiB each) / "
                       f"{sum(d_rep):+.2f} over {len(d_rep)} repeat "
                       f"({1024 * sum(d_rep) / max(len(d_rep), 1):+.1f} KiB each)")
        print(f"[rise] steps {a}-{b - 1}: " + "; ".join(out))
    if first[-1] < n - 20:
        a = first[-1] + 10
        print(f"[after last new shape] floor {rows[a][4]:.2f} MiB at step {a} -> "
              f"{rows[-1][4]:.2f} at {n - 1} ({(rows[-1][4] - rows[a][4]) * 1024:+.0f} KiB)")
    w = max(n // 10, 1)
    print("[loss] window means: " + ", ".join(
        f"{sum(r[3] for r in rows[a:a + w]) / len(rows[a:a + w]):.3f}" for a in range(0, n, w)))


def spectrograms(b, t, g):
    """b log-power spectrograms (FREQ bins x t frames) of bearing vibration: 0 healthy
    (broadband), 1 outer-race fault (harmonic lines with periodic impacts), 2 inner-race
    fault (lines amplitude-modulated at shaft rate), 3 imbalance (strong low line)."""
    y = torch.randint(0, CLASSES, (b,), generator=g)
    f = torch.arange(FREQ).view(1, FREQ, 1).float()
    tt = torch.arange(t).view(1, 1, t).float()
    base = (2 + 4 * torch.rand(b, 1, 1, generator=g))
    period = 6 + 10 * torch.rand(b, 1, 1, generator=g)
    harm = sum(torch.exp(-((f - k * base) ** 2) / 0.8) for k in range(1, 6))
    impacts = (torch.remainder(tt, period) < 1.5).float()
    shaft = 0.5 + 0.5 * torch.sin(2 * math.pi * tt / period)
    low = torch.exp(-((f - 1.5) ** 2) / 1.0) * torch.ones_like(tt)
    sig = torch.stack([torch.zeros(b, FREQ, t), harm * (0.2 + 0.3 * impacts), 0.5 * harm * shaft,
                       0.6 * low.expand(b, FREQ, t)], 1)[torch.arange(b), y]
    x = sig + 1.2 * torch.rand(b, FREQ, t, generator=g)
    return torch.log1p(2 * x).unsqueeze(1), y


class BearingCNN(nn.Module):
    """Three conv blocks (16 / 32 / 48 channels, 3x3, BN, ReLU; 2x2 max pooling after the
    first two) over (freq, time), then mean over time and max over frequency, linear head."""

    def __init__(self):
        super().__init__()
        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                    nn.ReLU()]
        self.body = nn.Sequential(*block(1, 16), nn.MaxPool2d(2), *block(16, 32),
                                  nn.MaxPool2d(2), *block(32, 48))
        self.head = nn.Linear(48, CLASSES)

    def forward(self, x):
        return self.head(self.body(x).mean(3).amax(2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(6)
    pick = random.Random(13)
    model = BearingCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, nesterov=True)
    seen, rows = set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            # ACCUM micro-batches per optimizer step, each of recordings of one length (its
            # own draw) with as many recordings as fit in a budget of BUDGET frames; the
            # longest recording admitted grows from 96 to 480 frames (curriculum)
            top = START_T + int((END_T - START_T) * min(1.0, step / GROW_UNTIL))
            opt.zero_grad()
            total, new = 0.0, 0
            for _ in range(ACCUM):
                t = 8 * pick.randint(MIN_T // 8, top // 8)
                b = max(2, BUDGET // t)
                new += (b, t) not in seen
                seen.add((b, t))
                x, y = spectrograms(b, t, g)
                loss = F.cross_entropy(model(x), y) / ACCUM
                loss.backward()
                total = total + loss.detach()
                del x, y, loss
            torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            opt.step()
            rec.step(loss=total)
            heap, rss = heap_mib(), rss_mib()
            lv = float(total)
            rows.append((new, heap, rss, lv, heap))
            if step % 50 == 0:
                print(f"step {step} last micro-batch {b}x{t} loss {lv:.3f} shapes {len(seen)} "
                      f"heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(STEPS // 3, 2 * STEPS // 3, STEPS))


if __name__ == "__main__":
    main()
