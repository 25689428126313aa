"""Galaxy-morphology CNN on survey cutouts of many sizes, with a real leak from step 160:
from there, every step the probe-calibration code runs the model on a fixed probe cutout
WITHOUT torch.no_grad() and appends the softmax output to a list. Each kept output holds
its autograd graph and every activation that graph saved (~156 KiB a step), and the list
is never trimmed. Meanwhile image sizes keep changing: cutouts come in 64 (h, w) sizes
(h, w in {40, 48, ..., 96}), released in six survey data releases at steps 0, 70, 140,
210, 280 and 350 (11 sizes each, the last 9); each batch is of one size drawn from those
released so far, and each new size makes oneDNN cache the conv primitives for it (~400-630
KiB of heap). LEAK from step 160 (per-size caching before and after it is healthy).

What it does: batches of 8 single-band cutouts of 4 classes (elliptical blob, two-armed
spiral, edge-on streak, merger) with random orientation, size, brightness and sky noise.
Model: 4 conv layers (16, 32, 32, 48 channels; stride 2 at the 2nd and 3rd; BN + ReLU),
global average pooling, linear 48->4. SGD(0.05, momentum 0.9), 400 steps, one thread. The
model is called directly on tensors built in the loop; the probe is one 24 x 24 cutout.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step; "floor" = the heap
once the step's batch, logits and loss are freed):
- Sizes: 58 distinct by step 399, first met 19 / 11 / 15 / 13 times in the four quarters;
  27 new-size steps before step 160 (step 0 included) and 31 from 160 on; the last new
  one at step 399.
- Heap: 125.7 MiB at step 0, 132.2 at 66, 138.9 at 133, 150.3 at 200, 167.0 at 266, 179.9
  at 333, 191.1 at 399.
- Where it rises (floor): steps 1-159 +15.94 MiB at 26 new-size steps (628 KiB each) vs
  +0.30 MiB over 133 repeat steps (2.3 KiB each); steps 160-399 +17.29 MiB at 31 new-size
  steps (571 KiB each) and +31.81 MiB over 209 repeat steps (155.8 KiB each: the leak).
- Control (the same script with the append disabled): steps 160-399 add +12.72 MiB at the
  31 new sizes (420 KiB each; the default 1024-entry oneDNN cache is evicting by then, with
  ONEDNN_PRIMITIVE_CACHE_CAPACITY=8192 it is 627 KiB each) and +0.20 MiB over the 209
  repeat steps (1.0 KiB each). So the kept graphs add ~156 KiB every step from step 160,
  ~36 MiB by step 399, comparable to the per-size growth (~29 MiB over the run).
- RSS: 407 MiB at step 0, 518 at 133, 595 at 200, 631 at 266, 656 at 333, 673 at 399.
- Training itself is fine: loss 1.40 at step 0, 40-step window means 0.98, 0.75, 0.64,
  0.47, 0.45, 0.46, 0.34, 0.27, 0.31, 0.32; finite throughout. About 13 s on 2 cores.
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
          "findings": [{"id": "memory_leak", "first_step": 160, "tolerance": 20}]}

STEPS, BATCH, CLASSES = 400, 8, 4
SIDES = tuple(range(40, 97, 8))        # cutout heights / widths (64 combinations)
RELEASES = (0, 70, 140, 210, 280, 350)  # survey data releases: each adds ~11 cutout sizes
CALIBRATION_FROM = 160                 # the probe-calibration tracking is switched on here

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


def galaxies(n, h, w, g):
    """n single-band cutouts of h x w: 0 elliptical (smooth Sersic-like blob), 1 spiral
    (two logarithmic arms), 2 edge-on disc (thin elongated streak), 3 merger (two blobs);
    random orientation, size and sky noise."""
    y = torch.linspace(-1, 1, h).view(1, h, 1)
    x = torch.linspace(-1, 1, w).view(1, 1, w)
    lab = torch.randint(0, CLASSES, (n,), generator=g)
    u = torch.rand(n, 5, generator=g).view(n, 5, 1, 1)
    th = u[:, 0] * math.pi
    xr = x * torch.cos(th) + y * torch.sin(th)
    yr = -x * torch.sin(th) + y * torch.cos(th)
    r = torch.sqrt(xr ** 2 + yr ** 2) + 1e-3
    size = 0.25 + 0.25 * u[:, 1]
    ell = torch.exp(-(r / size) ** 0.7 * 3)
    phi = torch.atan2(yr, xr)
    spiral = torch.exp(-r / size) * (1 + torch.cos(2 * phi - 6 * torch.log(r))) / 2
    edge = torch.exp(-(xr / size) ** 2 * 2 - (yr / (0.12 * size)) ** 2)
    off = 0.3 + 0.2 * u[:, 2]
    merger = (torch.exp(-((xr - off) ** 2 + yr ** 2) / (0.3 * size) ** 2)
              + 0.7 * torch.exp(-((xr + off) ** 2 + (yr - 0.1) ** 2) / (0.25 * size) ** 2))
    img = torch.stack([ell, spiral, edge, merger], 1)[torch.arange(n), lab]
    img = img * (0.6 + 0.8 * u[:, 3]) + 0.08 * torch.randn(n, h, w, generator=g)
    return img.unsqueeze(1), lab


class GalaxyNet(nn.Module):
    """Four 3x3 conv layers (16, 32, 32, 48 channels; stride 2 at the second and third) with
    BN and ReLU, global average pooling, linear head."""

    def __init__(self):
        super().__init__()
        chans = ((1, 16, 1), (16, 32, 2), (32, 32, 2), (32, 48, 1))
        self.body = nn.Sequential(*[m for cin, cout, s in chans for m in (
            nn.Conv2d(cin, cout, 3, s, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())])
        self.head = nn.Linear(48, CLASSES)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(12)
    pick = random.Random(2)
    combos = [(h, w) for h in SIDES for w in SIDES]
    pick.shuffle(combos)
    per = -(-len(combos) // len(RELEASES))
    released = []
    probe, _ = galaxies(1, 24, 24, g)   # a fixed probe cutout for calibration curves
    model = GalaxyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    probe_history = []
    seen, rows = set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            if step in RELEASES:                 # a data release: new cutout sizes
                k = RELEASES.index(step)
                released += combos[k * per:(k + 1) * per]
            h, w = pick.choice(released)         # a batch of one cutout size
            new = int((h, w) not in seen)
            seen.add((h, w))
            x, y = galaxies(BATCH, h, w, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= CALIBRATION_FROM:
                # THE BUG: probe probabilities for a calibration plot, computed without
                # torch.no_grad() and kept: each entry holds its forward graph (every saved
                # activation of the probe pass), one more every step
                model.eval()
                probe_history.append(model(probe).softmax(1))
                model.train()
            rec.step(loss=loss)
            heap, rss = heap_mib(), rss_mib()
            lv = loss.item()
            del x, y, logits, loss
            rows.append((new, heap, rss, lv, heap_mib()))
            if step % 50 == 0:
                print(f"step {step} size {h}x{w} loss {lv:.3f} sizes {len(seen)} "
                      f"kept {len(probe_history)} heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(CALIBRATION_FROM, STEPS))


if __name__ == "__main__":
    main()
