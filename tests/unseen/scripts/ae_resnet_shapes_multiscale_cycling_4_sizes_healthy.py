"""Shape classifier (small ResNet with global average pooling) trained at multiple scales:
the image size cycles 32 -> 48 -> 64 -> 80 -> 32 ... from one step to the next. Each size
is a new input shape on its first step (steps 0-3), when oneDNN builds and caches the
convolutions' kernels for it (~1.2 MiB of heap each); after that the four shapes only
repeat. HEALTHY: bounded, one-off per-size growth; nothing is kept from step to step.

What it does: RGB images with one filled shape (disc, square, triangle, cross, ring: the
class) of random size, position and colour on a noisy background; batches of 16 images of
one size. Model: stem conv 3->16 stride 2 + BN + ReLU, residual blocks 16->16,
16->32 (stride 2), 32->48 (stride 2), global average pool, linear 48->5. SGD(0.05,
momentum 0.9, wd 5e-4), 400 steps, one thread; called directly.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, read after each step once the
step's batch and loss are dropped):
- Heap: 126.8 MiB at step 0, +3.44 MiB at the three new-size steps 1-3 (1174 KiB each);
  then 130.5 at 80, 130.6 at 160, 130.8 at 240, 131.0 at 320, 131.0 at 399 (steps 4-79
  +0.24 MiB, then +0.17, +0.16, +0.19, +0.05 MiB per 80 steps: 0.7-2.4 KiB a step).
- RSS: 404 MiB at step 0, 456 at 80, 458.6 at 160, 458.8 at 399 (RSS +38 MiB at steps 1-3).
- Training works: loss 1.66 at step 0 (chance 1.61), 40-step window means 1.57, 1.05, 0.77,
  0.53, 0.34, 0.24, 0.14, 0.13, 0.09, 0.04 (maxima 2.15 in the first window, <= 1.65
  after); finite throughout. About 12 s on 2 cores.
"""

import argparse
import ctypes
import os
import random

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [], "forbidden": ["memory_leak"]}

STEPS, BATCH, CLASSES = 400, 16, 5
SIZES = [32, 48, 64, 80]        # the image size cycles 32 -> 48 -> 64 -> 80 -> 32 ... step by step

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
    """BATCH RGB images side x side, one filled shape each (0 disc, 1 square, 2 triangle,
    3 cross, 4 ring) of random size, position and colour on a noisy random background."""
    c = torch.linspace(-1, 1, side)
    yy, xx = torch.meshgrid(c, c, indexing="ij")
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    imgs = 0.15 * torch.randn(BATCH, 3, side, side, generator=g) + torch.rand(
        BATCH, 3, 1, 1, generator=g) * 0.5
    for i, k in enumerate(labels.tolist()):
        cy, cx = (torch.rand(2, generator=g) * 0.8 - 0.4).tolist()
        s = float(torch.rand(1, generator=g)) * 0.25 + 0.3
        dy, dx = (yy - cy) / s, (xx - cx) / s
        if k == 0:
            m = dy ** 2 + dx ** 2 < 1
        elif k == 1:
            m = (dy.abs() < 0.85) & (dx.abs() < 0.85)
        elif k == 2:
            m = (dy < 0.8) & (dy > 2 * dx.abs() - 1.0)
        elif k == 3:
            m = ((dy.abs() < 0.3) & (dx.abs() < 1)) | ((dx.abs() < 0.3) & (dy.abs() < 1))
        else:
            m = ((dy ** 2 + dx ** 2) < 1) & ((dy ** 2 + dx ** 2) > 0.4)
        colour = torch.rand(3, 1, 1, generator=g) + 0.5
        imgs[i] = torch.where(m, colour, imgs[i])
    return imgs, labels


class Res(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Identity() if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout)))

    def forward(self, x):
        return F.relu(self.skip(x) + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class SmallResNet(nn.Module):
    """Stem conv 3 -> 16 (stride 2), residual blocks 16 -> 16, 16 -> 32 (stride 2),
    32 -> 48 (stride 2), global average pool (so any image size works), linear 48 -> 5."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.blocks = nn.Sequential(Res(16, 16, 1), Res(16, 32, 2), Res(32, 48, 2))
        self.head = nn.Linear(48, CLASSES)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(6)
    model = SmallResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    seen, ledger = set(), Ledger()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(args.steps):
            side = SIZES[step % len(SIZES)]
            new = side not in seen
            seen.add(side)
            imgs, labels = make_batch(g, side)
            loss = F.cross_entropy(model(imgs), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            lv = loss.item()
            del imgs, labels, loss
            ledger.add(new, 0, lv)
            if step % 40 == 0:
                print(f"step {step} side {side} loss {lv:.3f} heap {heap_mib():.1f} MiB",
                      flush=True)
    ledger.report(cuts=[80 * i for i in range(1, args.steps // 80 + 1)])
    rows = ledger.rows
    print("[every 80 steps] heap " + ", ".join(
        f"{rows[a][1]:.2f}" for a in range(0, len(rows), 80)) + " MiB; rss "
        + ", ".join(f"{rows[a][2]:.1f}" for a in range(0, len(rows), 80)) + " MiB")
    per_size = {s: [rows[i][1] for i in range(len(rows)) if SIZES[i % len(SIZES)] == s]
                for s in SIZES}
    print("[per size] heap after the 2nd and the last step of each size: " + ", ".join(
        f"{s}: {v[1]:.2f} -> {v[-1]:.2f}" for s, v in per_size.items()))


if __name__ == "__main__":
    main()
