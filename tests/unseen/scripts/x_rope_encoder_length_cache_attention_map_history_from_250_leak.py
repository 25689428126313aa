"""Rotary-position transformer encoder classifying which of 4 Markov sources produced a
sequence, on batches of one of 240 lengths (20..259) drawn uniformly, with a user-level cache
keyed by length (rotary cos/sin tables and a 129-token local-window mask, L x L float32): new
lengths keep arriving through the run (97, 60, 30 and 24 first sightings in the four
quarters; 211 by the end, one new at the last step) and each adds its tables (healthy on its
own: 22.9 MiB for 211 lengths). From step 250 an "attention-drift plot" is switched on: each
step keeps a detached copy of the last layer's head-averaged attention map of the batch's
first sequence (L x L floats, 1.6-262 KiB, 87 KiB on average) in a list that is never
cleared. HOST MEMORY LEAK from step 250, ~87 KiB a step at every step; before it the heap
rises only at steps with a new length.

What it does: 8 sequences a batch; 4 sparse Markov chains over 40 tokens (4 likely
successors per token each); label = the chain. Model: embedding (dim 64), 2 pre-LN blocks (4
heads, rotary q/k, window mask, MLP 256), LayerNorm, mean over positions, Linear 64->4.
AdamW(1e-3, wd 0.01), 25 warm-up steps, 500 steps; tokens and seq_len passed to rec.step.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Lengths: 49 by step 50, 97 by 125, 119 by 166, 157 by 250, 180 by 333, 188 by 375, 205 by
  450, 211 at 499. New on 42% of steps, on 22% of steps 250-499 (54 of 250).
- Attention history: 0.2 MiB at step 250, 4.1 at 300, 8.7 at 350, 13.2 at 400, 18.1 at 450,
  21.3 at the end (250 maps).
- Heap: 127.8 MiB at step 0, 139.1 at 50, 145.0 at 125, 148.6 at 166, 155.6 at 250, 166.7 at
  333, 172.0 at 375, 182.5 at 450, 186.4 at 499.
- Where it rises: steps 1-249 +26.29 MiB at 156 new-length steps (+173 KiB each) vs +1.26 MiB
  at 93 repeat steps (+14 KiB each; +2.73 and -1.25 MiB of that at steps 50 and 53, the
  recorder's own: a side run with a no-op recorder gave +0.03 MiB at those 93 steps and no
  such moves); steps 250-499 +16.65 MiB at 196 repeat steps (+87 KiB each:
  the leak) and +14.39 MiB at 54 new-length steps (+273 KiB each: leak + tables).
- RSS: 398.1 MiB at step 0, 566.2 at 50, 619.9 at 125, 736.1 at 250, 736.3 at 333, 736.4 at
  375 (the history first fills memory the allocator already held), 768.0 at 450, 768.1 at
  499.
- Training is fine apart from the leak: loss 1.31 at step 0 (ln 4 = 1.39), 50-step window
  means 0.88, 0.13, 0.03, 0.09, 0.05, 0.04, 0.05, 0.01, 0.04, 0.08; finite throughout. About
  22 s on 2 cores.
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

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 250, "tolerance": 25},
    ],
}

STEPS, BATCH, VOCAB, DIM, HEADS, LAYERS, CLASSES = 500, 8, 40, 64, 4, 2, 4
LENGTHS = tuple(range(20, 260))                 # 240 possible sequence lengths
HISTORY_FROM = 250


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


def report(trace, spans=()):
    """Print the measured truths; trace holds (loss, RSS MiB, heap MiB, new shape?) per step,
    optionally a fifth column: the heap once the step's batch and outputs are freed (its
    floor). The rise is split into thirds of the run and into the (first, last) spans given."""
    n = len(trace)
    new = [s for s, t in enumerate(trace) if t[3]]
    q = (n + 3) // 4
    print(f"[shapes] {len(new)} distinct shapes; first seen per quarter of the run: "
          + ", ".join(f"{a}-{min(a + q, n) - 1}: {sum(a <= s < a + q for s in new)}"
                      for a in range(0, n, q))
          + f"; last new shape at step {new[-1]}")
    for s in sorted({0, n // 10, n // 4, n // 3, n // 2, 2 * n // 3, 3 * n // 4, 9 * n // 10,
                     n - 1}):
        loss, rss, heap = trace[s][:3]
        floor = f" (floor {trace[s][4]:.1f})" if len(trace[s]) > 4 else ""
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB{floor} "
              f"(shapes so far {sum(x <= s for x in new)})")
    for a, b in ((1, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n), *spans):
        a = max(a, 1)
        rows = []
        cols = ((2, "heap"), (1, "rss")) + (((4, "heap floor"),) if len(trace[0]) > 4 else ())
        for i, name in cols:
            dn = [trace[s][i] - trace[s - 1][i] for s in range(a, b) if trace[s][3]]
            dr = [trace[s][i] - trace[s - 1][i] for s in range(a, b) if not trace[s][3]]
            rows.append(f"{name} {sum(dn):+.2f} MiB at {len(dn)} new-shape steps "
                        f"({sum(dn) / max(len(dn), 1) * 1024:+.1f} KiB each), "
                        f"{sum(dr):+.2f} MiB at {len(dr)} repeat steps "
                        f"({sum(dr) / max(len(dr), 1) * 1024:+.1f} KiB each)")
        print(f"[rise] steps {a}-{b - 1}: " + "; ".join(rows))
    big = [(s, trace[s][2] - trace[s - 1][2]) for s in range(1, n)
           if not trace[s][3] and abs(trace[s][2] - trace[s - 1][2]) >= 0.25]
    print(f"[repeat] heap moves of 0.25 MiB or more at repeat-shape steps: {len(big)} "
          + ", ".join(f"{s}:{d:+.2f}" for s, d in big[:20]))
    w = max(n // 10, 1)
    print("[loss] window means: " + ", ".join(
        f"{sum(t[0] for t in trace[a:a + w]) / len(trace[a:a + w]):.3f}" for a in range(0, n, w)))


class RotaryCache:
    """Per sequence length L, built on first use and kept: the rotary cos and sin tables
    (L x head_dim each) and a key-padding-free local-window mask (L x L, float32, 0 inside a
    window of 64 tokens, -inf outside). One entry per distinct length."""

    def __init__(self):
        self.store = {}

    def get(self, length):
        if length not in self.store:
            hd = DIM // HEADS
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            ang = torch.arange(length, dtype=torch.float32).view(-1, 1) * inv.view(1, -1)
            ang = torch.cat([ang, ang], 1)
            i = torch.arange(length)
            window = (i.view(1, -1) - i.view(-1, 1)).abs() <= 64
            mask = torch.zeros(length, length).masked_fill(~window, float("-inf"))
            self.store[length] = (ang.cos(), ang.sin(), mask)
        return self.store[length]

    def nbytes(self):
        return sum(t.numel() * 4 for v in self.store.values() for t in v)


def rotate(x, cos, sin):
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.last_attention = None

    def forward(self, x, cos, sin, mask):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        att = ((q @ k.transpose(-1, -2)) / math.sqrt(DIM // HEADS) + mask).softmax(-1)
        self.last_attention = att
        y = (att @ v).transpose(1, 2).reshape(b, n, DIM)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class RopeEncoder(nn.Module):
    """Bidirectional encoder with rotary positions and a local window, mean-pooled, classifying
    which of CLASSES Markov sources produced the sequence."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)
        self.cache = RotaryCache()

    def forward(self, tok):
        cos, sin, mask = self.cache.get(tok.shape[1])
        x = self.emb(tok)
        for blk in self.blocks:
            x = blk(x, cos, sin, mask)
        return self.head(self.ln(x).mean(1))


