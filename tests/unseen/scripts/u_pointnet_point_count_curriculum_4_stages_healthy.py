"""PointNet classifier of synthetic 3-D shapes with a point-count curriculum: the clouds have
256, 512, 1024, then 2048 points per shape in four 100-step stages. At each stage's first step
the stage's training set (1600 clouds, one pass) is sampled at the new point count and held in
memory, replacing the last one, so host memory climbs a staircase that levels off within each
stage. HEALTHY (memory that tracks the input size, not a leak).

What it does: 8 shape classes (sphere, cube surface, cylinder, cone, torus, square plate,
helix, ellipsoid), each cloud scaled by 0.7-1.3, rotated about z at random and jittered with
N(0, 0.02) noise; batches of 16 clouds. Model: shared per-point MLP Conv1d 3->32->64->128 (1x1,
BatchNorm, ReLU), max-pool over points, Linear 128->128->8 with dropout 0.2. Adam(1e-3), 400
steps; stage k (k = 0..3) covers steps 100k..100k+99 and uses 256 * 2**k points; its dataset
is a (1600, 3, points) float32 tensor: 4.7, 9.4, 18.8, then 37.5 MiB.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- The heap is a staircase, flat within each stage: 130.5-130.8 MiB over steps 0-99,
  135.9 over 100-199, 145.8-145.9 over 200-299, 165.1 over 300-399 (in-stage slopes 0.003
  MiB/step or less). It steps only at the stage boundaries: +5.2 MiB at step 100, +9.8 at
  200, +19.2 at 300 (the new stage's dataset replacing the last one: +4.7, +9.4, +18.8 MiB).
- RSS follows the stages, noisily, and differs from run to run. In the recorded run: 417-432
  MiB over stage 0, 455-490 over stage 1 (+23 at step 100), 526-574 over stage 2 (+36 at
  200), and in stage 3 it swings by 30-110 MiB from one step to the next between ~630 and
  ~780 MiB (glibc giving back and re-faulting the 16 MiB activation blocks), 766 at step 399.
  In other runs of this script stage 3 held at 540-550 MiB, or stepped up once by ~100 MiB
  near step 360 and held. Within stages 0-2 RSS creeps 0.09-0.33 MiB/step; each stage is
  bounded (100 steps) and nothing is kept from one stage to the next.
- Training is fine: loss 2.00 at step 0 (ln 8 = 2.08), mean 1.49 over steps 0-39, 0.39 over
  80-119, 0.14 over 200-239, 0.03 over 360-399; batch accuracy 0.94-1.0 from step 100;
  finite throughout. About 32 s on the 2-core machine.
"""

import argparse
import ctypes
import math

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, STAGE_LEN, BATCH, CLASSES = 400, 100, 16, 8
POINTS = (256, 512, 1024, 2048)

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MALLINFO2 is not None:
        mi = _MALLINFO2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(part, i):
    """Least-squares slope of column i of part (MiB per step)."""
    if len(part) < 2:
        return 0.0
    xm = (len(part) - 1) / 2
    den = sum((x - xm) ** 2 for x in range(len(part)))
    return sum((x - xm) * p[i] for x, p in enumerate(part)) / den


def report(trace, marks, segments):
    """Print the measured truths from trace, a list of (loss, RSS MiB, heap MiB) per step."""
    n = len(trace)
    for s in marks:
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean "
              f"{sum(p[0] for p in part) / len(part):.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a, b in segments:
        part = trace[a:b + 1]
        print(f"[slope] steps {a}-{b}: rss {slope(part, 1):+.3f} MiB/step, "
              f"heap {slope(part, 2):+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1], trace[s][2] - trace[s - 1][2])
             for s in range(1, n) if abs(trace[s][1] - trace[s - 1][1]) >= 8
             or abs(trace[s][2] - trace[s - 1][2]) >= 4]
    print("[jumps] RSS moves of 8 MiB or heap moves of 4 MiB or more (step:rss/heap): "
          + ", ".join(f"{s}:{d:+.0f}/{h:+.1f}" for s, d, h in jumps[:40]))


