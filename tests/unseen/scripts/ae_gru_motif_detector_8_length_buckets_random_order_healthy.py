"""Order-sensitive motif detector (conv front-end + GRU) trained on length-bucketed batches:
8 bucket lengths (16, 24, 32, 48, 64, 96, 128, 160) drawn in random order, weighted
20/18/16/14/12/10/7/3 % (the 160 bucket is rare), no padding inside a bucket. Each bucket
length is a new input shape the first time it comes; the conv's oneDNN kernels are cached
per length (~100 KiB of heap each). HEALTHY: the growth is bounded by the 8 buckets and
stops once all have been seen; nothing is kept from step to step.

What it does: random token sequences (tokens 1..19); class c (of 4) plants motif c (three
tokens: 1-2-3, 3-2-1, 1-3-1 or 2-1-2) twice, and the motif tokens also occur as noise, so
the order matters. Batches of 16 sequences of one bucket length. Model: embedding 20->32,
conv1d 32->32 (k3) + GELU, GRU(32, 64), max over time, linear 64->4. Adam(3e-3),
grad-norm clip 1.0, 420 steps, one thread; called directly.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, read after each step once the
step's batch and loss are dropped):
- Buckets first met at steps 0, 1, 2, 6, 7, 8, 21 and 54 (the 160 bucket); batches per
  bucket 90 / 70 / 53 / 59 / 40 / 56 / 40 / 12.
- Heap: 129.1 MiB at step 0, 130.9 at 70, 130.9 at 140, 131.0 at 210, 131.0 at 280, 131.1
  at 350, 131.1 at 419. Steps 1-54: +0.67 MiB at the 7 new-bucket steps (97 KiB each),
  +1.06 MiB over 47 repeat steps (warm-up); steps 55-209 +0.13 MiB over 155 steps (0.9 KiB
  a step); 210-419 +0.14 MiB over 210 steps (0.7 KiB a step). From step 55 to 419: +274
  KiB in all.
- RSS: 399 MiB at step 0, 423.0 at 70, 423.3 at 419.
- Training works: loss 1.39 at step 0 (chance 1.39), 42-step window means 1.07, 0.24, 0.07,
  0.04, 0.06, 0.04, 0.04, 0.03, 0.04, 0.04; finite throughout. About 8 s on 2 cores.
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

STEPS, BATCH, VOCAB, CLASSES = 420, 16, 20, 4
BUCKETS = [16, 24, 32, 48, 64, 96, 128, 160]      # every batch comes from one bucket
BUCKET_WEIGHTS = [20, 18, 16, 14, 12, 10, 7, 3]    # share of the data in each bucket (%)

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

MOTIFS = [[1, 2, 3], [3, 2, 1], [1, 3, 1], [2, 1, 2]]   # class c = motif c is present


def make_batch(g, length):
    """BATCH random token sequences (tokens 1..VOCAB-1) of one bucket length; class c plants
    motif c twice at random places. The motifs' tokens also occur as noise, so it takes the
    order to tell them apart."""
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    ids = torch.randint(1, VOCAB, (BATCH, length), generator=g)
    for i, c in enumerate(labels.tolist()):
        for _ in range(2):
            at = int(torch.randint(0, length - 3, (1,), generator=g))
            ids[i, at:at + 3] = torch.tensor(MOTIFS[c])
    return ids, labels


class MotifGRU(nn.Module):
    """Embedding 20 -> 32, conv1d 32 -> 32 (k3) + GELU, 1-layer GRU (hidden 64), max over
    time, linear 64 -> 4."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.conv = nn.Conv1d(32, 32, 3, padding=1)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, ids):
        x = F.gelu(self.conv(self.emb(ids).transpose(1, 2))).transpose(1, 2)
        h, _ = self.gru(x)
        return self.head(h.max(1).values)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    r, g = random.Random(4), torch.Generator().manual_seed(4)
    model = MotifGRU()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    seen, ledger = set(), Ledger()
    counts = dict.fromkeys(BUCKETS, 0)
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(args.steps):
            length = r.choices(BUCKETS, weights=BUCKET_WEIGHTS)[0]   # buckets in random order
            counts[length] += 1
            new = length not in seen
            seen.add(length)
            ids, labels = make_batch(g, length)
            loss = F.cross_entropy(model(ids), labels)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss)
            lv = loss.item()
            del ids, labels, loss
            ledger.add(new, 0, lv)
            if step % 60 == 0:
                print(f"step {step} len {length} loss {lv:.3f} buckets seen {len(seen)} "
                      f"heap {heap_mib():.1f} MiB", flush=True)
    first = [s for s, row in enumerate(ledger.rows) if row[0]]
    ledger.report(cuts=(first[-1] + 1, args.steps // 2))
    print(f"[buckets] first met at steps {first}; batches per bucket {counts}")
    rows = ledger.rows
    a = first[-1] + 1
    print(f"[after last new bucket] heap {rows[a][1]:.2f} MiB at step {a} -> "
          f"{rows[-1][1]:.2f} at {len(rows) - 1} ({(rows[-1][1] - rows[a][1]) * 1024:+.0f} KiB); "
          f"rss {rows[a][2]:.1f} -> {rows[-1][2]:.1f} MiB")


if __name__ == "__main__":
    main()
