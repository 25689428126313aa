"""Speech-like CTC model on utterances with variable frame counts, batched by length buckets:
an utterance joins the bucket of the smallest edge that holds it (8 edges: 40, 60, 80, 100,
130, 160, 200, 260 frames), and a bucket is emitted when it holds 2400 // edge utterances,
padded to its edge; so there are 8 batch shapes (60x40, 40x60, ..., 9x260), long buckets rare
(the 260-frame bucket fills once, at step 342). Memory holds once the common buckets have
been seen. HEALTHY.

What it does: utterances are strings of 3-40 "phonemes" (log-normal count) out of 12, each
rendered as 3-8 frames of its own 20-dim spectral template with noise and a slow loudness
drift. Model: Conv1d 20->64 (k5) + GELU, Conv1d 64->64 (k5, stride 2) + GELU, 2-layer
bidirectional GRU(64), Linear 128->13 (12 phonemes + blank), log-softmax, CTC loss. Adam(2e-3),
gradient clipping at 5, 450 steps; real frames per step passed to rec.step(tokens=...).

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Bucket shapes first seen at steps 0 (40), 1 (60), 2 (80), 9 (130), 13 (100), 48 (160),
  71 (200) and 342 (260); batches per bucket 175, 126, 75, 35, 25, 9, 4, 1 (edges 40..260).
- RSS: 415.7 MiB at step 0, 435.8 at 25, 440.3 at 50, 479.1 from step 51 (+36) to 223, 492.9
  from step 224 (+14) to the end, 493.2 at 449 (slope +0.002 MiB/step over 250-449; the 260
  bucket at step 342 moved it by 0).
- Heap: 130.2 MiB at step 0, then 132.4-139.2 MiB from step 45 on, moving with the bucket in
  hand (+4.6 MiB for the one step of the 260 bucket); slope +0.004 MiB/step over 250-449.
- Training is fine: loss 4.97 at step 0, 45-step window means 1.97, 0.24, 0.19, 0.17, 0.16,
  0.15, 0.12, 0.11, 0.11, 0.09; finite throughout. About 23 s on 2 cores.
- A second recording (the harness's run) gave the same heap figures (within 0.4 MiB) and RSS
  within 2 MiB.
"""

import argparse
import ctypes
import math

import psutil
import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, FEATS, PHONES, FRAME_BUDGET = 450, 20, 12, 2400
EDGES = (40, 60, 80, 100, 130, 160, 200, 260)    # padded frame counts of the length buckets
BLANK = 0

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


def utterance(templates, g):
    """A random phoneme string (log-normal count, 3-40) rendered as frames: each phoneme lasts
    3-8 frames of its own 20-dim spectral template plus noise, with a slow loudness drift."""
    count = int(min(40, max(3, math.exp(2.0 + 0.5 * float(torch.randn((), generator=g))))))
    labels = torch.randint(1, PHONES + 1, (count,), generator=g)
    durs = torch.randint(3, 9, (count,), generator=g)
    frames = templates[labels].repeat_interleave(durs, 0)
    n = frames.shape[0]
    drift = 1 + 0.3 * torch.sin(torch.linspace(0, 3, n) + float(torch.rand((), generator=g)) * 6)
    return frames * drift.unsqueeze(1) + 0.6 * torch.randn(n, FEATS, generator=g), labels


def batches(templates, g):
    """Bucketed batching: utterances wait in the bucket of the smallest edge that holds them;
    a bucket is emitted once it holds FRAME_BUDGET // edge utterances, padded to its edge."""
    pools = {e: [] for e in EDGES}
    while True:
        x, y = utterance(templates, g)
        edge = next((e for e in EDGES if x.shape[0] <= e), None)
        if edge is None:
            continue
        pools[edge].append((x, y))
        if len(pools[edge]) >= FRAME_BUDGET // edge:
            items, pools[edge] = pools[edge], []
            feats = torch.zeros(len(items), edge, FEATS)
            for i, (xi, _) in enumerate(items):
                feats[i, :xi.shape[0]] = xi
            frames = torch.tensor([xi.shape[0] for xi, _ in items])
            targets = torch.cat([yi for _, yi in items])
            target_lens = torch.tensor([len(yi) for _, yi in items])
            yield feats, frames, targets, target_lens


class ConvBiGRU(nn.Module):
    """Two 1-D convolutions (the second with stride 2), a 2-layer bidirectional GRU over the
    subsampled frames, a linear layer to the phonemes plus blank."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(FEATS, 64, 5, padding=2), nn.GELU(),
                                  nn.Conv1d(64, 64, 5, stride=2, padding=2), nn.GELU())
        self.rnn = nn.GRU(64, 64, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(128, PHONES + 1)

    def forward(self, feats):
        h = self.conv(feats.transpose(1, 2)).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(29)
    templates = torch.cat([torch.zeros(1, FEATS), 1.5 * torch.randn(PHONES, FEATS, generator=g)])
    model = ConvBiGRU()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    ctc = nn.CTCLoss(blank=BLANK, zero_infinity=True)
    trace, first_seen, counts = [], {}, {}
    stream = batches(templates, g)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            feats, frames, targets, target_lens = next(stream)
            logp = model(feats)                                   # (B, T', C)
            out_lens = (frames + 1) // 2
            loss = ctc(logp.transpose(0, 1), targets, out_lens, target_lens)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            edge = feats.shape[1]
            rec.step(loss=loss, tokens=int(frames.sum()), bucket=edge, batch=feats.shape[0])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            first_seen.setdefault(edge, step)
            counts[edge] = counts.get(edge, 0) + 1
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} bucket {edge} x{feats.shape[0]} frames {int(frames.sum())} "
                      f"loss {loss.item():.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 25, 50, 100, 150, 200, 250, 300, 350, 400, STEPS - 1),
           segments=((0, 99), (100, 249), (250, STEPS - 1), (300, STEPS - 1)))
    print(f"[shapes] {len(first_seen)} bucket shapes; first seen (edge: step) "
          f"{dict(sorted(first_seen.items()))}; batches per bucket {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
