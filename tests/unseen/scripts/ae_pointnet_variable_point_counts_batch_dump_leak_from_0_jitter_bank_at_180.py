"""PointNet shape classifier on point clouds of varying size, with a steady real leak from
step 0 AND a one-off 12 MiB allocation at step 180: a "reproduce a bad step later" dump
appends every step's input batch (16 x n x 3 floats + labels, ~54 KiB a step on average)
to a list that is never cleared; at step 180 jitter augmentation is switched on and
pre-draws a bank of 2^20 jitter vectors (12 MiB), kept and reused for the rest of the run
(not a leak: it never grows). LEAK from step 0.

What it does: clouds of points on the surface of a sphere, cube, cylinder (with caps) or
torus (the class), random per-axis scale, random rotation, 1% noise. Every batch is 16
clouds with the same point count n, drawn from 64, 80, ..., 512 (29 values), so the input
shape changes from batch to batch; all 29 are met by step 87. From step 180 each batch
adds a slice of the jitter bank. Model: per-point MLP 3->64->128 (LayerNorm, ReLU) on
centred points, max + mean pooling, MLP 256->128->4. AdamW(1e-3, wd 1e-4), 450 steps, one
thread; called directly.

What grows: the batch dump, every step from step 0 (its size per step is proportional to
that step's n: 12 KiB at n = 64, 96 KiB at n = 512); the jitter bank once, at step 180.
New point counts cost the heap nothing measurable (linear layers cache no kernels per
shape).

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, read after each step once the
step's batch, logits and loss are dropped; "held" = the dump's tensor bytes):
- The dump at the end: 450 batches, 23.69 MiB (53.9 KiB a step on average).
- Heap: 125.2 MiB at step 0, 129.3 at 75, 133.4 at 150, 149.4 at 225, 153.4 at 300, 157.6
  at 375, 161.8 at 449.
- Heap rise: steps 1-89 +5.06 MiB (58 KiB a step, at the 28 new-count steps and the 61
  repeat steps alike; held +53 to +55 KiB a step); 90-179 +4.67 MiB (53.1 KiB a step);
  step 180 +12.06 MiB (the bank; RSS at that step +4.0, +0.1 and +15.9 MiB in three
  runs); 181-314 +7.20 MiB (55.0 KiB a step); 315-449 +7.63 MiB (57.9 KiB a step).
- RSS: 398 MiB at step 0, 431 at 75, 431 at 150, 446 at 225, 451 at 300, 457 at 375, 459 at
  449.
- Training works: loss 1.36 at step 0 (chance 1.39), 45-step window means 1.17, 0.64,
  0.53, 0.44, 0.44, 0.35, 0.31, 0.28, 0.27, 0.32; finite throughout. About 8 s on 2 cores.
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
          "findings": [{"id": "memory_leak", "first_step": 0, "tolerance": 23}]}

STEPS, BATCH, CLASSES = 450, 16, 4
POINT_COUNTS = list(range(64, 513, 16))   # 29 possible cloud sizes; one per batch
JITTER_FROM = 180                         # jitter augmentation (and its noise bank) from here
BANK_POINTS = 1 << 20                     # 2^20 x 3 floats = 12 MiB

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

def random_rotation(g):
    q = torch.randn(4, generator=g)
    w, x, y, z = (q / q.norm()).tolist()
    return torch.tensor([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                         [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                         [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def sample_shape(g, kind, n):
    """n points on the surface of: 0 sphere, 1 cube, 2 cylinder (with caps), 3 torus;
    random scale per axis (0.8-1.2), random rotation, 1% noise."""
    if kind == 0:
        p = torch.randn(n, 3, generator=g)
        p = p / p.norm(dim=1, keepdim=True)
    elif kind == 1:
        p = torch.rand(n, 3, generator=g) * 2 - 1
        axis = torch.randint(0, 3, (n,), generator=g)
        side = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
        p[torch.arange(n), axis] = side
    elif kind == 2:
        t = torch.rand(n, generator=g) * 2 * math.pi
        h = torch.rand(n, generator=g) * 2 - 1
        cap = torch.rand(n, generator=g) < 0.25
        rad = torch.where(cap, torch.rand(n, generator=g).sqrt(), torch.ones(n))
        h = torch.where(cap, torch.sign(h), h)
        p = torch.stack([rad * torch.cos(t), rad * torch.sin(t), h], 1)
    else:
        u = torch.rand(n, generator=g) * 2 * math.pi
        v = torch.rand(n, generator=g) * 2 * math.pi
        p = torch.stack([(0.7 + 0.3 * torch.cos(v)) * torch.cos(u),
                         (0.7 + 0.3 * torch.cos(v)) * torch.sin(u), 0.3 * torch.sin(v)], 1)
    p = p * (0.8 + 0.4 * torch.rand(1, 3, generator=g))
    return p @ random_rotation(g).T + 0.01 * torch.randn(n, 3, generator=g)


class PointNet(nn.Module):
    """Shared per-point MLP 3 -> 64 -> 128 (LayerNorm, ReLU), max + mean pooling over the
    points, MLP 256 -> 128 -> 4."""

    def __init__(self):
        super().__init__()
        self.point = nn.Sequential(nn.Linear(3, 64), nn.LayerNorm(64), nn.ReLU(),
                                   nn.Linear(64, 128), nn.LayerNorm(128), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, CLASSES))

    def forward(self, pts):
        f = self.point(pts - pts.mean(1, keepdim=True))
        return self.head(torch.cat([f.max(1).values, f.mean(1)], -1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    r, g = random.Random(8), torch.Generator().manual_seed(8)
    model = PointNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    batch_dump = []           # "for reproducing a bad step later"
    jitter_bank = None
    seen, ledger = set(), Ledger()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(args.steps):
            n = r.choice(POINT_COUNTS)
            new = n not in seen
            seen.add(n)
            labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
            pts = torch.stack([sample_shape(g, int(k), n) for k in labels])
            if step == JITTER_FROM:
                # one-off: a bank of pre-drawn jitter vectors, kept for the rest of the run
                jitter_bank = 0.02 * torch.randn(BANK_POINTS, 3, generator=g)
            if jitter_bank is not None:
                at = r.randrange(BANK_POINTS - BATCH * n)
                pts = pts + jitter_bank[at: at + BATCH * n].view(BATCH, n, 3)
            logits = model(pts)
            loss = F.cross_entropy(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # THE BUG: every step's input batch is appended to the dump (BATCH x n x 3 floats
            # plus the labels), not just the steps whose loss looks bad
            batch_dump.append((pts, labels))
            rec.step(loss=loss)
            lv = loss.item()
            del pts, labels, logits, loss
            ledger.add(new, sum(p.numel() * 4 + y.numel() * 8 for p, y in batch_dump), lv)
            if step % 50 == 0:
                print(f"step {step} points {n} loss {lv:.3f} point counts seen {len(seen)} "
                      f"heap {heap_mib():.1f} MiB", flush=True)
    ledger.report(cuts=(JITTER_FROM // 2, JITTER_FROM, JITTER_FROM + 1,
                        (JITTER_FROM + args.steps) // 2))
    held = sum(p.numel() * 4 + y.numel() * 8 for p, y in batch_dump)
    rows = ledger.rows
    print(f"[held] batch dump: {len(batch_dump)} batches, {held / 2 ** 20:.2f} MiB, "
          f"{held / len(batch_dump) / 1024:.1f} KiB a step on average; jitter bank "
          f"{jitter_bank.numel() * 4 / 2 ** 20:.2f} MiB")
    print(f"[jump] step {JITTER_FROM}: heap {rows[JITTER_FROM][1] - rows[JITTER_FROM - 1][1]:+.2f}"
          f" MiB, rss {rows[JITTER_FROM][2] - rows[JITTER_FROM - 1][2]:+.2f} MiB")


if __name__ == "__main__":
    main()
