"""Keystroke-dynamics typist identification: two 1-D convolutions and a 2-layer GRU over
typed phrases, with length-bucketed batches (no padding: every phrase in a batch has the
same number of keystrokes), the longest phrase admitted growing from 20 to 120 keystrokes
over steps 0-380. New lengths therefore arrive through the whole run. Each new length
makes oneDNN build and cache the two convolutions' primitives for it (~200-330 KiB of
heap); a length met again adds nothing. HEALTHY: bounded by the 109 possible lengths (and
oneDNN's 1024-entry primitive cache); not a leak.

What it does: 8 typists, each with an overall pace, a hold and a flight time per key and a
slowing-down habit; a batch is 16 phrases of one length, each keystroke featurized as
one-hot key (30) + hold + flight + position. Model: conv1d 33->32 (k5) + GELU, conv1d
32->32 (k5) + GELU, GRU(32, 48, 2 layers), attention pooling over time, linear 48->8.
Adam(3e-3), 450 steps, one thread; the model is called directly on the tensors.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step; "floor" = the heap
once the step's batch, logits and loss are freed):
- Lengths: 94 distinct (12-120) by step 449, first met 30 / 23 / 20 / 21 times in the four
  quarters; the last new one at step 444.
- Heap: 126.2 MiB at step 0, 133.3 at 75, 138.8 at 150, 142.7 at 225, 147.6 at 300, 148.6
  at 375, 152.7 at 449 (+26 MiB).
- Where it rises (floor): steps 1-149 +11.86 MiB at 37 new-length steps (328 KiB each) vs
  +0.50 MiB over 112 repeat steps (4.6 KiB each); 150-299 +7.91 at 29 (279 KiB) vs +0.17
  over 121 (1.4 KiB); 300-449 +5.45 at 27 (207 KiB) vs +0.22 over 123 (1.8 KiB). (The
  last third is cheaper because oneDNN's primitive cache starts evicting: with
  ONEDNN_PRIMITIVE_CACHE_CAPACITY=8192 it reads 279 KiB a length.) The heap at the step's
  end swings with the live batch (new lengths are mostly the longest yet): +19.0 / +25.6 /
  +14.3 MiB at new-length steps, -5.9 / -18.2 / -8.3 MiB at repeat steps, by third.
- Not a leak: extended to 900 steps (108 of the 109 lengths met by step 881), steps 450-899 add
  +0.09 MiB over 436 repeat steps and +0.85 MiB at 14 new lengths (the cache is full:
  62 KiB each); RSS 474 MiB at step 450, 487 at 899.
- RSS of this run: 399 MiB at step 0, 430 at 150, 446 at 300, 464 at 449.
- Training is fine: loss 2.09 at step 0 (chance), 45-step window means 1.75, 0.85, 0.30,
  0.33, 0.16, 0.09, 0.11, 0.07, 0.04, 0.04; finite throughout. About 13 s on 2 cores.
"""

import argparse
import ctypes
import random

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, USERS, KEYS = 450, 16, 8, 30
MIN_LEN, START_MAX, END_MAX, GROW_UNTIL = 12, 20, 120, 380   # keystrokes per phrase

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


class Typists:
    """Keystroke dynamics of USERS typists: each has an overall pace, a hold time and a flight
    time per key (ms) and a habit of slowing down along a phrase. A phrase is KEYS-valued
    key ids; each
    keystroke is featurized as (one-hot key, hold, flight, position in phrase)."""

    def __init__(self, g):
        speed = torch.linspace(0.6, 1.6, USERS)[torch.randperm(USERS, generator=g)]
        self.hold = speed.view(-1, 1) * (60 + 50 * torch.rand(USERS, KEYS, generator=g))
        self.flight = speed.flip(0).view(-1, 1) * (80 + 100 * torch.rand(USERS, KEYS, generator=g))
        self.fatigue = 0.3 * torch.rand(USERS, generator=g)
        self.g = g

    def batch(self, length):
        g = self.g
        user = torch.randint(0, USERS, (BATCH,), generator=g)
        keys = torch.randint(0, KEYS, (BATCH, length), generator=g)
        pos = torch.linspace(0, 1, length).expand(BATCH, length)
        slow = 1 + self.fatigue[user].unsqueeze(1) * pos
        hold = self.hold[user.unsqueeze(1), keys] * slow * (1 + 0.12 * torch.randn(
            BATCH, length, generator=g))
        flight = self.flight[user.unsqueeze(1), keys] * slow * (1 + 0.15 * torch.randn(
            BATCH, length, generator=g))
        feats = torch.cat([F.one_hot(keys, KEYS).float(),
                           torch.stack([hold / 100, flight / 100, pos], -1)], -1)
        return feats, user


class KeystrokeGRU(nn.Module):
    """Two 1-D convolutions over time (k5, 33 -> 32 -> 32 channels, digraph/trigraph rhythm)
    -> 2-layer GRU (hidden 48) over the phrase -> attention pooling over time -> user
    logits."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(KEYS + 3, 32, 5, padding=2), nn.GELU(),
                                  nn.Conv1d(32, 32, 5, padding=2), nn.GELU())
        self.gru = nn.GRU(32, 48, num_layers=2, batch_first=True)
        self.score = nn.Linear(48, 1)
        self.head = nn.Linear(48, USERS)

    def forward(self, x):
        h, _ = self.gru(self.conv(x.transpose(1, 2)).transpose(1, 2))
        w = self.score(h).softmax(1)
        return self.head((w * h).sum(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    pick = random.Random(9)
    data = Typists(g)
    model = KeystrokeGRU()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    seen, rows = set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            # length-bucketed batches (no padding: every phrase in the batch has the same
            # length); the longest phrase length admitted grows from 20 to 120 keystrokes
            top = START_MAX + int((END_MAX - START_MAX) * min(1.0, step / GROW_UNTIL))
            length = pick.randint(MIN_LEN, top)
            new = length not in seen
            seen.add(length)
            x, y = data.batch(length)
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
                print(f"step {step} len {length} loss {lv:.3f} lengths {len(seen)} "
                      f"heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(STEPS // 3, 2 * STEPS // 3, STEPS))


if __name__ == "__main__":
    main()
