"""Small ResNet-style CNN classifying coloured shapes. From step 100 an online "linear probe"
callback registers a forward hook on stage3 every step to grab that batch's features, and
never removes it. Each hook's closure holds its own step's batch x (24 x 3 x 16 x 16 float32
= 72 KiB) and labels, so the heap grows by ~74 KiB per step from step 100. Every forward also
runs all the hooks registered so far (400 by the end). LEAK from step 100.

What it does: 16x16 RGB images, 4 classes (disc, square, triangle, plus sign), random centre,
size 3.5-6 px and colour, on a noisy background (N(0, 0.1) pixel noise). Model: stem Conv
3->32, three stages of [Conv, BN, ReLU, Conv, BN, ReLU] (32, 64 stride 2, 64 stride 2), global
mean, Linear(64, 4). SGD(0.05, momentum 0.9, wd 5e-4), batch 24, 500 steps.

What is TRUE of the run (measured, 2 runs, identical losses; heap = glibc mallinfo2 uordblks +
hblkhd, RSS from psutil, right after rec.step):
- Steps 0-99: heap 127.35-127.82 MiB (0.0 KiB/step over 50-99). RSS 410 -> 424-427 (+8 to
  +10 KiB/step over 50-99).
- From step 100: hooks on stage3 = step - 99. Heap 127.72 at 100, 128.44 at 110, 131.33 at
  150, 135.05 at 200, 142.37 at 300, 149.3 at 400, 156.4-156.5 at 499. Slopes +72 to +75
  KiB/step over 100-199, 200-349 and 350-499, +73.5 over 100-499 (linear), +28.8 MiB in all.
- RSS: flat for ~90 steps after 100 (free malloc space is reused), then 429 at 200, 439-440
  at 300, 465-467 at 400, 477-478 at 499 (+154 to +161 KiB/step over 100-499).
- The hooks cost time too: median step 27-29 ms before step 100 and ~39 ms over 450-499. The
  machine is shared, so the windows in between are noisy.
- Training is healthy and unaffected: loss 50-step means 0.585, 0.045, 0.052, 0.026, 0.007,
  0.007, 0.024, 0.018, 0.045, 0.022; accuracy 0.76 -> 0.99. Finite.
- Root cause: a memory leak starting at step 100.
- About 15-17 s of training (19-21 s wall) on 2 shared cores, 1 thread.
"""

import argparse
import ctypes
import time

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 100, "tolerance": 25}],
          "forbidden": ["loss_divergence", "gradient_explosion", "nonfinite"]}

STEPS, BATCH, SIZE, CLASSES, PROBE_FROM = 500, 24, 16, 4, 100

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


_MI = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, heap) in MiB; heap = glibc mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MI is not None:
        mi = _MI()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(trace, a, b, i):
    part = trace[a:b + 1]
    xm = (len(part) - 1) / 2
    return (sum((x - xm) * p[i] for x, p in enumerate(part))
            / sum((x - xm) ** 2 for x in range(len(part))))


