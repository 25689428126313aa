"""Sentiment CNN over a frozen "pretrained" word embedding (30,000 x 96) and a frozen hashed
sub-word embedding (65,536 x 32), unfrozen in two stages with `opt.add_param_group`: words at
step 180, hashed sub-words at step 320. AdamW creates each table's exp_avg / exp_avg_sq at its
first step, and the table gets a dense gradient from then on. The heap therefore rises twice,
once each (+33 MiB, then +24 MiB), and is flat between and after. HEALTHY: optimizer state
created lazily (a staircase), not a leak.

What it does: sequences of 64 tokens. Filler words have Zipf-ish ids in 40..29,999. Each
position is, with probability 0.12, one of 40 sentiment words (even id positive, odd
negative). Label = the polarity that occurs more often, with 5% flipped. Model: concat(word
emb, hashed emb of (id * 7919 + 13) mod 65,536) -> Conv1d(128->128, k3) -> ReLU -> mean- and
max-pool -> MLP 256->64->2. AdamW(3e-3, wd 0.01) on the conv + MLP from step 0; the word table
is added at step 180 and the hashed table at step 320 (lr 3e-4, wd 0). Batch 64, 480 steps.

What is TRUE of the run (measured, 2 runs, identical losses; heap = glibc mallinfo2 uordblks +
hblkhd, RSS from psutil, right after rec.step):
- Adam state: 0.50 MiB for steps 0-179, 22.48 MiB from step 180, 38.48 MiB from step 320.
- Heap: 144.8-145.1 MiB over steps 0-179 (slope +0.001 MiB/step). It jumps to 178.1 at step
  180 (+33.0 MiB = 22.0 Adam state + 11.0 dense word-embedding gradient) and stays at
  178.1-178.2 over 180-319. It jumps to 202.2 at step 320 (+24.0 = 16.0 Adam state + 8.0
  gradient) and stays at 202.2-202.3 to step 479 (slope +0.0002 to +0.001 MiB/step).
- RSS follows in a few steps, with run-to-run differences: 452-459 MiB at step 0, 472-482 at
  179, 488-502 at 180, 520-530 over 200-319 (a transient 530 at step 200 in run 1), 532-546
  from 350 on, flat at the end (542.3 / 545.6-545.7 over 400-479).
- Training is healthy: loss 0.72 at step 0, 40-step means 0.690, 0.566, 0.424, 0.436, 0.397,
  0.355, 0.393, 0.385, 0.368, 0.376, 0.361, 0.403 (label noise and ties keep it near 0.36);
  accuracy 0.55 -> ~0.85. Finite. No loss jump at either unfreezing.
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

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, SEQ, VOCAB, DIM = 480, 64, 64, 30000, 96
HASH_BUCKETS, HASH_DIM, SENTIMENT_WORDS = 65536, 32, 40
UNFREEZE_WORDS, UNFREEZE_HASH = 180, 320

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


class HashedSentimentCNN(nn.Module):
    """Word embedding (30,000 x 96, 'pretrained', frozen at first) and a hashed sub-word
    embedding (65,536 x 32, frozen at first), concatenated, a Conv1d (k 3), mean- and max-pool,
    MLP."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(VOCAB, DIM)
        self.hashed = nn.Embedding(HASH_BUCKETS, HASH_DIM)
        self.conv = nn.Conv1d(DIM + HASH_DIM, 128, 3, padding=1)
        self.mlp = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, ids):
        hashed = (ids * 7919 + 13) % HASH_BUCKETS
        x = torch.cat([self.words(ids), self.hashed(hashed)], -1).transpose(1, 2)
        h = F.relu(self.conv(x))
        return self.mlp(torch.cat([h.mean(-1), h.amax(-1)], -1))


def make_batch(g):
    """Zipf-ish filler word ids in 40..29,999; ids 0..39 are the sentiment lexicon (even id
    positive, odd negative), each position one with probability 0.12; the label is which
    polarity occurs more often (ties -> positive), 5% of labels flipped."""
    ranks = torch.rand(BATCH, SEQ, generator=g).pow(3.0)
    ids = SENTIMENT_WORDS + (ranks * (VOCAB - SENTIMENT_WORDS)).long().clamp(
        max=VOCAB - SENTIMENT_WORDS - 1)
    plant = torch.rand(BATCH, SEQ, generator=g) < 0.12
    ids = torch.where(plant, torch.randint(0, SENTIMENT_WORDS, (BATCH, SEQ), generator=g), ids)
    senti = ids < SENTIMENT_WORDS
    pos = (senti & (ids % 2 == 0)).sum(1)
    neg = (senti & (ids % 2 == 1)).sum(1)
    y = (neg > pos).long()
    flip = torch.rand(BATCH, generator=g) < 0.05
    return ids, torch.where(flip, 1 - y, y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(21)
    model = HashedSentimentCNN()
    model.words.weight.requires_grad_(False)
    model.hashed.weight.requires_grad_(False)
    opt = torch.optim.AdamW(list(model.conv.parameters()) + list(model.mlp.parameters()),
                            lr=3e-3, weight_decay=0.01)
    trace = []
    t0 = time.time()

    def state_mib():
        return sum(v.numel() * v.element_size() for s in opt.state.values()
                   for v in s.values() if torch.is_tensor(v)) / 2 ** 20

    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            if step == UNFREEZE_WORDS:         # stage 2: fine-tune the word embedding too
                model.words.weight.requires_grad_(True)
                opt.add_param_group({"params": [model.words.weight], "lr": 3e-4,
                                     "weight_decay": 0.0})
            if step == UNFREEZE_HASH:          # stage 3: and the hashed sub-word table
                model.hashed.weight.requires_grad_(True)
                opt.add_param_group({"params": [model.hashed.weight], "lr": 3e-4,
                                     "weight_decay": 0.0})
            ids, y = make_batch(g)
            logits = model(ids)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            acc = (logits.argmax(-1) == y).float().mean().item()
            rss, heap = memory_mib()
            trace.append((step, loss.item(), acc, rss, heap, state_mib()))
            if step % 40 == 0 or step in (UNFREEZE_WORDS, UNFREEZE_WORDS + 1, UNFREEZE_HASH,
                                          UNFREEZE_HASH + 1):
                print(f"step {step} loss {loss.item():.4f} acc {acc:.2f} rss {rss:.1f} heap "
                      f"{heap:.1f} adam state {trace[-1][5]:.2f} MiB", flush=True)
    print(f"[time] {time.time() - t0:.1f} s")
    for a, b in ((0, 49), (50, 179), (181, 319), (200, 319), (321, 479), (340, 479)):
        print(f"[slope] steps {a}-{b}: rss {slope(trace, a, b, 3):+.4f} MiB/step, heap "
              f"{slope(trace, a, b, 4):+.4f} MiB/step")
    for s in (0, 1, 10, 50, 100, 178, 179, 180, 181, 182, 200, 250, 318, 319, 320, 321, 322, 350,
              400, 479):
        t = trace[s]
        print(f"[mem] step {s}: rss {t[3]:.1f} heap {t[4]:.1f} adam state {t[5]:.2f} MiB")
    for a in range(0, STEPS, 40):
        part = trace[a:a + 40]
        n = len(part)
        print(f"[win] steps {a}-{a + n - 1}: loss {sum(p[1] for p in part) / n:.4f} acc "
              f"{sum(p[2] for p in part) / n:.3f} rss {min(p[3] for p in part):.1f}-"
              f"{max(p[3] for p in part):.1f} heap {min(p[4] for p in part):.1f}-"
              f"{max(p[4] for p in part):.1f}")


if __name__ == "__main__":
    main()
