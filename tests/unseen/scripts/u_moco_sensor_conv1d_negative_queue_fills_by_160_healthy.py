"""MoCo-style contrastive pre-training of a 1-D CNN on accelerometer windows with a queue of
negative keys: the queue is a deque that keeps the key batches of the last 160 steps, so it
(and the logits against it) grow for the first 160 of 400 steps and then stay the same size:
the oldest batch leaves as each new one comes in. HEALTHY (a bounded queue that fills, not a
leak).

What it does: synthetic 3-axis accelerometer windows (128 samples) from 10 latent activities
(each a sum of up to 3 sinusoids per axis, each kept with probability 0.7, frequencies 1-13
cycles per window, jittered by +-10% and given a random phase per window, plus N(0, 0.2)
noise). Two views per window: random amplitude scaling 0.8-1.2 per axis, a circular time
shift of up to 16 samples and N(0, 0.1) jitter. Query encoder: Conv1d 3->32->64->128 (kernel
5, BN, ReLU, stride 2 on the last two), global average pool, projection MLP 128->256->256,
L2-normalised. Key encoder: a momentum (0.99) copy of it, no grad. Loss: InfoNCE at
temperature 0.1 over 1 positive, the batch's 95 other keys and all queued keys (96 per queued
batch, 15,360 when full). SGD(0.03, momentum 0.9, weight decay 1e-4), batches of 96, 400
steps. The queue: each step
appends the batch's 96 x 256 float32 keys (96 KiB) to deque(maxlen=160): 15 MiB when full at
step 160; the step's logits against it (96 x up to 15,456) and their gradient grow with it.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- The heap grows while the queue fills and is flat once it is full: 128.5 MiB at step 0,
  136.9 at 40, 143.5 at 80, 148.7 at 120, 154.0 at 159 (0.15 MiB/step), then 154.0-154.1
  from step 160 to 399 (slope 0.000 MiB/step).
- RSS: 417.4 MiB at step 0, 551.5 at 159 (0.76 MiB/step over 0-159); after that 551.5-568.5
  over 160-279 and 566.4-566.8 over 280-399 (slopes 0.035 over 200-399, -0.001 over
  300-399).
- Training is fine: loss 4.23 at step 0 (95 in-batch negatives only, ln 96 = 4.56), 5.06 at
  step 25 as queued negatives arrive (mean 5.12 over 0-39), then 4.05, 3.56, 3.49, 3.59,
  3.56, 3.47, 3.20, 3.03, 3.05 per 40-step window while the negatives grow to 15,455; top-1
  0.37 at step 0, 0.96 at 399; finite throughout. About 35 s.
"""

import argparse
import copy
import ctypes
import math
from collections import deque

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, LENGTH, ACTIVITIES = 400, 96, 128, 10
QUEUE_BATCHES, DIM, TEMP, MOMENTUM = 160, 256, 0.1, 0.99

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


def activities(g):
    """Per activity and axis: 3 (amplitude, base frequency) pairs, some amplitudes zero."""
    amp = torch.rand(ACTIVITIES, 3, 3, generator=g) * (torch.rand(ACTIVITIES, 3, 3,
                                                                    generator=g) > 0.3)
    freq = 1 + torch.rand(ACTIVITIES, 3, 3, generator=g) * 12
    return amp, freq


def make_windows(acts, g):
    amp, freq = acts
    kind = torch.randint(0, ACTIVITIES, (BATCH,), generator=g)
    t = torch.arange(LENGTH, dtype=torch.float32) / LENGTH
    f = freq[kind] * (0.9 + 0.2 * torch.rand(BATCH, 3, 3, generator=g))
    phase = torch.rand(BATCH, 3, 3, generator=g) * 2 * math.pi
    waves = torch.sin(2 * math.pi * f[..., None] * t + phase[..., None])   # (B, 3, 3, T)
    x = (amp[kind][..., None] * waves).sum(2)
    return x + 0.2 * torch.randn(BATCH, 3, LENGTH, generator=g)


def augment(x, g):
    scale = 0.8 + 0.4 * torch.rand(x.shape[0], 3, 1, generator=g)
    shift = int(torch.randint(-16, 17, (1,), generator=g))
    return torch.roll(x * scale, shift, dims=2) + 0.1 * torch.randn(x.shape, generator=g)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(3, 32, 5, padding=2), nn.BatchNorm1d(32), nn.ReLU(),
            nn.Conv1d(32, 64, 5, stride=2, padding=2), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 128, 5, stride=2, padding=2), nn.BatchNorm1d(128), nn.ReLU())
        self.proj = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, DIM))

    def forward(self, x):
        return F.normalize(self.proj(self.conv(x).mean(2)), dim=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    acts = activities(g)
    query = Encoder()
    key = copy.deepcopy(query).requires_grad_(False)
    opt = torch.optim.SGD(query.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    queue = deque(maxlen=QUEUE_BATCHES)
    trace = []
    with Recorder(args.run_dir, model=query, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = make_windows(acts, g)
            q = query(augment(x, g))
            with torch.no_grad():
                k = key(augment(x, g))
            in_batch = q @ k.T                  # diagonal: positives; the rest: negatives
            if queue:
                logits = torch.cat([in_batch, q @ torch.cat(tuple(queue)).T], 1) / TEMP
            else:
                logits = in_batch / TEMP
            target = torch.arange(BATCH)
            loss = F.cross_entropy(logits, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for pk, pq in zip(key.parameters(), query.parameters(), strict=True):
                    pk.mul_(MOMENTUM).add_(pq, alpha=1 - MOMENTUM)
                for bk, bq in zip(key.buffers(), query.buffers(), strict=True):
                    bk.copy_(bq)
            queue.append(k)
            top1 = (logits.argmax(1) == target).float().mean()
            rec.step(loss=loss, top1=top1, negatives=logits.shape[1] - 1)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step in (QUEUE_BATCHES - 1, QUEUE_BATCHES) or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} top1 {top1.item():.3f} "
                      f"negatives {logits.shape[1] - 1} queue {len(queue)} "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 40, 80, 120, 159, 160, 200, 250, 300, 350, 399),
           segments=((0, 159), (20, 159), (160, 399), (200, 399), (300, 399)))


if __name__ == "__main__":
    main()
