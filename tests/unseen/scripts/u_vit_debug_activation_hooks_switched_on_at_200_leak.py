"""Small Vision Transformer whose "activation dump" debugging switches on at step 200 (meant to
capture a few steps for a post-mortem): it registers forward hooks on all three encoder
blocks that append each block's detached output to a list, and the code that was to write
the list to disk and stop after 5 steps was never written. From step 200 every step keeps
3 x 32 x 65 x 64 float32 = 1.52 MiB of activations until the run ends: HOST MEMORY LEAK from
mid-run (flat for steps 0-199).

What it does: 10 classes of 1 x 32 x 32 images: each class is an arrangement of 3 small
bright squares (+2.0; fixed per class, positions jittered by up to 2 pixels) on N(0, 0.4) noise,
with 15% of each image's pixels set to 0 (dropout noise). Batches of 32. Model: 4x4 patches
(64 tokens) -> Linear 16->64, a class token, learned position embeddings, 3 pre-LN encoder
blocks (4 heads, MLP 128, dropout 0.1), LayerNorm, Linear 64->10 on the class token. AdamW(2e-3,
weight decay 0.05) with 25 warm-up steps then constant, 400 steps.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- Before step 200 the heap is flat: 127.9-129.4 MiB over steps 0-199 (slope 0.004 MiB/step).
- From step 200 it grows by 1.525 MiB every step to the end: 130.3 at 200, 206.5 at 250, 283.0
  at 300, 359.0 at 350, 433.5 at 399; no plateau.
- RSS: 445.3-502.0 MiB over 0-199 (502.0 from step ~110 to 199), 494.4 at 200-201, then 611.5
  at 250, 732.3 at 300, 858.5 at 350, 982.4 at 399 (2.43-2.59 MiB/step).
- Training itself is fine, if slow to start: loss near ln 10 = 2.30 for ~150 steps (means
  2.35, 2.33, 2.31, 2.31 per 40-step window), then 2.03, 1.59, 1.20, 0.89, 0.62, 0.49; batch
  accuracy 0.875 at step 399; finite throughout. About 45 s.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 200, "tolerance": 15},
    ],
}

STEPS, BATCH, CLASSES, DIM, DEPTH, PATCH, WARMUP, DEBUG_FROM = 400, 32, 10, 64, 3, 4, 25, 200

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


def layouts(g):
    """Per class, 3 square top-left corners in a 32 x 32 image (squares are 5 x 5)."""
    return torch.randint(2, 25, (CLASSES, 3, 2), generator=g)


def make_batch(layout, g):
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    x = 0.4 * torch.randn(BATCH, 1, 32, 32, generator=g)
    jitter = torch.randint(-2, 3, (BATCH, 3, 2), generator=g)
    corners = (layout[y] + jitter).clamp(0, 27).tolist()
    for i, squares in enumerate(corners):
        for r, c in squares:
            x[i, 0, r:r + 5, c:c + 5] += 2.0
    keep = (torch.rand(BATCH, 1, 32, 32, generator=g) > 0.15).float()
    return x * keep, y


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(PATCH * PATCH, DIM)
        self.cls = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos = nn.Parameter(torch.randn(1, (32 // PATCH) ** 2 + 1, DIM) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, 4, 128, dropout=0.1, batch_first=True,
                                       norm_first=True) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        p = F.unfold(x, PATCH, stride=PATCH).transpose(1, 2)           # (B, 64, 16)
        h = torch.cat([self.cls.expand(len(x), -1, -1), self.patch(p)], 1) + self.pos
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h[:, 0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)
    layout = layouts(g)
    model = ViT()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    dumped = []                    # the leak: filled by the hooks, never written out or cleared

    def keep_output(module, inputs, output):
        dumped.append(output.detach())

    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == DEBUG_FROM:
                for blk in model.blocks:
                    blk.register_forward_hook(keep_output)
                print(f"step {step}: activation dump on", flush=True)
            x, y = make_batch(layout, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step in (DEBUG_FROM - 1, DEBUG_FROM + 1) or step == STEPS - 1:
                held = sum(t.numel() for t in dumped) * 4 / 2 ** 20
                print(f"step {step} loss {loss.item():.4f} acc {acc.item():.3f} dumped "
                      f"{len(dumped)} tensors ({held:.1f} MiB) rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 50, 100, 150, 199, 200, 201, 250, 300, 350, 399),
           segments=((0, 199), (20, 199), (200, 399), (200, 299), (300, 399)))


if __name__ == "__main__":
    main()
