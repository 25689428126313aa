"""Multi-label audio tagger (128 tags) whose training metrics keep every step's detached
outputs for an "epoch-end" mAP and retrieval score; the end-of-epoch code resets the
validation accumulator instead of the training one (a copy-paste slip), so the training
accumulator is never cleared: it grows by 64 x (128 + 128 + 1024) float32 = 320 KiB a step
for the whole run. HOST MEMORY LEAK from step 0.

What it does: synthetic log-mel clips (32 mel bins x 64 frames): N(0, 0.5) noise over a
spectral tilt plus 1-4 active tags per clip (Zipf(0.8) tag popularity); each tag is a fixed
spectro-temporal pattern (a band of 2-5 mel bins with its own amplitude-modulation rate and
length) added at a random time offset. Batches of 64. Model: 2-D CNN Conv 1->8->16->32 (3x3,
BN, ReLU, 2x2 max-pool after each), global average + max pooling over time and frequency (64
features), Linear 64->1024 (the clip embedding, ReLU), Linear 1024->128; BCE-with-logits.
AdamW(2e-3, weight decay 1e-4), 400 steps, an "epoch" every 50 steps. Each step the TagMetrics
accumulator appends sigmoid probabilities (64 x 128), targets as float (64 x 128) and
embeddings (64 x 1024), all detached; at each epoch end it concatenates everything it holds,
prints mAP over the tags seen and a retrieval hit rate, and then `val_metrics.reset()` is
called where `train_metrics.reset()` was meant (no validation ever runs here).

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- The heap grows from step 0 to the end, no plateau: 130.4 MiB at step 0, 151.1 at 50, 164.7
  at 100, 196.3 at 200, 227.8 at 300, 258.7 at 399 (slopes 0.356, 0.316, 0.314, 0.313
  MiB/step over the four quarters; 0.3125 expected).
- RSS lags it: 435.1 MiB at step 0, 546.2 at 50, 552.8 at 100, 675.2 at 200, then it barely
  moves for 160 steps while the allocator reuses freed memory (675.2-682.1 over steps
  200-359; slope 0.05 MiB/step over 200-299) and is 741.2 at step 399 (+59 at the last
  epoch end's concatenation).
- Training itself is fine: loss 0.74 at step 0, means 0.121, 0.085, 0.084, 0.080, 0.080,
  0.078, 0.075, 0.072, 0.070, 0.066 per 40-step window; the (cumulative, because of the bug)
  epoch-end mAP 0.023 -> 0.052 and retrieval@1 0.26 -> 0.64; finite throughout. About 31 s.
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
        {"id": "memory_leak", "first_step": 0, "tolerance": 15},
    ],
}

STEPS, BATCH, MELS, FRAMES, TAGS, EMB, EPOCH = 400, 64, 32, 64, 128, 1024, 50

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


class TagBank:
    """Per tag: a mel band (start, width), an amplitude-modulation rate and a length."""

    def __init__(self, g):
        self.width = torch.randint(2, 6, (TAGS,), generator=g)
        self.start = (torch.rand(TAGS, generator=g) * (MELS - self.width)).long()
        self.rate = 0.05 + 0.4 * torch.rand(TAGS, generator=g)
        self.length = torch.randint(12, 48, (TAGS,), generator=g)
        self.popularity = 1.0 / torch.arange(1, TAGS + 1, dtype=torch.float32) ** 0.8

    def batch(self, g):
        x = 0.5 * torch.randn(BATCH, 1, MELS, FRAMES, generator=g)
        x = x + torch.linspace(1.0, 0.0, MELS)[None, None, :, None]
        y = torch.zeros(BATCH, TAGS)
        counts = torch.randint(1, 5, (BATCH,), generator=g).tolist()
        t = torch.arange(FRAMES, dtype=torch.float32)
        for i, c in enumerate(counts):
            tags = torch.multinomial(self.popularity, c, generator=g).tolist()
            for k in tags:
                y[i, k] = 1.0
                s, w, n = int(self.start[k]), int(self.width[k]), int(self.length[k])
                off = int(torch.randint(0, FRAMES - n + 1, (1,), generator=g))
                env = 1.5 * (0.6 + 0.4 * torch.sin(self.rate[k] * t[off:off + n]))
                x[i, 0, s:s + w, off:off + n] += env
        return x, y


class TagMetrics:
    """Keeps detached outputs over an epoch; compute() at the epoch end, then reset()."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.probs, self.targets, self.embeddings = [], [], []

    def update(self, logits, targets, emb):
        self.probs.append(torch.sigmoid(logits).detach())
        self.targets.append(targets.detach().float())
        self.embeddings.append(emb.detach())

    def compute(self):
        p, y = torch.cat(self.probs), torch.cat(self.targets)
        aps = []
        for k in torch.nonzero(y.sum(0) > 0).flatten().tolist():
            order = torch.argsort(p[:, k], descending=True)
            hits = y[order, k]
            precision = hits.cumsum(0) / torch.arange(1, len(hits) + 1)
            aps.append(float((precision * hits).sum() / hits.sum()))
        e = F.normalize(torch.cat(self.embeddings)[-2048:], dim=1)
        sim = e @ e.T - 2 * torch.eye(len(e))
        nn_idx = sim.argmax(1)
        yy = y[-2048:]
        retrieval = float(((yy * yy[nn_idx]).sum(1) > 0).float().mean())
        return sum(aps) / max(len(aps), 1), retrieval, len(p)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        layers, cin = [], 1
        for cout in (8, 16, 32):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                       nn.MaxPool2d(2)]
            cin = cout
        self.cnn = nn.Sequential(*layers)
        self.embed = nn.Linear(64, EMB)
        self.head = nn.Linear(EMB, TAGS)

    def forward(self, x):
        h = self.cnn(x)
        pooled = torch.cat([h.mean(dim=(2, 3)), h.amax(dim=(2, 3))], 1)
        emb = F.relu(self.embed(pooled))
        return self.head(emb), emb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(9)
    bank = TagBank(g)
    model = Tagger()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    train_metrics, val_metrics = TagMetrics(), TagMetrics()
    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = bank.batch(g)
            logits, emb = model(x)
            loss = F.binary_cross_entropy_with_logits(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            train_metrics.update(logits, y, emb)
            if (step + 1) % EPOCH == 0:
                m_ap, retrieval, n = train_metrics.compute()
                print(f"epoch end at step {step}: mAP {m_ap:.3f} retrieval@1 {retrieval:.3f} "
                      f"over {n} clips", flush=True)
                val_metrics.reset()          # the bug: train_metrics.reset() was meant
            rec.step(loss=loss)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} held {len(train_metrics.probs)} "
                      f"batches rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 1, 10, 50, 100, 200, 300, 399),
           segments=((0, 99), (100, 199), (200, 299), (300, 399), (0, 399)))


if __name__ == "__main__":
    main()
