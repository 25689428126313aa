"""Small Transformer encoder that finds the most frequent token (the mode) of a sequence. From
step 250, for an "attention GIF after training", every step appends a detached copy of both
layers' attention weights for the batch's first 4 samples (2 x 4 x 4 heads x 32 x 32 float32
= 128 KiB) to a list that is only read after training. The heap grows by a steady ~127 KiB per
step from step 250 to the end. LEAK from step 250.

What it does: [CLS] + 31 tokens over a vocabulary of 12. Token frequencies per sequence ~
Dirichlet(0.6); label = the most frequent token (ties -> smallest id). Model: embedding 64
(no positions needed), 2 pre-LN blocks (hand-written 4-head attention that keeps its softmax
weights; FFN 64->256->64, GELU), LayerNorm, Linear on [CLS]. AdamW(1e-3, wd 0.01), batch 64,
500 steps.

What is TRUE of the run (measured, 2 runs, identical losses; heap = glibc mallinfo2 uordblks +
hblkhd, RSS from psutil, right after rec.step):
- Steps 0-249: heap 129.8-130.8 MiB (slope +0.001 to +0.003 MiB/step). RSS warms up from 421
  to 449-453 by step 100, then 449-467 (a one-off +14 MiB step near 210-248 in run 1).
- From step 250: 250 frames kept by step 499, 31.2 MiB of weights. Heap 130.5 at 250, 131.8 at
  260, 136.8-136.9 at 300, 143.1-143.3 at 350, 149.5-149.7 at 400, 155.8-156.0 at 450,
  161.8-162.0 at 499. Slopes +0.126 to +0.128 MiB/step over 250-349, 350-499 and 250-499.
- RSS lags at first (free malloc space is reused: flat for the first ~10-50 steps after 250).
  It then climbs: 467 -> 497 (run 1) and 453 -> 494 (run 2) by step 499, +0.14 to +0.17
  MiB/step over 250-499.
- Training is healthy and unaffected: loss 50-step means 1.20, 0.39, 0.31, 0.27, 0.24, 0.23,
  0.20, 0.19, 0.19, 0.21; accuracy 0.66 -> 0.92 (ties and near-ties limit it). Finite.
- Root cause: a memory leak starting at step 250.
- About 17-21 s of training (22-26 s wall) on 2 shared cores, 1 thread.
"""

import argparse
import ctypes
import math
import time

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 250, "tolerance": 25}],
          "forbidden": ["loss_divergence", "gradient_explosion", "nonfinite"]}

STEPS, BATCH, SEQ, VOCAB, DIM, HEADS, LAYERS = 500, 64, 32, 12, 64, 4, 2
VIZ_FROM, VIZ_SAMPLES = 250, 4

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


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.last_weights = None

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        w = (q @ k.transpose(-1, -2) / math.sqrt(DIM // HEADS)).softmax(-1)   # (B, H, T, T)
        self.last_weights = w
        return self.out((w @ v).transpose(1, 2).reshape(b, t, DIM))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention()
        self.ff = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ff(self.ln2(x))


class ModeFinder(nn.Module):
    """[CLS] + 31 tokens -> which token is the most frequent (the mode)."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB + 1, DIM)          # id VOCAB = [CLS]
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.tok(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x[:, 0]))


def make_batch(g):
    """Skewed token frequencies per sequence (Dirichlet(0.6) over the 12 tokens), so the mode
    is usually but not always clear; ties go to the smallest id."""
    p = torch.distributions.Dirichlet(torch.full((VOCAB,), 0.6)).sample((BATCH,))
    toks = torch.multinomial(p, SEQ - 1, replacement=True, generator=g)
    counts = F.one_hot(toks, VOCAB).sum(1)
    y = counts.argmax(-1)
    ids = torch.cat([torch.full((BATCH, 1), VOCAB), toks], 1)
    return ids, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    model = ModeFinder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    attention_frames = []        # for an animated attention GIF after training
    trace = []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            ids, y = make_batch(g)
            logits = model(ids)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step >= VIZ_FROM:        # switched on once training "looks stable"
                attention_frames.append([blk.attn.last_weights[:VIZ_SAMPLES].detach().clone()
                                         for blk in model.blocks])
            rec.step(loss=loss)
            acc = (logits.argmax(-1) == y).float().mean().item()
            rss, heap = memory_mib()
            trace.append((step, loss.item(), acc, rss, heap, len(attention_frames)))
            if step % 25 == 0 or VIZ_FROM - 1 <= step <= VIZ_FROM + 1:
                print(f"step {step} loss {loss.item():.4f} acc {acc:.2f} rss {rss:.1f} heap "
                      f"{heap:.1f} frames {len(attention_frames)}", flush=True)
    print(f"[time] {time.time() - t0:.1f} s")
    per = sum(t.numel() * t.element_size() for t in attention_frames[0]) / 1024
    print(f"[frames] {len(attention_frames)} kept, {per:.0f} KiB of attention weights each, "
          f"{per * len(attention_frames) / 1024:.1f} MiB in all")
    for a, b in ((0, 99), (100, 249), (150, 249), (250, 349), (350, 499), (250, 499)):
        print(f"[slope] steps {a}-{b}: rss {slope(trace, a, b, 3):+.4f} MiB/step, heap "
              f"{slope(trace, a, b, 4):+.4f} MiB/step")
    for s in (0, 50, 100, 150, 200, 248, 249, 250, 251, 260, 300, 350, 400, 450, 499):
        t = trace[s]
        print(f"[mem] step {s}: rss {t[3]:.1f} heap {t[4]:.1f} frames {t[5]}")
    for a in range(0, STEPS, 50):
        part = trace[a:a + 50]
        n = len(part)
        print(f"[win] steps {a}-{a + n - 1}: loss {sum(p[1] for p in part) / n:.4f} acc "
              f"{sum(p[2] for p in part) / n:.3f} rss {min(p[3] for p in part):.1f}-"
              f"{max(p[3] for p in part):.1f} heap {min(p[4] for p in part):.1f}-"
              f"{max(p[4] for p in part):.1f}")


if __name__ == "__main__":
    main()
