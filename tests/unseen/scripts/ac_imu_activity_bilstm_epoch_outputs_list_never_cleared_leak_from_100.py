"""Activity recognition from 6-axis IMU windows of variable length with a bidirectional LSTM,
with a real but slow leak from step 100: a buffer meant for an end-of-epoch confusion
analysis gets the LSTM output of every step appended as it is (still attached to the
graph: 4 x n x 64 floats, 1 KiB per sample of window, ~76 KiB a step), and since training
is counted in steps the "epoch end" that would clear it never comes. Window lengths vary
every step (40-240 samples in steps of 2, short windows common: weights 1 / rank), so new
lengths keep arriving; each new length makes oneDNN build and cache the LSTM's primitives
for it (~350 KiB of heap; none with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0), which is healthy
per-shape growth. LEAK from step 100.

What it does: 6 activities (still, walking, running, stairs, cycling, falling) synthesized
as periodic accelerometer / gyroscope patterns (plus drift or an impact spike) at 50 Hz,
rotated by a random sensor orientation, in noise; 4 windows of one length a batch. Model:
LSTM(6, 32, bidirectional), mean and max pooling over time, linear 128->6. Adam(3e-3),
450 steps, one thread; the model is called directly on tensors built in the loop.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step; "floor" = the heap
once the step's batch, logits, outputs and loss are freed - the appended ones stay):
- Lengths: 78 distinct by step 401 (the last new one), first met 44 / 15 / 15 / 4 times in
  the four quarters; 41 new-length steps before step 100 (step 0 included), 37 from 100
  on. The buffer holds
  350 outputs, 26.1 MiB of tensor data, at the end.
- Heap: 125.6 MiB at step 0, 137.5 at 75, 146.3 at 150, 155.9 at 225, 165.8 at 300, 173.7
  at 375, 181.0 at 449.
- Where it rises (floor): steps 1-49 +10.76 MiB at 31 new-length steps (355 KiB each) vs
  +0.20 MiB over 18 repeat steps; 50-99 +3.02 at 9 (344 KiB) vs +0.08 over 41 (1.9 KiB
  each); 100-449 +18.37 MiB at 37 new-length steps (508 KiB each) and +23.05 MiB over 313
  repeat steps (75.4 KiB each: the leak).
- Control (the same script with the append disabled): steps 100-449 add +12.68 MiB at the
  37 new lengths (351 KiB each) and +0.37 MiB over the 313 repeat steps (1.2 KiB each).
- RSS: 400 MiB at step 0, 425 at 75, 441 at 150, 446 at 225, 453 at 300, 460 at 375, 467
  at 449.
- Training itself is fine: loss 1.78 at step 0, 45-step window means 1.71, 1.49, 1.16,
  1.02, 0.93, 0.85, 0.71, 0.57, 0.59, 0.57; finite throughout. About 6 s on 2 cores.
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
          "findings": [{"id": "memory_leak", "first_step": 100, "tolerance": 22}]}

STEPS, BATCH, ACTIVITIES, HZ = 450, 4, 6, 50
LENGTHS = tuple(range(40, 241, 2))     # window lengths (samples at 50 Hz); short windows are
                                       # common, long ones rare (weights 1 / rank)
OUTPUTS_FROM = 100                     # the confusion-analysis buffer is switched on here

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


def imu_windows(n, g):
    """BATCH windows of n samples of a 6-axis IMU (accelerometer + gyroscope): 0 still,
    1 walking (~2 Hz), 2 running (~3 Hz, larger), 3 stairs (walking + vertical drift), 4
    cycling (smooth ~1.3 Hz rotation), 5 falling (quiet, then a spike); random phase, gain,
    sensor orientation."""
    y = torch.randint(0, ACTIVITIES, (BATCH,), generator=g)
    t = (torch.arange(n) / HZ).view(1, n, 1)
    u = torch.rand(BATCH, 4, generator=g).view(BATCH, 1, 4)
    ph = 2 * math.pi * u[..., :1]
    f = (torch.tensor([0.0, 2.0, 3.0, 1.9, 1.3, 0.0])[y].view(BATCH, 1, 1)
         * (0.9 + 0.2 * u[..., 1:2]))
    amp = torch.tensor([0.02, 1.0, 2.2, 1.0, 0.6, 0.05])[y].view(BATCH, 1, 1)
    base = amp * torch.sin(2 * math.pi * f * t + ph)
    harm = 0.4 * amp * torch.sin(4 * math.pi * f * t + 2 * ph)
    drift = (y == 3).float().view(BATCH, 1, 1) * 0.3 * t / t.max()
    fall_at = (0.3 + 0.5 * u[..., 2:3]) * n / HZ
    spike = (y == 5).float().view(BATCH, 1, 1) * 4 * torch.exp(-((t - fall_at) * 8) ** 2)
    axes = torch.cat([base + harm, 0.5 * base, 1 + drift + spike,
                      0.8 * harm, (y == 4).float().view(BATCH, 1, 1) * base,
                      0.3 * base + spike], -1)
    mix = torch.linalg.qr(torch.randn(BATCH, 3, 3, generator=g))[0]   # sensor orientation
    acc = axes[..., :3] @ mix
    gyr = axes[..., 3:] @ mix
    return torch.cat([acc, gyr], -1) + 0.1 * torch.randn(BATCH, n, 6, generator=g), y


class ActivityLSTM(nn.Module):
    """Bidirectional LSTM (6 -> 2 x 32) over the window, mean and max pooling over time,
    linear head. Returns the logits and the per-sample LSTM outputs."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(128, ACTIVITIES)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(torch.cat([out.mean(1), out.amax(1)], -1)), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(31)
    pick = random.Random(37)
    weights = [1 / (i + 1) for i in range(len(LENGTHS))]
    model = ActivityLSTM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    epoch_outputs = []     # meant for an end-of-epoch confusion analysis; training is
                           # step-based, the "epoch end" that would clear it never comes
    seen, rows = set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            n = pick.choices(LENGTHS, weights)[0]
            new = int(n not in seen)
            seen.add(n)
            x, y = imu_windows(n, g)
            logits, out = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= OUTPUTS_FROM:
                # THE BUG: the LSTM outputs are appended as they are (still attached to the
                # graph, BATCH x n x 64 floats) and the list is never cleared
                epoch_outputs.append((out, y))
            rec.step(loss=loss)
            heap, rss = heap_mib(), rss_mib()
            lv = loss.item()
            del x, y, logits, out, loss
            rows.append((new, heap, rss, lv, heap_mib()))
            if step % 50 == 0:
                print(f"step {step} len {n} loss {lv:.3f} lengths {len(seen)} "
                      f"kept {len(epoch_outputs)} heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(OUTPUTS_FROM // 2, OUTPUTS_FROM, STEPS))
    held = sum(o.numel() * 4 for o, _ in epoch_outputs)
    print(f"[held] {len(epoch_outputs)} outputs, {held / 2 ** 20:.2f} MiB of tensor data "
          f"({held / max(len(epoch_outputs), 1) / 1024:.0f} KiB each)")


if __name__ == "__main__":
    main()
