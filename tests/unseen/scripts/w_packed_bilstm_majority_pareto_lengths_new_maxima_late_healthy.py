"""Bidirectional LSTM over packed variable-length token sequences whose lengths are long-tailed
(Pareto, alpha 2, from 8 tokens; capped at 1000, never reached): each batch of 16 is padded to
its longest, so the padded length changes almost every batch, new lengths keep appearing to
the end, and a new longest batch turns up rarely and late (steps 205, 273, 318 and 491).
Memory grows only with the first long batches (the LSTM's and allocator's working set for
longer sequences) and otherwise holds. HEALTHY (working set of longer inputs, not a leak).

What it does: tokens 1-11 (0 is padding); each sequence favours one of tokens 1, 2, 3 (12% of
its positions), and the label is whichever of 1, 2, 3 occurs most. Model: Embedding(12, 32),
1-layer bidirectional LSTM(64) over pack_padded_sequence, mean- and max-pooling over the
real positions, MLP 256->64->3. Adam(2e-3), gradient clipping at 1.0, 500 steps; tokens per
step (real, unpadded) are passed to rec.step(tokens=...).

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Shapes: 114 distinct padded lengths; 31 of them first seen at step 250 or later (the last
  at step 492). New longest batch (step, length): (0, 33), (1, 48), (2, 57), (3, 106), (9, 202),
  (84, 226), (205, 375), (273, 453), (318, 518), (491, 568). Real tokens per step ~170-600.
- RSS: 391.6 MiB at step 0, 411.6 at 25, 447.4 at 100 (its one big move: +31 MiB at step 51),
  then flat 447.4-447.8 MiB from step 100 to 489 (slope +0.001 MiB/step over 100-249); +10 MiB
  at step 490 and +4 at 491 with the batch of length 568 (the run's longest), ending at 461.5.
- Heap: 126.5-131.5 MiB over steps 0-49, then it moves with the batch in hand (129-139 MiB:
  +6 to +7 MiB for one step at each long batch, given back the next step); its floor is flat
  at ~129 MiB from step 50 to the end (slope 0.000 MiB/step over 250-499).
- Training is fine: loss 1.11 at step 0 (ln 3 = 1.10), 50-step window means 0.54, 0.13, 0.11,
  0.06, 0.10, 0.08, 0.05, 0.06, 0.07, 0.05; finite throughout. About 14 s on 2 cores.
- A second recording (the harness's run) gave the same heap figures (within 0.4 MiB) and RSS up
  to 17 MiB lower: 438.9 at step 100, flat to step 317, +5.0 MiB at step 318 (the 518-token
  batch), then 444.3-444.4 to the end, with no move at step 491.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, VOCAB, CLASSES = 500, 16, 12, 3
MIN_LEN, ALPHA, MAX_LEN = 8, 2.0, 1000
PAD = 0

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


def make_batch(g):
    """BATCH token sequences with Pareto(2) lengths from 8 (capped at 1000), padded to the longest.

    Label: which of the tokens 1, 2, 3 occurs most often (ties go to the lower token; the
    three are boosted by a random one of them so the classes are balanced)."""
    u = torch.rand(BATCH, generator=g)
    lengths = (MIN_LEN / u.clamp_min(1e-6) ** (1 / ALPHA)).long().clamp(MIN_LEN, MAX_LEN)
    lengths, _ = lengths.sort(descending=True)
    top = int(lengths[0])
    tok = torch.randint(1, VOCAB, (BATCH, top), generator=g)
    favoured = torch.randint(1, 4, (BATCH, 1), generator=g)
    boost = torch.rand(BATCH, top, generator=g) < 0.12
    tok = torch.where(boost, favoured.expand(-1, top), tok)
    pos = torch.arange(top).unsqueeze(0)
    tok = tok.masked_fill(pos >= lengths.unsqueeze(1), PAD)
    counts = torch.stack([(tok == k).sum(1) for k in (1, 2, 3)], 1)
    return tok, lengths, counts.argmax(1)


class MajorityLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32, padding_idx=PAD)
        self.lstm = nn.LSTM(32, 64, num_layers=1, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(2 * 64 * 2, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, tok, lengths):
        packed = pack_padded_sequence(self.emb(tok), lengths, batch_first=True)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True)
        mask = (torch.arange(out.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(2)
        mean = (out * mask).sum(1) / lengths.unsqueeze(1)
        peak = out.masked_fill(~mask, -1e4).amax(1)
        return self.head(torch.cat([mean, peak], 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(2)
    model = MajorityLSTM()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    trace, seen, first_seen, records = [], set(), [], []
    longest = 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            tok, lengths, y = make_batch(g)
            logits = model(tok, lengths)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            real = int(lengths.sum())
            rec.step(loss=loss, tokens=real, acc=acc, max_len=tok.shape[1])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if tok.shape[1] not in seen:
                seen.add(tok.shape[1])
                first_seen.append(step)
            if tok.shape[1] > longest:
                longest = tok.shape[1]
                records.append((step, longest))
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} max_len {tok.shape[1]} tokens {real} loss {loss.item():.4f} "
                      f"acc {acc.item():.3f} padded lengths seen {len(seen)} rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 25, 50, 100, 150, 200, 250, 300, 350, 400, 450, STEPS - 1),
           segments=((0, 99), (100, 249), (250, STEPS - 1), (350, STEPS - 1)))
    late = [s for s in first_seen if s >= 250]
    print(f"[shapes] {len(seen)} distinct padded lengths; {len(late)} first seen at step >= 250 "
          f"(last at {first_seen[-1]}); new longest (step, len): {records}")


if __name__ == "__main__":
    main()