def shape_points(kind, n, g):
    """n points on the surface (or curve) of shape kind, roughly in [-1, 1]^3."""
    u = torch.rand(n, generator=g)
    v = torch.rand(n, generator=g)
    two_pi = 2 * math.pi
    if kind == 0:                                   # sphere
        p = torch.randn(n, 3, generator=g)
        return p / p.norm(dim=1, keepdim=True)
    if kind == 1:                                   # cube surface
        p = torch.rand(n, 3, generator=g) * 2 - 1
        axis = torch.randint(0, 3, (n,), generator=g)
        side = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
        p[torch.arange(n), axis] = side
        return p
    if kind == 2:                                   # cylinder
        a = u * two_pi
        return torch.stack([a.cos(), a.sin(), v * 2 - 1], 1)
    if kind == 3:                                   # cone
        a, r = u * two_pi, 1 - v
        return torch.stack([r * a.cos(), r * a.sin(), v * 2 - 1], 1)
    if kind == 4:                                   # torus
        a, b = u * two_pi, v * two_pi
        r = 0.7 + 0.3 * b.cos()
        return torch.stack([r * a.cos(), r * a.sin(), 0.3 * b.sin()], 1)
    if kind == 5:                                   # square plate
        return torch.stack([u * 2 - 1, v * 2 - 1, torch.zeros(n)], 1)
    if kind == 6:                                   # helix
        t = u * 4 * math.pi
        return torch.stack([t.cos(), t.sin(), t / (2 * math.pi) - 1], 1)
    p = torch.randn(n, 3, generator=g)              # ellipsoid
    return p / p.norm(dim=1, keepdim=True) * torch.tensor([1.0, 0.5, 0.25])


def make_stage(n, g):
    """STAGE_LEN * BATCH clouds of n points, (count, 3, n), and their labels."""
    labels = torch.randint(0, CLASSES, (STAGE_LEN * BATCH,), generator=g)
    clouds = []
    for k in labels.tolist():
        p = shape_points(k, n, g)
        ang = float(torch.rand((), generator=g)) * 2 * math.pi
        c, s = math.cos(ang), math.sin(ang)
        rot = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        scale = 0.7 + 0.6 * float(torch.rand((), generator=g))
        p = p @ rot.T * scale + 0.02 * torch.randn(n, 3, generator=g)
        clouds.append(p.T)
    return torch.stack(clouds), labels


class PointNet(nn.Module):
    def __init__(self):
        super().__init__()
        layers, width = [], 3
        for out in (32, 64, 128):
            layers += [nn.Conv1d(width, out, 1), nn.BatchNorm1d(out), nn.ReLU()]
            width = out
        self.point_mlp = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Dropout(0.2),
                                  nn.Linear(128, CLASSES))

    def forward(self, x):
        return self.head(self.point_mlp(x).amax(dim=2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = PointNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    trace = []
    stage_x = stage_y = None
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            n = POINTS[min(step // STAGE_LEN, len(POINTS) - 1)]
            if step % STAGE_LEN == 0:
                stage_x = stage_y = None            # drop the last stage's set first
                stage_x, stage_y = make_stage(n, g)
            i = (step % STAGE_LEN) * BATCH
            x, y = stage_x[i:i + BATCH], stage_y[i:i + BATCH]
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc, points=n)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step % STAGE_LEN in (1, STAGE_LEN - 1):
                print(f"step {step} points {n} loss {loss.item():.4f} acc {acc.item():.3f} "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 50, 99, 100, 150, 199, 200, 250, 299, 300, 350, 399),
           segments=((0, 99), (10, 99), (100, 199), (110, 199), (200, 299), (210, 299),
                     (300, 399), (310, 399)))


if __name__ == "__main__":
    main()
