"""Decoder-only transformer language model whose forward keeps a user-level cache keyed by
sequence length: for each length it meets it builds, and keeps, a sinusoidal position table
(L x 64) and an ALiBi bias with the causal mask folded in (4 x L x L). Each batch has one of
41 lengths (32, 36, ..., 192), drawn uniformly, so the cache grows while new lengths appear
(38 of 41 by step 77, all 41 by step 146) and stops at 41 entries (10.4 MiB). HEALTHY (a cache
bounded by the number of distinct lengths, not a leak).

What it does: 8 sequences per batch from a fixed sparse Markov chain over 32 tokens (each
token has 4 likely successors; entropy floor 1.218 nats). Model: embedding, 2 pre-LN blocks
(4 heads, dim 64, MLP 256) with attention scores + the cached bias, LayerNorm, Linear 64->32.
AdamW(1e-3, wd 0.01), 30 warm-up steps, 500 steps; tokens per step passed to rec.step.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Cache: 1 entry at step 0, 38 (9.6 MiB) at step 100, 41 (10.37 MiB) from step 146 to the end.
  Lengths first seen at steps 0-77 (38 of them), then 111, 116 and 146.
- Heap: 128.1 MiB at step 0, 136.0 at 25, 140.1 at 50, 140.5 at 100, 141.5 at 150, then flat:
  141.5-142.2 MiB over steps 150-499 (slopes +0.101 MiB/step over 0-99, +0.008 over 100-249,
  0.000 over 250-499).
- RSS: 399.3 MiB at step 0, 483.8 at 25, 508.2 at 50, 515.7 at 100, flat 515.8-515.9 over
  steps 100-290, then two steps with no new length and the heap flat (allocator pages
  touched for the first time): +11 MiB at step 291 (526.8 to step ~400) and +14 MiB more
  between steps 400 and 450, in moves under 8 MiB each (541.0 from ~450 to the end).
- Training is fine: loss 3.66 at step 0 (ln 32 = 3.47), 50-step window means 2.64, 1.47, 1.32,
  1.30, 1.25, 1.25, 1.25, 1.24, 1.25, 1.25 (floor 1.218); finite throughout. About 15 s on
  2 cores.
- A second recording (the harness's run) gave the same heap figures (within 0.4 MiB) and RSS up
  to 18 MiB higher (527.2 at step 100, 533.5 at 200, 539.3 at 300-400, 553.5 from ~440 to the
  end).
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

STEPS, BATCH, VOCAB, DIM, HEADS, LAYERS = 500, 8, 32, 64, 4, 2
LENGTHS = tuple(range(32, 193, 4))           # 41 possible sequence lengths


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


class LengthTables:
    """Per-length tables built on first use and kept: a sinusoidal position table (L, DIM) and
    the ALiBi bias with the causal mask folded in (HEADS, L, L). One entry per distinct length,
    so the cache is bounded by the number of lengths the data has."""

    def __init__(self):
        self.pos, self.bias = {}, {}
        self.slopes = torch.tensor([2 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)])

    def get(self, length):
        if length not in self.pos:
            t = torch.arange(length, dtype=torch.float32).unsqueeze(1)
            freq = torch.exp(torch.arange(0, DIM, 2, dtype=torch.float32) * (-math.log(1e4) / DIM))
            pe = torch.zeros(length, DIM)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(t * freq), torch.cos(t * freq)
            i = torch.arange(length)
            dist = (i.view(1, -1) - i.view(-1, 1)).float()              # j - i (<= 0 allowed)
            bias = self.slopes.view(-1, 1, 1) * dist.unsqueeze(0)
            bias = bias.masked_fill(dist.unsqueeze(0) > 0, float("-inf"))
            self.pos[length], self.bias[length] = pe, bias.contiguous()
        return self.pos[length], self.bias[length]

    def nbytes(self):
        return sum(t.numel() * 4 for d in (self.pos, self.bias) for t in d.values())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x, bias):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(DIM // HEADS) + bias
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, DIM)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class DecoderLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB)
        self.tables = LengthTables()

    def forward(self, tok):
        pos, bias = self.tables.get(tok.shape[1])
        x = self.emb(tok) * math.sqrt(DIM) * 0.1 + pos
        for blk in self.blocks:
            x = blk(x, bias)
        return self.out(self.ln(x))


def markov_source(g):
    """A sparse random transition matrix: each token has 4 likely successors."""
    logits = torch.full((VOCAB, VOCAB), -4.0)
    nxt = torch.stack([torch.randperm(VOCAB, generator=g)[:4] for _ in range(VOCAB)])
    logits.scatter_(1, nxt, torch.tensor([3.0, 2.0, 1.5, 1.0]).expand(VOCAB, 4))
    return logits.softmax(1)


def make_batch(trans, g):
    """One length per batch, drawn uniformly from LENGTHS."""
    length = LENGTHS[int(torch.randint(0, len(LENGTHS), (1,), generator=g))] + 1
    tok = torch.empty(BATCH, length, dtype=torch.long)
    tok[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
    for t in range(1, length):
        tok[:, t] = torch.multinomial(trans[tok[:, t - 1]], 1, generator=g).squeeze(1)
    return tok[:, :-1], tok[:, 1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(21)
    trans = markov_source(g)
    floor = float(-(trans * trans.log()).sum(1).mean())
    model = DecoderLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    trace, first_seen = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = make_batch(trans, g)
            new = x.shape[1] not in model.tables.pos
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            rec.step(loss=loss, tokens=x.numel(), seq_len=x.shape[1],
                     cached_lengths=len(model.tables.pos))
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if new:
                first_seen.append((step, x.shape[1]))
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} len {x.shape[1]} loss {loss.item():.4f} (floor {floor:.3f}) "
                      f"cached lengths {len(model.tables.pos)} "
                      f"({model.tables.nbytes() / 2 ** 20:.1f} MiB) rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 25, 50, 100, 150, 200, 250, 300, 350, 400, 450, STEPS - 1),
           segments=((0, 99), (100, 249), (250, STEPS - 1), (350, STEPS - 1)))
    print(f"[shapes] {len(first_seen)} of {len(LENGTHS)} lengths seen; cache "
          f"{model.tables.nbytes() / 2 ** 20:.2f} MiB; first seen (step, len): {first_seen}")


if __name__ == "__main__":
    main()
