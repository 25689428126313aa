"""Keyword text classifier (1-D CNN) with dynamic padding: every batch is padded to its own
longest document, and document lengths are long-tailed (log-normal, median 40 tokens,
capped at 400), so the padded length is new on many steps early on and, because of the
tail, still now and then at the very end of the run. Each new padded length makes oneDNN
build and cache the convolutions' kernels for it (87-250 KiB of heap); a length met again
adds nothing. HEALTHY: the growth comes only with new shapes (bounded by the possible
lengths and by oneDNN's primitive cache); nothing is kept from step to step.

What it does: 3 classes, 10 keyword tokens each; a document of n tokens (tokens 31..499
otherwise) carries 2 + n/20 keywords of its class and one of another class. Batches of 12,
padded with 0. Model: embedding 500->48, conv1d 48->64 (k5) + ReLU, conv1d 64->64 (k5,
dilation 2) + ReLU, max over the real positions, linear 64->3. Adam(2e-3), 500 steps, one
thread; called directly.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, read after each step once the
step's batch and loss are dropped):
- Padded lengths: 185 distinct (48-400); new ones met 85 / 50 / 29 / 21 times in the four
  quarters, the last at step 499.
- Heap: 125.6 MiB at step 0, 140.9 at 83, 150.3 at 166, 153.4 at 250, 155.2 at 333, 156.6
  at 416, 157.8 at 499.
- Heap rise by quarter, new-length steps vs repeat steps: steps 1-124 +20.46 MiB at 84
  (249 KiB each) vs +0.22 MiB over 40 (5.7 KiB each); 125-249 +6.94 at 50 (142) vs +0.09
  over 75 (1.2); 250-374 +2.56 at 29 (90) vs +0.06 over 96 (0.7); 375-499 +1.78 at 21 (87)
  vs +0.12 over 104 (1.2 KiB each).
- RSS: 402 MiB at step 0, 439 at 83, 462 at 166, 469 at 250, 477 at 333, 480 at 416, 488 at
  499.
- Training works: loss 1.08 at step 0 (chance 1.10), 50-step window means 1.13, 0.95,
  0.61, 0.50, 0.41, 0.32, 0.26, 0.22, 0.16, 0.18; finite throughout. About 9 s on 2 cores.
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

EXPECT = {"healthy": True, "findings": [], "forbidden": ["memory_leak"]}

STEPS, BATCH, VOCAB, CLASSES, PAD = 500, 12, 500, 3, 0
MIN_LEN, MAX_LEN = 8, 400        # document lengths: log-normal (median 40 tokens), capped

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

KEYWORDS = [list(range(1 + 10 * c, 11 + 10 * c)) for c in range(CLASSES)]   # 10 per class


def make_batch(r, g):
    """BATCH token documents; a class-c document carries 2 + len/20 keywords of class c and
    one keyword of another class (a distractor). Padded with 0 to the longest document."""
    lengths = [min(MAX_LEN, max(MIN_LEN, int(r.lognormvariate(math.log(40), 0.7))))
               for _ in range(BATCH)]
    labels = [r.randrange(CLASSES) for _ in range(BATCH)]
    ids = torch.full((BATCH, max(lengths)), PAD, dtype=torch.long)
    for i, (n, c) in enumerate(zip(lengths, labels, strict=True)):
        doc = torch.randint(31, VOCAB, (n,), generator=g)
        for _ in range(2 + n // 20):
            doc[r.randrange(n)] = r.choice(KEYWORDS[c])
        doc[r.randrange(n)] = r.choice(KEYWORDS[(c + r.randint(1, CLASSES - 1)) % CLASSES])
        ids[i, :n] = doc
    return ids, torch.tensor(labels)


class TextCNN(nn.Module):
    """Embedding 500 -> 48, conv1d 48 -> 64 (k5) + ReLU, conv1d 64 -> 64 (k5, dilation 2) +
    ReLU, max over the real (unpadded) positions, linear 64 -> 3."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 48, padding_idx=PAD)
        self.c1 = nn.Conv1d(48, 64, 5, padding=2)
        self.c2 = nn.Conv1d(64, 64, 5, padding=4, dilation=2)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, ids):
        keep = (ids != PAD).unsqueeze(1)
        h = F.relu(self.c1(self.emb(ids).transpose(1, 2)))
        h = F.relu(self.c2(h))
        return self.head(h.masked_fill(~keep, -1e4).max(-1).values)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    r, g = random.Random(13), torch.Generator().manual_seed(13)
    model = TextCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    seen, ledger = set(), Ledger()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(args.steps):
            ids, labels = make_batch(r, g)
            new = ids.shape[1] not in seen
            seen.add(ids.shape[1])
            loss = F.cross_entropy(model(ids), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            lv = loss.item()
            del ids, labels, loss
            ledger.add(new, 0, lv)
            if step % 50 == 0:
                print(f"step {step} loss {lv:.3f} padded lengths seen {len(seen)} "
                      f"heap {heap_mib():.1f} MiB", flush=True)
    ledger.report(cuts=(args.steps // 4, args.steps // 2, 3 * args.steps // 4))
    print(f"[lengths] {len(seen)} distinct padded lengths, {min(seen)}-{max(seen)}")


if __name__ == "__main__":
    main()
