"""Waveform classifier (LSTM) on variable-length signals with dynamic padding, with a real
leak from step 250: a per-step validation curve switched on at step 250 evaluates a small
validation batch WITHOUT torch.no_grad() and appends the loss tensor itself to a list, so
every entry keeps the whole autograd graph of that forward (the LSTM's saved activations
and workspace), never backwarded, never freed: ~870 KiB a step. LEAK from step 250.

What it does: signals of 5 kinds (sine, square, sawtooth, triangle, gated noise bursts)
with random period 8-30, phase, amplitude, drift and noise; lengths log-normal around 60
samples (24-220). Batches of 16, zero-padded to the longest signal rounded up to a
multiple of 8, so the padded length changes from batch to batch (19 values, all met by
step 91). Validation: 12 fixed batches of 2 signals, cycled one per step. Model: linear
1->32 + tanh, LSTM(32, 64), the hidden state at each signal's last real sample, linear
64->5. Adam(3e-3), grad-norm clip 1.0, 500 steps, one thread; called directly.

What grows: each new padded length costs the heap ~190 KiB (kernels cached per shape,
bounded: 19 lengths); from step 250 the validation list, every step.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, read after each step once the
step's batch and loss are dropped):
- Padded lengths: 19 distinct, all met by step 91 (none later).
- Heap: 125.3 MiB at step 0, 128.6 at 83, 128.8 at 166, 130.4 at 250, 200.7 at 333, 271.2
  at 416, 341.2 at 499.
- Heap rise: steps 1-124 +3.35 MiB at the 18 new-length steps (191 KiB each), +0.12 MiB over
  106 repeat steps (1.1 KiB each); 125-249 +0.07 MiB over 125 steps (0.6 KiB each);
  250-374 +106.7 MiB (874 KiB a step); 375-499 +105.7 MiB (866 KiB a step).
- RSS: 410 MiB at step 0, 440 at 83, 441 at 166, 441 at 250, 498 at 333, 567 at 416, 642 at
  499.
- Training works: loss 1.59 at step 0 (chance 1.61), 50-step window means 1.59, 1.46, 1.25,
  1.00, 0.68, 0.55, 0.40, 0.46, 0.38, 0.37; finite throughout. About 7 s on 2 cores.
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
          "findings": [{"id": "memory_leak", "first_step": 250, "tolerance": 25}]}

STEPS, BATCH, HIDDEN, CLASSES = 500, 16, 64, 5
MIN_LEN, MAX_LEN = 24, 220
VAL_BATCHES, VAL_SIZE = 12, 2   # a small fixed validation probe: 12 batches of 2 signals
VAL_FROM = 250                  # the per-step validation curve is switched on here

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

def waveform(r, kind, n):
    """One noisy signal of n samples: 0 sine, 1 square, 2 sawtooth, 3 triangle, 4 bursts of
    noise; random period (8-30 samples), phase, amplitude and drift."""
    period, phase = r.uniform(8, 30), r.uniform(0, 1)
    t = torch.arange(n, dtype=torch.float32) / period + phase
    frac = t - t.floor()
    if kind == 0:
        x = torch.sin(2 * math.pi * t)
    elif kind == 1:
        x = torch.where(frac < 0.5, 1.0, -1.0)
    elif kind == 2:
        x = 2 * frac - 1
    elif kind == 3:
        x = 4 * (frac - 0.5).abs() - 1
    else:
        x = torch.randn(n) * (torch.sin(2 * math.pi * t / 3) > 0.3).float() * 1.5
    x = r.uniform(0.5, 1.5) * x + r.uniform(-0.3, 0.3) * torch.linspace(0, 1, n)
    return x + 0.25 * torch.randn(n)


def make_batch(r, size=BATCH):
    """size signals with long-tailed lengths, zero-padded to the longest in the batch rounded
    up to a multiple of 8 (pad_to_multiple_of=8)."""
    lengths = [min(MAX_LEN, max(MIN_LEN, int(r.lognormvariate(math.log(60), 0.5))))
               for _ in range(size)]
    kinds = [r.randrange(CLASSES) for _ in range(size)]
    x = torch.zeros(size, -(-max(lengths) // 8) * 8, 1)
    for i, (k, n) in enumerate(zip(kinds, lengths, strict=True)):
        x[i, :n, 0] = waveform(r, k, n)
    return x, torch.tensor(lengths), torch.tensor(kinds)


class WaveLSTM(nn.Module):
    """Linear 1->32 + tanh, LSTM(32, 64), the hidden state at each signal's last real
    sample, linear 64->5."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(1, 32)
        self.lstm = nn.LSTM(32, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, lengths):
        h, _ = self.lstm(torch.tanh(self.inp(x)))
        last = h[torch.arange(x.shape[0]), lengths - 1]
        return self.head(last)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    r = random.Random(21)
    val = [make_batch(random.Random(1000 + i), VAL_SIZE) for i in range(VAL_BATCHES)]
    model = WaveLSTM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    val_curve = []            # the validation loss at every step, for a smooth plot
    seen, ledger = set(), Ledger()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(args.steps):
            x, lengths, y = make_batch(r)
            new = x.shape[1] not in seen
            seen.add(x.shape[1])
            loss = F.cross_entropy(model(x, lengths), y)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step >= VAL_FROM:
                # THE BUG: evaluated without torch.no_grad() and kept as a tensor, so every
                # entry holds the whole autograd graph of the validation forward (the LSTM's
                # saved activations), never backwarded, never freed
                vx, vlen, vy = val[step % VAL_BATCHES]
                val_curve.append(F.cross_entropy(model(vx, vlen), vy))
            rec.step(loss=loss)
            lv = loss.item()
            del x, lengths, y, loss
            ledger.add(new, 0, lv)
            if step % 50 == 0:
                print(f"step {step} loss {lv:.3f} padded lengths seen {len(seen)} "
                      f"val entries {len(val_curve)} heap {heap_mib():.1f} MiB", flush=True)
    ledger.report(cuts=(VAL_FROM // 2, VAL_FROM, (VAL_FROM + args.steps) // 2))
    print(f"[held] val curve: {len(val_curve)} loss tensors, each with its graph; last values "
          + ", ".join(f"{v.item():.3f}" for v in val_curve[-VAL_BATCHES:]))


if __name__ == "__main__":
    main()
