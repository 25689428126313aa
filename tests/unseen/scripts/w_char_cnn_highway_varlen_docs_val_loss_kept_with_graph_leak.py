"""Character-level CNN (Kim-style: parallel convolutions of widths 3/5/7, max over time, two
highway layers) classifying documents of 64-448 characters, batches padded to their longest
document. After each training step it scores a small held-out batch "for a smooth validation
curve" without torch.no_grad() and appends the un-detached val loss to a list: every kept loss
holds its autograd graph and all activations that forward saved for a backward that never
comes (~1 MiB a step, more for longer val documents). HOST MEMORY LEAK from step 0, under
input shapes that change every step (203 distinct padded lengths).

What it does: 4 topics, each marked by 6 random keywords of 3-6 letters; a document is random
filler words with 12% of its words from its topic's keywords and 2% from any topic's.
Characters: 26 letters, space, pad. Train batches of 16, val batches of 3 (their own stream).
Model: Embedding(28, 16), Conv1d 16->32 (k = 3, 5, 7) + ReLU, masked max over time, 2 highway
layers (96), dropout 0.2, Linear 96->4. Adam(2e-3), 420 steps.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- The list holds one graph per step: 420 at the end.
- Heap: 127.2 MiB at step 0, 157.8 at 25, 243.8 at 100, 341.5 at 200, 435.9 at 300, 529.9 at
  400, 547.0 at 419: +1.00 MiB/step on average (slopes +1.17 MiB/step over 0-99, +0.97 over
  100-249, +0.93 over 250-419); no plateau.
- RSS: 407.2 MiB at step 0, 452.1 at 25, 556.9 at 100, 659.3 at 200, 752.9 at 300, 859.9 at
  400, 877.2 at 419 (+1.02 MiB/step over 20-419).
- Training itself is fine: loss 1.47 at step 0 (ln 4 = 1.39), 42-step window means 1.38, 0.97,
  0.45, 0.28, 0.29, 0.23, 0.24, 0.17, 0.18, 0.19; finite throughout. About 14 s on 2 cores.
- A second recording (the harness's run) gave the same heap figures (within 0.4 MiB) and RSS
  within 2 MiB.
"""

import argparse
import ctypes
import random

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 0, "tolerance": 21},
    ],
}

STEPS, BATCH, VAL_BATCH, CLASSES, ALPHABET = 420, 16, 3, 4, 28   # 26 letters, space, pad
PAD, SPACE = 0, 1
MIN_LEN, MAX_LEN = 64, 448

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


def make_keywords(rng):
    """Per class, 6 random 'words' of 3-6 letters that mark the topic."""
    return [["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 6)))
             for _ in range(6)] for _ in range(CLASSES)]


def document(label, keywords, rng):
    """A document of 64-448 characters: random filler words, with 4-10 of its class's keywords
    (and 1-2 keywords of other classes as noise) dropped in."""
    target = rng.randint(MIN_LEN, MAX_LEN)
    words = []
    while sum(len(w) + 1 for w in words) < target:
        r = rng.random()
        if r < 0.12:
            words.append(rng.choice(keywords[label]))
        elif r < 0.14:
            words.append(rng.choice(keywords[rng.randrange(CLASSES)]))
        else:
            words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                 for _ in range(rng.randint(2, 7))))
    text = " ".join(words)[:target]
    return [SPACE if c == " " else ord(c) - ord("a") + 2 for c in text]


def make_batch(n, keywords, rng):
    """n documents padded to the longest of them."""
    labels = [rng.randrange(CLASSES) for _ in range(n)]
    docs = [document(y, keywords, rng) for y in labels]
    top = max(len(d) for d in docs)
    x = torch.full((n, top), PAD, dtype=torch.long)
    for i, d in enumerate(docs):
        x[i, :len(d)] = torch.tensor(d)
    return x, torch.tensor(labels)


class Highway(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.h, self.t = nn.Linear(dim, dim), nn.Linear(dim, dim)
        nn.init.constant_(self.t.bias, -1.0)

    def forward(self, x):
        gate = torch.sigmoid(self.t(x))
        return gate * F.relu(self.h(x)) + (1 - gate) * x


class CharCNN(nn.Module):
    """Character embeddings, parallel 1-D convolutions of widths 3, 5 and 7 with max-over-time
    pooling (Kim-style), two highway layers, a linear classifier."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(ALPHABET, 16, padding_idx=PAD)
        self.convs = nn.ModuleList(nn.Conv1d(16, 32, k, padding=k // 2) for k in (3, 5, 7))
        self.highway = nn.Sequential(Highway(96), Highway(96))
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(96, CLASSES)

    def forward(self, x):
        e = self.emb(x).transpose(1, 2)
        pad = (x == PAD).unsqueeze(1)
        feats = [F.relu(c(e)).masked_fill(pad, 0).amax(2) for c in self.convs]
        return self.out(self.drop(self.highway(torch.cat(feats, 1))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = random.Random(31)
    keywords = make_keywords(rng)
    val_rng = random.Random(32)
    model = CharCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    val_curve = []       # the leak: val losses kept as tensors, each with its forward's graph
    trace, seen = [], set()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            model.train()
            x, y = make_batch(BATCH, keywords, rng)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # "cheap" held-out check every step for a smooth validation curve, with no
            # torch.no_grad(): the loss tensor keeps its autograd graph and every activation
            # the forward saved for a backward that never comes
            model.eval()
            vx, vy = make_batch(VAL_BATCH, keywords, val_rng)
            val_loss = F.cross_entropy(model(vx), vy)
            val_curve.append(val_loss)
            smooth = sum(v.item() for v in val_curve[-20:]) / len(val_curve[-20:])
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc, val_loss_smooth=smooth, tokens=int((x != PAD).sum()),
                     max_len=x.shape[1])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            seen.add(x.shape[1])
            seen.add(vx.shape[1])
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} len {x.shape[1]}/{vx.shape[1]} loss {loss.item():.4f} "
                      f"acc {acc.item():.3f} val {smooth:.4f} kept {len(val_curve)} graphs "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 25, 50, 100, 150, 200, 250, 300, 350, 400, STEPS - 1),
           segments=((0, 99), (100, 249), (250, STEPS - 1), (0, STEPS - 1), (20, STEPS - 1)))
    print(f"[shapes] {len(seen)} distinct padded lengths (train and val batches)")


if __name__ == "__main__":
    main()
