"""Small causal transformer language model trained with a token budget: every step draws a
length for its sequences (24-384 tokens, padded to a multiple of 16) and fills the batch with
as many sequences as fit 2,048 token slots (5-64 sequences), so batch size and padded
length change from step to step over 23 distinct batch shapes, each first seen at a
different step. Text from an order-2 Markov chain. HEALTHY.

What it does: text from an order-2 Markov chain over 48 tokens (a favoured successor of the
pair with p 0.6, one of 4 successors of the last token with p 0.3, uniform 0.1; entropy rate
~1.63 nats). Each step draws a length from 24-384, pads to the next multiple of 16 (23
possible widths) and takes 2048 // width sequences (5-64), real lengths within the last 16
tokens of the width (padding ignored by the loss). Model: pre-norm causal transformer, 2
layers, d_model 64, 4 heads, GELU MLP x4, learned positions, scaled_dot_product_attention.
AdamW(3e-3, betas 0.9/0.98, wd 0.05), 25-step warm-up then cosine to 10%, grad clip 1.0, 300
steps. Nothing is kept across steps but floats.

What is TRUE of the run (measured, three runs; heap = glibc mallinfo2 uordblks + hblkhd, RSS
from psutil, both right after rec.step):
- 23 distinct batch shapes; 17 are first seen by step 25, the rest at steps 36, 47, 51, 54, 63
  and 75; none is new after step 75.
- Loss 4.01 at step 0 (ln 48 = 3.87); mean 3.82 over steps 0-29, 3.44 over 30-59, 3.28 over
  60-89, 3.20 over 90-119, 3.15 over 150-179, 3.11 over 240-269, 3.09 over 270-299 (still
  falling slowly). Finite throughout.
- Heap: 128.6 MiB at step 0, 129.2 by step 29, a transient 131.0-132.2 MiB near steps 50-51,
  then 130.0-130.3 MiB from step 60 to the end (no trend).
- RSS grows while new shapes appear and is flat after: 413.9, 474.7, 477.9, 477.8, 476.8 MiB at
  steps 0, 75, 150, 225, 299 (other runs: 415.4, 486.6, 489.8, 489.1, 489.3 and 415.4, 466.4,
  480.0, 480.0, 479.9; the last rise at step 77 in run 3). Quarter slopes +0.74, +0.04, -0.00,
  -0.01 MiB/step (run 3: +0.58, +0.11, 0.00, 0.00). (The per-shape state is real: in an earlier
  variant with unbucketed lengths, a new shape on two steps in three, RSS grew ~1.4 MiB per new
  shape, 280 MiB over 300 steps, and a bare F.gelu fed a new shape each step grew ~1.5 MiB per
  shape; here widths are multiples of 16, so the growth stops once all 23 shapes have been
  seen.)
- Nothing is wrong: a healthy run whose memory grows with new shapes early and then levels off.
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

STEPS, TOKEN_BUDGET, MIN_LEN, MAX_LEN, MULTIPLE = 300, 2048, 24, 384, 16
VOCAB, D_MODEL, HEADS, LAYERS = 48, 64, 4, 2
PAD = VOCAB                                                  # padding id (input only)
LR = 3e-3

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


def markov_tables(g):
    """Order-2 chain: after (a, b) the next token is a favoured successor of the pair with
    probability 0.6, else one of 4 successors of b (order-1), else (10%) uniform."""
    pair_next = torch.randint(0, VOCAB, (VOCAB, VOCAB), generator=g)
    single_next = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
    return pair_next, single_next


def make_batch(length, tables, g):
    """As many sequences as fit TOKEN_BUDGET slots once padded to a multiple of 16; each one's
    real length is drawn from the 16 lengths that round up to that padded length."""
    pair_next, single_next = tables
    width = -(-length // MULTIPLE) * MULTIPLE
    batch = TOKEN_BUDGET // width
    lengths = torch.randint(max(MIN_LEN, width - MULTIPLE + 1), width + 1, (batch,), generator=g)
    seq = torch.empty(batch, width, dtype=torch.long)
    seq[:, :2] = torch.randint(0, VOCAB, (batch, 2), generator=g)
    for t in range(2, width):
        r = torch.rand(batch, generator=g)
        a, b = seq[:, t - 2], seq[:, t - 1]
        order1 = single_next[b, torch.randint(0, 4, (batch,), generator=g)]
        uniform = torch.randint(0, VOCAB, (batch,), generator=g)
        seq[:, t] = torch.where(r < 0.6, pair_next[a, b], torch.where(r < 0.9, order1, uniform))
    return seq.masked_fill(torch.arange(width)[None] >= lengths[:, None], PAD)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(),
                                 nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, D_MODEL))
        return x + self.mlp(self.ln2(x))


class CausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB + 1, D_MODEL, padding_idx=PAD)
        self.pos = nn.Embedding(MAX_LEN, D_MODEL)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))[None]
        return self.head(self.ln(self.blocks(h)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    tables = markov_tables(g)
    model = CausalLM()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 25)
        * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / STEPS))))
    shapes = set()
    trace = []                                  # (loss, RSS, heap) per step: floats only
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            length = int(torch.randint(MIN_LEN, MAX_LEN + 1, (1,), generator=g))
            seq = make_batch(length, tables, g)
            logits = model(seq[:, :-1])
            target = seq[:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1),
                                   ignore_index=PAD)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            rec.step(loss=loss, tokens=int((target != PAD).sum()), batch_size=seq.shape[0],
                     padded_len=seq.shape[1])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            new = tuple(seq.shape) not in shapes
            shapes.add(tuple(seq.shape))
            if new or step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} batch {tuple(seq.shape)}{' NEW' if new else ''} "
                      f"loss {loss.item():.4f} "
                      f"distinct shapes {len(shapes)} rss {rss:.1f} MiB heap {heap:.1f} MiB",
                      flush=True)
    summarize(trace)


if __name__ == "__main__":
    main()
