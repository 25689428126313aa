"""Residual-MLP regressor with a gradient-noise diagnostic that switches on after warm-up:
from step 120 every step stores clones of two hidden layers' weight gradients in a dict keyed
by the step, meant as a 20-step sliding window for a gradient-noise-scale estimate. The
estimate reads only the last 20 keys, but nothing ever deletes the older ones, so the dict
grows by 2 x 512 x 512 float32 = 2 MiB a step from step 120 to the end: HOST MEMORY LEAK from
mid-run (flat before step 120).

What it does: 64 input features (N(0, 1), each mixed with 0.5 x its neighbour); target = 3 x a
fixed random tanh network of them (width 32) plus 0.5 x sin(2 x a random projection) plus
N(0, 0.1) noise, divided by 1.2. Batches of 128. Model: Linear 64->512, 4 residual blocks
(LayerNorm -> Linear 512->512 -> GELU, added to the stream), LayerNorm, Linear 512->1. MSE
loss, Adam(5e-4), cosine decay to 5e-5 over 400 steps. The diagnostic (from step 120):
snapshots[step] = {name: grad.clone()} for blocks 1 and 2's weights; every 20 steps it
prints the ratio of the window's gradient variance to its squared mean gradient norm.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- Before step 120 the heap is flat: 142.9-143.4 MiB over steps 0-119 (slope 0.002 MiB/step).
- From step 120 it grows by 2.00 MiB every step to the end: 145.2 at 120, 205.2 at 150, 305.4
  at 200, 505.6 at 300, 703.7 at 399 (slope 2.002 MiB/step over 120-399); no plateau.
- RSS: 411.5-433.9 MiB over 0-119; still 433.9 at steps 120-121 (freed memory is reused
  first), then 507.3 at 150, 600.9 at 200, 881.0 at 300, 1171.8 at 399 (2.3-2.9 MiB/step),
  with a +38 MiB move every 20 steps from step 141 (the estimate stacks its 20-step window).
- Training itself is fine: loss 5.33 at step 0, 0.42 at 50, means 0.86, 0.45, 0.43, 0.39,
  0.35, 0.35, 0.32, 0.30, 0.30, 0.29 per 40-step window; gradient noise ratio 18-35;
  finite throughout. About 20 s.
"""

import argparse
import ctypes
import math

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 120, "tolerance": 15},
    ],
}

STEPS, BATCH, FEATURES, WIDTH, BLOCKS = 400, 128, 64, 512, 4
DIAG_FROM, WINDOW, WATCHED = 120, 20, ("blocks.1.linear.weight", "blocks.2.linear.weight")

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


class Teacher:
    def __init__(self, g):
        self.mix = torch.eye(FEATURES) + 0.5 * torch.diag(torch.ones(FEATURES - 1), 1)
        self.w1 = torch.randn(FEATURES, 32, generator=g) / math.sqrt(FEATURES)
        self.w2 = torch.randn(32, 1, generator=g) / math.sqrt(32)
        self.proj = torch.randn(FEATURES, 1, generator=g) / math.sqrt(FEATURES)

    def batch(self, g):
        x = torch.randn(BATCH, FEATURES, generator=g) @ self.mix
        y = torch.tanh(x @ self.w1) @ self.w2 * 3 + 0.5 * torch.sin(2 * x @ self.proj)
        y = y + 0.1 * torch.randn(BATCH, 1, generator=g)
        return x, y / 1.2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, h):
        return h + F.gelu(self.linear(self.norm(h)))


class ResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.norm = nn.LayerNorm(WIDTH)
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(self.norm(h))


def noise_ratio(snapshots):
    """tr(Var g) / |E g|^2 over the last WINDOW snapshots (all watched weights together)."""
    keys = sorted(snapshots)[-WINDOW:]
    g = torch.stack([torch.cat([snapshots[k][n].flatten() for n in WATCHED]) for k in keys])
    return float(g.var(0).sum() / g.mean(0).pow(2).sum().clamp_min(1e-12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(8)
    teacher = Teacher(g)
    model = ResMLP()
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS, eta_min=5e-5)
    params = dict(model.named_parameters())
    snapshots = {}                   # the leak: keyed by step, never trimmed to the window
    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = teacher.batch(g)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            if step >= DIAG_FROM:
                snapshots[step] = {n: params[n].grad.detach().clone() for n in WATCHED}
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 20 == 0 and len(snapshots) >= WINDOW:
                print(f"step {step} gradient noise ratio {noise_ratio(snapshots):.2f}")
            if step % 25 == 0 or step in (DIAG_FROM - 1, DIAG_FROM + 1) or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} snapshots {len(snapshots)} "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 50, 100, 119, 120, 121, 150, 200, 300, 399),
           segments=((0, 119), (20, 119), (120, 399), (120, 199), (200, 299), (300, 399)))


if __name__ == "__main__":
    main()
