"""Wafer-map defect classifier (small residual CNN) trained with progressive resizing: the
wafer bin maps come at many image sizes (heights and widths from {40, 48, ..., 96} px), and
the largest side admitted grows from 48 to 96 px over steps 0-340, so new (height, width)
pairs keep arriving for most of the run. Each new size makes oneDNN build and cache the
convolution primitives for that input shape (forward, backward-data, backward-weights of 7
convolutions: ~1 MiB of heap a size); a size met again costs nothing. HEALTHY: the heap
grows only with the number of distinct sizes (at most 64, and oneDNN's primitive cache is an
LRU of 1024 entries), it is not a leak.

What it does: batches of 8 single-channel wafer maps of h x w (a disc of passing dies with
random failing dies and one defect signature: none, scratch line, edge ring, centre blob,
off-centre cluster; 5 classes); each step draws h and w independently from the sides
admitted so far. Model: conv 1->16 + BN + ReLU, two residual blocks (16->32, 32->48, stride
2, 1x1 projection skips), global average and max pooling concatenated, linear 96->5. AdamW
(2e-3, wd 1e-4), 450 steps, one thread. The model is called directly on tensors built in
the loop; nothing but the loss goes to the recorder.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step; "floor" = the heap
once the step's batch, logits and loss are freed):
- Sizes: 60 distinct (h, w) by the end, first met 9 / 15 / 19 / 17 times in the four
  quarters; the last new one at step 440.
- Heap: 126.8 MiB at step 0, 134.3 at 75, 142.7 at 150, 151.1 at 225, 163.2 at 300, 167.8
  at 375, 169.3 at 449 (+42.5 MiB).
- Where it rises (floor): steps 1-149 +15.54 MiB at 15 new-size steps (1061 KiB each) vs
  +0.35 MiB over 134 repeat steps (2.7 KiB each); 150-299 +19.71 at 23 (878 KiB) vs +0.27
  over 127 (2.2 KiB); 300-449 +6.64 at 21 (324 KiB) vs 0.00 over 129. The last third rises
  less because oneDNN's primitive cache (1024 entries) is full by then and evicts: rerun
  with ONEDNN_PRIMITIVE_CACHE_CAPACITY=8192 it reads +21.44 MiB at the 21 new sizes (1046
  KiB each) and 188.7 MiB at step 449, repeat steps still ~0.
- Not a leak: extended to 900 steps (all 64 sizes met by step 550), the floor goes from
  170.55 MiB at step 560 to 170.42 at 899 (-0.13 MiB); steps 450-899 add -0.02 MiB over
  446 repeat steps (+1.24 MiB at the 4 new sizes). RSS 856.6 MiB at step 450, 858.5 at 899.
- RSS: 411 MiB at step 0, 494 at 150, 648 at 300, 825 at 449. It also rises at repeat
  steps (+41 / +67 / +130 MiB by third) as larger images are admitted (allocator pages kept
  for the larger activations), and stops once the largest size is reached (see above).
- Training is fine: loss 2.84 at step 0, 45-step window means 0.85, 0.31, 0.27, 0.22, 0.16,
  0.24, 0.19, 0.19, 0.21, 0.24 (batches vary in size and class mix); finite throughout.
  About 19 s on 2 cores.
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

STEPS, BATCH, CLASSES = 450, 8, 5
SIDES = tuple(range(40, 97, 8))          # image heights and widths the fab's scanners produce
GROW_UNTIL = 340                          # progressive resizing: the largest side allowed
                                          # grows from 48 to 96 px over steps 0-340

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


def wafer_maps(h, w, g):
    """BATCH wafer bin maps of h x w: a disc of passing dies (0.5) with random failing dies,
    and one defect signature per map: none, a scratch (thin line), an edge ring, a centre blob
    or an off-centre cluster."""
    y = torch.linspace(-1, 1, h).view(1, h, 1)
    x = torch.linspace(-1, 1, w).view(1, 1, w)
    r = torch.sqrt(x ** 2 + y ** 2)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    u = torch.rand(BATCH, 6, generator=g).view(BATCH, 6, 1, 1)
    ang = u[:, 0] * math.pi
    d_line = (x * torch.sin(ang) - y * torch.cos(ang) - (u[:, 1] - 0.5)).abs()
    along = x * torch.cos(ang) + y * torch.sin(ang)
    sig = torch.stack([
        torch.zeros(BATCH, h, w),
        ((d_line < 0.06) & (along.abs() < 0.3 + 0.5 * u[:, 2])).float(),
        ((r > 0.78 - 0.1 * u[:, 3]) & (r < 0.92)).float(),
        (r < 0.2 + 0.15 * u[:, 4]).float(),
        (((x - 0.5 * (u[:, 2] - 0.5) * 2) ** 2 + (y - (u[:, 3] - 0.5)) ** 2) < 0.04).float(),
    ], 1)[torch.arange(BATCH), labels]
    disc = (r < 0.95).float()
    fails = (torch.rand(BATCH, h, w, generator=g) < 0.04).float()
    fails = torch.maximum(fails, sig * (torch.rand(BATCH, h, w, generator=g) < 0.85).float())
    img = disc * (0.5 + 0.5 * fails) + 0.05 * torch.randn(BATCH, h, w, generator=g)
    return img.unsqueeze(1), labels


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.skip(x))


class WaferNet(nn.Module):
    """Stem conv, two strided residual stages (16 -> 32 -> 48 channels), global average and
    max pooling concatenated, linear head. Fully convolutional up to the pooling, so any
    image size goes through."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.stage1 = Block(16, 32, 2)
        self.stage2 = Block(32, 48, 2)
        self.head = nn.Linear(96, CLASSES)

    def forward(self, x):
        h = self.stage2(self.stage1(self.stem(x)))
        return self.head(torch.cat([h.mean((2, 3)), h.amax((2, 3))], 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    pick = random.Random(11)
    model = WaferNet()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    seen, rows = set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            largest = 48 + 48 * min(1.0, step / GROW_UNTIL)
            allowed = [s for s in SIDES if s <= largest]
            h, w = pick.choice(allowed), pick.choice(allowed)
            new = (h, w) not in seen
            seen.add((h, w))
            x, y = wafer_maps(h, w, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            heap, rss = heap_mib(), rss_mib()
            lv = loss.item()
            del x, y, logits, loss
            rows.append((new, heap, rss, lv, heap_mib()))
            if step % 50 == 0:
                print(f"step {step} size {h}x{w} loss {lv:.3f} sizes {len(seen)} "
                      f"heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(STEPS // 3, 2 * STEPS // 3, STEPS))


if __name__ == "__main__":
    main()
