"""Transformer encoder sequence classifier on variable-length token sequences padded to the
longest sequence of each batch; the lengths are long-tailed (log-normal), so the padded
length changes from step to step and new, longer maxima keep appearing until mid-run (the
last at step 116 of 260). HEALTHY.

What it does: sequences of log-normal length (median 20 tokens, clipped to 6-320) over a
48-token vocabulary with a [CLS] token; marker tokens 2-5 are sprinkled in and the label is the
marker that occurs most often. Batches of 24 are padded to their longest sequence (+1 for
[CLS]) with a key-padding mask. Model: pre-norm nn.TransformerEncoder, 2 layers, d_model 64, 4
heads, FF 128, dropout 0.1, learned positions; head on [CLS]. AdamW(1e-3, wd 0.01), 30-step
warm-up then cosine, grad clip 1.0, 260 steps. Nothing is kept across steps but floats.

What is TRUE of the run (measured, three runs; heap = glibc mallinfo2 uordblks + hblkhd, RSS
from psutil, both right after rec.step):
- The padded length changes from step to step (31-321, median 78; 102 distinct lengths over the
  run); a new longest batch appears at steps 0 (133), 16 (143), 17 (158), 52 (245) and 116 (321,
  the cap).
- Loss 1.62 at step 0 (ln 4 = 1.39); mean 1.37 over steps 0-25, 0.93 over 26-51, 0.39 over
  52-77, 0.32 over 78-103, 0.22 over 104-129, then 0.16-0.22 per 26-step window to the end (0.16
  over the last 26); batch accuracy mostly 0.83-1.00 from step ~90. Finite throughout.
- Heap: 127.1 MiB at step 0, 127.5-127.9 MiB from step 52 to the end (flat; slope <= 0.006
  MiB/step in every quarter).
- RSS follows the length of the recent batches, not a trend: a long batch lifts it by 50-200 MiB
  (+201 MiB at step 52, padded to 245) and it falls back within a few steps (-148 at 53, -94 at
  56: glibc trims the freed heap top). The floor stays at ~472-486 MiB from step ~25 to the end.
  RSS at steps 0, 65, 130, 195, 259: 482, 472, 589, 480, 508 MiB (other runs: 482, 485, 530,
  483, 542 and 482, 485, 546, 516, 506). Window ranges: 482-562 (steps 0-25), 472-714 (52-77),
  480-656 (130-155), 480-553 (234-259). Quarter slopes +0.27, +0.99, -0.80, -0.46 MiB/step.
- Nothing is wrong: a healthy run whose memory moves with the padded length.
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
    "healthy": True,
    "findings": [],
}

STEPS, BATCH, VOCAB, CLASSES = 260, 24, 48, 4
MIN_LEN, MAX_LEN, LOG_MU, LOG_SIGMA = 6, 320, 3.0, 0.7
D_MODEL, HEADS, FF, LAYERS = 64, 4, 128, 2
PAD, CLS, MARKERS = 0, 1, (2, 3, 4, 5)
LR = 1e-3

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):
    _mallinfo2 = None
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _mallinfo2 is not None:
        mi = _mallinfo2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def summarize(trace):
    """Print the measured truths: (loss, RSS, heap) per step, as Python floats."""
    n = len(trace)
    for s in (0, n // 4, n // 2, 3 * n // 4, n - 1):
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        mean = sum(p[0] for p in part) / len(part)
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean {mean:.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a in range(0, n, n // 4):
        part = trace[a:a + n // 4]
        xs = range(len(part))
        xm = (len(part) - 1) / 2
        den = sum((x - xm) ** 2 for x in xs)
        slope = [sum((x - xm) * p[i] for x, p in zip(xs, part, strict=True)) / den for i in (1, 2)]
        print(f"[slope] steps {a}-{a + len(part) - 1}: rss {slope[0]:+.3f} MiB/step, "
              f"heap {slope[1]:+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1]) for s in range(1, n)
             if abs(trace[s][1] - trace[s - 1][1]) >= 4]
    print("[jumps] rss moves of 4 MiB or more: "
          + ", ".join(f"{s}:{d:+.0f}" for s, d in jumps[:40]))


def make_batch(g):
    """Sequences of log-normal length (median 20, clipped to 6-320 tokens) over filler tokens
    6..47, with a few 'marker' tokens 2-5 sprinkled in; the label is the marker that occurs
    most often (ties broken towards the lower marker). Padded to the batch's longest."""
    lengths = torch.exp(LOG_MU + LOG_SIGMA * torch.randn(BATCH, generator=g))
    lengths = lengths.round().long().clamp(MIN_LEN, MAX_LEN)
    width = int(lengths.max()) + 1                              # + the [CLS] position
    tokens = torch.randint(6, VOCAB, (BATCH, width), generator=g)
    markers = torch.randint(0, len(MARKERS), (BATCH, width), generator=g)
    # each sequence favours one marker: it gets 3x the weight of the other three
    favour = torch.randint(0, len(MARKERS), (BATCH,), generator=g)
    markers = torch.where(torch.rand(BATCH, width, generator=g) < 0.4, favour[:, None], markers)
    is_marker = torch.rand(BATCH, width, generator=g) < 0.25
    tokens = torch.where(is_marker, markers + MARKERS[0], tokens)
    tokens[:, 0] = CLS
    pos = torch.arange(width)[None]
    pad = pos > lengths[:, None]
    tokens = tokens.masked_fill(pad, PAD)
    counts = torch.stack([((tokens == m) & ~pad).sum(1) for m in MARKERS], 1)
    labels = counts.argmax(1)
    return tokens, pad, labels


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL, padding_idx=PAD)
        self.pos = nn.Embedding(MAX_LEN + 1, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, tokens, pad):
        pos = torch.arange(tokens.shape[1])
        h = self.encoder(self.embed(tokens) + self.pos(pos)[None], src_key_padding_mask=pad)
        return self.head(self.norm(h[:, 0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = Encoder()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 30) * 0.5 * (1 + math.cos(math.pi * s / STEPS)))
    longest = 0
    trace = []                                  # (loss, RSS, heap) per step: floats only
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            tokens, pad, labels = make_batch(g)
            logits = model(tokens, pad)
            loss = F.cross_entropy(logits, labels)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            acc = (logits.argmax(1) == labels).float().mean().item()
            rec.step(loss=loss, acc=acc, padded_len=tokens.shape[1])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            new = tokens.shape[1] > longest
            longest = max(longest, tokens.shape[1])
            if new or step % 30 == 0 or step == STEPS - 1:
                print(f"step {step} padded {tokens.shape[1]}{' NEW MAX' if new else ''} "
                      f"loss {loss.item():.4f} acc {acc:.2f} rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB", flush=True)
    summarize(trace)


if __name__ == "__main__":
    main()