def shapes_batch(g):
    """Coloured shapes on a noisy background: 0 disc, 1 square, 2 triangle, 3 plus sign;
    random centre, size 3.5-6 px, RGB colour, background level and N(0, 0.1) noise."""
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    ys, xs = torch.meshgrid(torch.arange(SIZE.__float__()), torch.arange(SIZE.__float__()),
                            indexing="ij")
    cx = torch.rand(BATCH, 1, 1, generator=g) * 6 + 5
    cy = torch.rand(BATCH, 1, 1, generator=g) * 6 + 5
    r = torch.rand(BATCH, 1, 1, generator=g) * 2.5 + 3.5
    dx, dy = xs - cx, ys - cy
    masks = torch.stack([
        dx ** 2 + dy ** 2 <= r ** 2,
        (dx.abs() <= r * 0.8) & (dy.abs() <= r * 0.8),
        (dy <= r * 0.7) & (dy >= -r * 0.9) & (dx.abs() <= (dy + r * 0.9) * 0.6),
        ((dx.abs() <= r) & (dy.abs() <= r * 0.3)) | ((dy.abs() <= r) & (dx.abs() <= r * 0.3)),
    ], 1).float()                                                   # (B, 4, H, W)
    mask = masks[torch.arange(BATCH), y][:, None]                   # (B, 1, H, W)
    colour = torch.rand(BATCH, 3, 1, 1, generator=g) * 0.7 + 0.3
    bg = torch.rand(BATCH, 1, 1, 1, generator=g) * 0.3
    x = bg + mask * colour + 0.1 * torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
    return x, y


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.stage1 = self._block(32, 32, 1)
        self.stage2 = self._block(32, 64, 2)
        self.stage3 = self._block(64, 64, 2)
        self.head = nn.Linear(64, CLASSES)

    @staticmethod
    def _block(a, b, stride):
        return nn.Sequential(nn.Conv2d(a, b, 3, stride, 1), nn.BatchNorm2d(b), nn.ReLU(),
                             nn.Conv2d(b, b, 3, 1, 1), nn.BatchNorm2d(b), nn.ReLU())

    def forward(self, x):
        h = self.stage3(self.stage2(self.stage1(self.stem(x))))
        return self.head(h.mean((2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(12)
    model = SmallResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    probe_log = {}

    def attach_probe(step, x, y):
        """Grab the stage-3 features of this batch for an online linear probe."""
        def probe(module, inputs, output):
            probe_log["latest"] = (step, output.detach().mean((2, 3)), x, y)
        return model.stage3.register_forward_hook(probe)

    handles = []
    trace = []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            ts = time.perf_counter()
            x, y = shapes_batch(g)
            if step >= PROBE_FROM:       # probe callback enabled; BUG: the handle is never removed
                handles.append(attach_probe(step, x, y))
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            dt = time.perf_counter() - ts
            acc = (logits.argmax(-1) == y).float().mean().item()
            rss, heap = memory_mib()
            trace.append((step, loss.item(), acc, rss, heap, len(model.stage3._forward_hooks), dt))
            if step % 25 == 0 or PROBE_FROM - 1 <= step <= PROBE_FROM + 1:
                print(f"step {step} loss {loss.item():.4f} acc {acc:.2f} rss {rss:.1f} heap "
                      f"{heap:.2f} hooks on stage3 {trace[-1][5]} step {dt * 1e3:.1f} ms",
                      flush=True)
    print(f"[time] {time.time() - t0:.1f} s")
    print(f"[hooks] {len(model.stage3._forward_hooks)} forward hooks on stage3 at the end; each "
          f"closure keeps its batch: x {tuple(x.shape)} float32 = "
          f"{x.numel() * 4 / 1024:.0f} KiB + labels")
    for a, b in ((0, 99), (50, 99), (100, 199), (200, 349), (350, 499), (100, 499)):
        print(f"[slope] steps {a}-{b}: rss {slope(trace, a, b, 3) * 1024:+.1f} KiB/step, heap "
              f"{slope(trace, a, b, 4) * 1024:+.1f} KiB/step")
    for s in (0, 25, 50, 98, 99, 100, 101, 110, 150, 200, 300, 400, 499):
        t = trace[s]
        print(f"[mem] step {s}: rss {t[3]:.1f} heap {t[4]:.2f} hooks {t[5]}")
    for a in range(0, STEPS, 50):
        part = trace[a:a + 50]
        n = len(part)
        print(f"[win] steps {a}-{a + n - 1}: loss {sum(p[1] for p in part) / n:.4f} acc "
              f"{sum(p[2] for p in part) / n:.3f} step ms "
              f"{sorted(p[6] for p in part)[n // 2] * 1e3:.1f}"
              f" rss {min(p[3] for p in part):.1f}-{max(p[3] for p in part):.1f} heap "
              f"{min(p[4] for p in part):.2f}-{max(p[4] for p in part):.2f}")


if __name__ == "__main__":
    main()
