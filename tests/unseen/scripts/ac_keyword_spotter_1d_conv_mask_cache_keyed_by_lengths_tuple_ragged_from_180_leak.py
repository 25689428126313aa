"""Keyword spotter (strided 1-D CNN on raw 8 kHz waveforms) with a mask cache whose key is
wrong, leaking from step 180. The model caches the per-sample padding mask (8 x 1 x n
floats, 32 n bytes: 150-375 KiB) under the tuple of the clips' own lengths, meaning it as a
per-shape cache. Until step 179 the batches are one-length buckets (every clip of a batch
has the padded length n), so the key is (n,)*8 and the cache grows once per distinct n:
healthy, like oneDNN's conv primitives that are also built per new n (~350-450 KiB). From
step 180 batches are ragged (clips 85-100% of the bucket length, padded to it): nearly
every batch has a lengths tuple never seen before, and a new mask is kept every step
(~225 KiB a step), never evicted. New padded lengths keep arriving all run (the longest
clip admitted grows from 6000 to 12000 samples over steps 0-380). LEAK from step 180.

What it does: 5 keywords, each three 150 ms tones (low / mid / high pattern, speaker pitch
jitter) at a random offset in noise; 8 clips a batch; padded samples zeroed by the mask.
Model: conv1d 1->16 (k20, s4) + BN + ReLU, 16->32 (k8, s4) + BN + ReLU, 32->48 (k5, s2) +
ReLU, masked mean pooling over valid frames, linear 48->5. Adam(2e-3), 400 steps, one
thread; called as model(wave, lengths=...) directly on tensors built in the loop.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step; "floor" = the heap
once the step's batch, logits and loss are freed):
- Padded lengths: 83 distinct (bucket lengths 4800-12000 in steps of 80), first met 28 /
  16 / 18 / 21 times in the four quarters; 42 new-length steps before 180 (step 0
  included), 41 from 180 on;
  the last at step 395. Mask cache 262 entries (59.9 MiB) at the end: 42 per-length ones
  from before step 180, one per step since.
- Heap: 126.0 MiB at step 0, 141.2 at 66, 149.0 at 133, 159.3 at 200, 180.5 at 266, 197.0
  at 333, 216.3 at 399.
- Where it rises (floor): steps 1-89 +17.21 MiB at 26 new-length steps (678 KiB each) vs
  +0.21 MiB over 63 repeat steps (3.4 KiB each; in another run of the same script a one-off
  ~1.2 MiB allocation landed on a repeat step instead: +16.03 vs +1.40 MiB); 90-179
  +10.52 at 15 (718 KiB) vs +0.09 over 75 (1.3 KiB); 180-399 +22.83 MiB at 41
  new-length steps (570 KiB each) and +39.36 MiB over 179 repeat steps (225.2 KiB each:
  the leak).
- Control (the same script with the cache holding one entry): steps 180-399 add +13.09 MiB
  at the 41 new lengths (327 KiB each; oneDNN's 1024-entry cache is evicting by then, with
  ONEDNN_PRIMITIVE_CACHE_CAPACITY=8192 it is 575 KiB each) and -2.47 MiB over the 179
  repeat steps (the per-length masks of before are released).
- RSS: 409 MiB at step 0, 476 at 133, 495 at 200, 521 at 266, 540 at 333, 579 at 399.
- Training itself is fine: loss 1.65 at step 0, 40-step window means 1.50, 0.93, 0.61,
  0.59, 0.45, 0.42, 0.55, 0.40, 0.33, 0.34; finite throughout. About 8 s on 2 cores.
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

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 180, "tolerance": 20}]}

STEPS, BATCH, WORDS, SR = 400, 8, 5, 8000
BUCKETS = tuple(range(4800, 12001, 80))   # clip lengths (samples) the recorders produce
TOP_START, TOP_GROW_UNTIL = 6000, 380     # curriculum: the longest clip admitted grows from
                                          # 6000 to 12000 samples over steps 0-380
RAGGED_FROM = 180                         # from here batches mix clip lengths (less padding
                                          # than one-length buckets)
PATTERNS = ((0, 2, 0), (2, 0, 2), (0, 1, 2), (2, 1, 0), (1, 1, 1))   # tone steps per word

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


def utterance(word, n, r):
    """A keyword in n samples: three 150 ms tones (low / mid / high by the word's pattern,
    speaker pitch jittered) at a random offset, in noise."""
    x = 0.3 * torch.randn(n)
    base = 300 * (0.8 + 0.4 * r.random())
    t = torch.arange(int(0.15 * SR)) / SR
    at = r.randint(0, n - 3 * len(t))
    for k, level in enumerate(PATTERNS[word]):
        tone = torch.sin(2 * math.pi * base * (1.6 ** level) * t) * torch.hann_window(len(t))
        x[at + k * len(t): at + (k + 1) * len(t)] += tone
    return x


class Spotter(nn.Module):
    """Strided 1-D convolutions on the raw waveform (1 -> 16 -> 32 -> 48 channels, total
    stride 32), masked mean pooling over the valid frames, linear head. Padded samples are
    zeroed with a per-sample mask that is cached (see `masks`)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv1d(1, 16, 20, stride=4, padding=8), nn.BatchNorm1d(16),
                                nn.ReLU())
        self.c2 = nn.Sequential(nn.Conv1d(16, 32, 8, stride=4, padding=2), nn.BatchNorm1d(32),
                                nn.ReLU())
        self.c3 = nn.Sequential(nn.Conv1d(32, 48, 5, stride=2, padding=2), nn.ReLU())
        self.head = nn.Linear(48, WORDS)
        self._masks = {}

    def masks(self, lengths, n):
        # cached "per batch layout": the key was meant to be the padded shape, but it is the
        # tuple of the clips' own lengths. With one-length buckets that is the same thing;
        # once a batch mixes lengths, nearly every batch has a tuple never seen before.
        key = tuple(lengths)
        if key not in self._masks:
            self._masks[key] = (torch.arange(n).view(1, 1, n)
                                < torch.tensor(lengths).view(-1, 1, 1)).float()
        return self._masks[key]

    def forward(self, wave, lengths):
        mask = self.masks(lengths, wave.shape[-1])
        h = self.c3(self.c2(self.c1(wave * mask)))
        frames = F.adaptive_max_pool1d(mask, h.shape[-1])
        return self.head((h * frames).sum(-1) / frames.sum(-1).clamp(min=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    r = random.Random(23)
    model = Spotter()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    seen, rows = set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            top = TOP_START + (BUCKETS[-1] - TOP_START) * min(1.0, step / TOP_GROW_UNTIL)
            bucket = r.choice([b for b in BUCKETS if b <= top])
            if step < RAGGED_FROM:
                lengths = [bucket] * BATCH               # one-length bucket
            else:                                        # ragged: clips 85-100% of bucket
                lengths = [bucket - 80 * r.randint(0, bucket * 15 // 8000)
                           for _ in range(BATCH)]
                lengths[r.randrange(BATCH)] = bucket
            words = [r.randrange(WORDS) for _ in range(BATCH)]
            wave = torch.zeros(BATCH, 1, bucket)
            for i, (w, n) in enumerate(zip(words, lengths, strict=True)):
                wave[i, 0, :n] = utterance(w, n, r)
            new = int(bucket not in seen)
            seen.add(bucket)
            logits = model(wave, lengths=lengths)
            loss = F.cross_entropy(logits, torch.tensor(words))
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            heap, rss = heap_mib(), rss_mib()
            lv = loss.item()
            del wave, logits, loss
            rows.append((new, heap, rss, lv, heap_mib()))
            if step % 50 == 0:
                print(f"step {step} len {bucket} loss {lv:.3f} shapes {len(seen)} "
                      f"masks {len(model._masks)} heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(RAGGED_FROM // 2, RAGGED_FROM, STEPS))
    held = sum(m.numel() * 4 for m in model._masks.values())
    print(f"[held] mask cache {len(model._masks)} entries, {held / 2 ** 20:.2f} MiB")


if __name__ == "__main__":
    main()