def sources(g):
    """CLASSES sparse Markov chains over the same vocabulary (4 likely successors each)."""
    out = []
    for _ in range(CLASSES):
        logits = torch.full((VOCAB, VOCAB), -3.0)
        nxt = torch.stack([torch.randperm(VOCAB, generator=g)[:4] for _ in range(VOCAB)])
        logits.scatter_(1, nxt, torch.tensor([2.5, 2.0, 1.5, 1.0]).expand(VOCAB, 4))
        out.append(logits.softmax(1))
    return torch.stack(out)


def make_batch(length, trans, g):
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    tok = torch.empty(BATCH, length, dtype=torch.long)
    tok[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
    for t in range(1, length):
        tok[:, t] = torch.multinomial(trans[labels, tok[:, t - 1]], 1, generator=g).squeeze(1)
    return tok, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(61)
    pick = random.Random(67)
    trans = sources(g)
    model = RopeEncoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 25))
    trace, kept = [], []
    attention_history = []     # "for the attention-drift plot": filled every step, never cleared
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            length = pick.choice(LENGTHS)
            new = length not in model.cache.store
            x, y = make_batch(length, trans, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if step >= HISTORY_FROM:      # debugging switched on mid-run: the leak
                a = model.blocks[-1].last_attention[0].mean(0).detach().clone()   # (L, L)
                attention_history.append(a)
                kept.append(a.numel() * 4)
            for blk in model.blocks:
                blk.last_attention = None
            acc = (logits.argmax(1) == y).float().mean().item()
            rec.step(loss=loss, acc=acc, seq_len=length, tokens=x.numel(),
                     cached_lengths=len(model.cache.store))
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap, new))
            if step % 50 == 0 or step == STEPS - 1:
                print(f"step {step} len {length} loss {loss.item():.4f} acc {acc:.2f} lengths "
                      f"{len(model.cache.store)} cache {model.cache.nbytes() / 2 ** 20:.1f} MiB "
                      f"history {sum(kept) / 2 ** 20:.1f} MiB rss {rss:.1f} heap {heap:.1f}",
                      flush=True)
    report(trace, spans=((0, HISTORY_FROM), (HISTORY_FROM, STEPS)))
    print(f"[cache] {len(model.cache.store)} lengths, {model.cache.nbytes() / 2 ** 20:.2f} MiB")
    print(f"[leak] attention history: {len(kept)} maps from step {HISTORY_FROM}, "
          f"{sum(kept) / 2 ** 20:.2f} MiB, {sum(kept) / len(kept) / 1024:.1f} KiB per step on "
          f"average (min {min(kept) / 1024:.1f}, max {max(kept) / 1024:.1f})")


if __name__ == "__main__":
    main()
