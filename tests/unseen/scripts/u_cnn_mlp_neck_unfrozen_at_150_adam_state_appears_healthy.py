"""Image classifier fine-tuned in two phases: for steps 0-149 the conv stem and the large MLP
"neck" (5.51 M parameters) are frozen and only the head trains; at step 150 they are unfrozen.
Adam builds its state for a parameter the first time that parameter has a gradient, so at
step 150 host memory steps up once by the neck's gradients plus Adam's exp_avg and
exp_avg_sq (3 x 21.0 MiB) and then stays flat. HEALTHY (lazily created optimizer state, a
one-time step, not a leak).

What it does: 10 classes of 3 x 32 x 32 images: each class is a fixed random smooth template
(Gaussian-blurred noise, 40 x 40); a sample is a 32 x 32 crop of its template at an offset of
1-7 pixels (one offset per batch), scaled by a contrast of 0.6-1.4, plus N(0, 0.8) noise.
Batches of 64. Model: stem Conv 3->16 (stride 2) -> ReLU -> Conv 16->32 (stride 2) -> ReLU (->
32 x 8 x 8 = 2048 features), neck Linear 2048->1536 -> ReLU -> Linear 1536->1536 -> ReLU, head
Linear 1536->10. One Adam over two parameter groups from step 0: stem+neck at lr 1e-4, head at
lr 1e-3; zero_grad sets grads to None, so no state exists for the frozen parameters until step
150. 400 steps.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- Adam state: 0.1 MiB (head only) for steps 0-149, 42.2 MiB from step 150.
- The heap is flat at 148.0-148.2 MiB over steps 0-149, steps up by 65.0 MiB at step 150
  (213.1: the backbone's gradients and Adam's two moments, 3 x 21.0 MiB, plus the larger
  backward), and stays at 213.1-213.5 to step 399 (slope 0.002 MiB/step over 150-399).
- RSS: 455.2-474.8 MiB over 0-149 (one +15 MiB move at step 100), +52 at step 150 (526.5),
  549.1 by step 200, 557.4 from step ~275 to the end (slope 0.000 over 300-399).
- Training is fine: loss 2.30 at step 0 (ln 10), falling slowly while only the head trains
  on frozen random features (means 2.26, 2.18, 2.10 per 40 steps, 1.85 at step 149), then
  fast once the backbone is unfrozen: 0.24 mean over 160-199, 0.002-0.02 per window after;
  finite throughout. About 25 s.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, CLASSES, UNFREEZE_AT = 400, 64, 10, 150

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


def templates(g):
    noise = torch.randn(CLASSES, 3, 40, 40, generator=g)
    k = torch.exp(-torch.arange(-3, 4, dtype=torch.float32) ** 2 / 4.0)
    k = (k[:, None] * k[None, :]) / (k.sum() ** 2)
    smooth = F.conv2d(noise.reshape(-1, 1, 40, 40), k[None, None], padding=3)
    smooth = smooth.reshape(CLASSES, 3, 40, 40)
    return smooth / smooth.std(dim=(1, 2, 3), keepdim=True)


def make_batch(tmpl, g):
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    dy, dx = torch.randint(1, 8, (2,), generator=g).tolist()
    x = tmpl[y, :, dy:dy + 32, dx:dx + 32]
    contrast = 0.6 + 0.8 * torch.rand(BATCH, 1, 1, 1, generator=g)
    return contrast * x + 0.8 * torch.randn(BATCH, 3, 32, 32, generator=g), y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Flatten())
        self.neck = nn.Sequential(nn.Linear(2048, 1536), nn.ReLU(),
                                  nn.Linear(1536, 1536), nn.ReLU())
        self.head = nn.Linear(1536, CLASSES)

    def forward(self, x):
        return self.head(self.neck(self.stem(x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(4)
    tmpl = templates(g)
    model = Net()
    backbone = [*model.stem.parameters(), *model.neck.parameters()]
    for p in backbone:
        p.requires_grad_(False)
    opt = torch.optim.Adam([{"params": backbone, "lr": 1e-4},
                            {"params": model.head.parameters(), "lr": 1e-3}])
    n_backbone = sum(p.numel() for p in backbone)
    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == UNFREEZE_AT:
                for p in backbone:
                    p.requires_grad_(True)
                print(f"step {step}: unfreezing {n_backbone:,} parameters "
                      f"({n_backbone * 4 / 2 ** 20:.1f} MiB)", flush=True)
            x, y = make_batch(tmpl, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step in (UNFREEZE_AT - 1, UNFREEZE_AT + 1) or step == STEPS - 1:
                state = sum(t.numel() for s in opt.state.values() for t in s.values()
                            if torch.is_tensor(t) and t.dim() > 0)
                print(f"step {step} loss {loss.item():.4f} acc {acc.item():.3f} "
                      f"adam state {state * 4 / 2 ** 20:.1f} MiB "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 50, 100, 149, 150, 151, 200, 250, 300, 350, 399),
           segments=((0, 149), (20, 149), (150, 399), (160, 399), (300, 399)))


if __name__ == "__main__":
    main()
