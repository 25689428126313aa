"""Bidirectional-LSTM frame tagger on unpadded sequences whose lengths keep arriving: at each
step, with probability 0.35 the batch is a length never seen before (16..200 frames), else a
length already seen. oneDNN caches RNN primitives per length, so the heap steps up ~340 KiB
at each new length (healthy on its own). On top of that, from step 0 the loop appends every
step's logits -- not detached -- to a list meant for an epoch-end confusion matrix that is
never consumed or cleared: 8 x length x 24 floats a step (12-150 KiB, 84.5 KiB on average)
plus the autograd nodes they keep. HOST MEMORY LEAK from step 0, ~100 KiB a step, at every
step whether its length is new or not.

What it does: 8 sequences a batch, 20 features a frame: runs of 3-12 frames of one of 24
tags, each frame = its tag's centroid (x0.8 of a fixed random vector) + N(0, 1); target =
the frame's tag. Model: BiLSTM (20 -> 48 each way, 1 layer) -> Linear 96->24 per frame.
Cross-entropy over frames, Adam(3e-3), grad-norm clip 1.0, 450 steps; seq_len and tokens
passed to rec.step.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Lengths: 18 by step 45, 36 by 112, 50 by 150, 67 by 225, 91 by 300, 102 by 337, 127 by
  405, 140 at 449 (36, 31, 35 and 38 first sightings in the four quarters: a constant rate,
  31% of steps).
- Kept logits: 4.2 MiB at step 50, 12.9 at 150, 20.7 at 250, 28.7 at 350, 37.1 at the end
  (450 tensors, 84.5 KiB a step on average, 12.0-150.0 KiB).
- Heap: 126.6 MiB at step 0, 136.5 at 45, 149.5 at 112, 158.1 at 150, 170.5 at 225, 185.3 at
  300, 192.5 at 337, 207.6 at 405, 216.4 at 449 (+89.8 MiB, no slowing: +31.3, +27.3, +31.1
  MiB by third).
- Where it rises: steps 1-149 +10.19 MiB at 100 repeat-length steps (+104 KiB each: the leak
  alone) and +21.15 MiB at 49 new-length steps (+442 KiB each: leak + oneDNN); 150-299 +10.08
  at 109 repeats (+95 KiB) and +17.25 at 41 new (+431 KiB); 300-449 +9.75 at 101 repeats
  (+99 KiB) and +21.35 at 49 new (+446 KiB).
- RSS: 405.5 MiB at step 0, 465.9 at 112, 485.8 at 225, 513.5 at 300, 554.5 at 405, 569.0
  at 449 (+164 MiB).
- Training is fine apart from the leak: loss 3.20 at step 0 (ln 24 = 3.18), 45-step window
  means 1.90, 0.28, 0.12, 0.08, 0.06, 0.06, 0.06, 0.05, 0.04, 0.04; finite throughout.
  About 8 s on 2 cores.
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
        {"id": "memory_leak", "first_step": 0, "tolerance": 23},
    ],
}

STEPS, BATCH, FEAT, HIDDEN, TAGS, P_NEW = 450, 8, 20, 48, 24, 0.35
MIN_LEN, MAX_LEN = 16, 200


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


def make_batch(length, centroids, g):
    """BATCH unpadded sequences of `length` frames: piecewise-constant tag runs (run length
    3-12 frames), each frame = its tag's centroid + N(0, 1) noise; the target is each
    frame's tag."""
    tags = torch.empty(BATCH, length, dtype=torch.long)
    for i in range(BATCH):
        t = 0
        while t < length:
            run = int(torch.randint(3, 13, (1,), generator=g))
            tags[i, t:t + run] = int(torch.randint(0, TAGS, (1,), generator=g))
            t += run
    x = centroids[tags] + torch.randn(BATCH, length, FEAT, generator=g)
    return x, tags


class FrameTagger(nn.Module):
    """Bidirectional LSTM (1 layer, hidden 48 each way) over the unpadded sequence, then a
    linear layer to TAGS logits per frame."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEAT, HIDDEN, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * HIDDEN, TAGS)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(51)
    pick = random.Random(53)
    centroids = 0.8 * torch.randn(TAGS, FEAT, generator=g)
    model = FrameTagger()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    lengths, trace, kept = [], [], []
    epoch_logits = []      # meant for an epoch-end confusion matrix; never consumed or cleared
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            # a recording of a length not seen before with probability P_NEW, else one of a
            # length already seen (the corpus is re-read in random order)
            if not lengths or pick.random() < P_NEW:
                length = pick.randint(MIN_LEN, MAX_LEN)
                while length in lengths:
                    length = pick.randint(MIN_LEN, MAX_LEN)
                lengths.append(length)
                new = True
            else:
                length, new = pick.choice(lengths), False
            x, tags = make_batch(length, centroids, g)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            epoch_logits.append(logits)          # the leak: not detached, not moved, not freed
            kept.append(logits.numel() * logits.element_size())
            acc = (logits.argmax(-1) == tags).float().mean().item()
            rec.step(loss=loss, acc=acc, seq_len=length, tokens=BATCH * length)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap, new))
            if step % 50 == 0 or step == STEPS - 1:
                print(f"step {step} len {length} loss {loss.item():.4f} acc {acc:.2f} "
                      f"lengths {len(lengths)} kept {sum(kept) / 2 ** 20:.1f} MiB "
                      f"rss {rss:.1f} heap {heap:.1f}", flush=True)
    report(trace)
    print(f"[leak] kept logits: {len(kept)} tensors, {sum(kept) / 2 ** 20:.2f} MiB of data, "
          f"{sum(kept) / len(kept) / 1024:.1f} KiB per step on average (min "
          f"{min(kept) / 1024:.1f}, max {max(kept) / 1024:.1f})")


if __name__ == "__main__":
    main()
