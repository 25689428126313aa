"""Conv + GRU text classifier on length-bucketed batches under CPU bf16 autocast: healthy.

What it does: binary "sentiment" classification of synthetic token sequences over a
vocabulary of 200 (0 = padding; ids 1-20 "positive" words, 21-40 "negative" words, the rest
neutral). A sequence of label 1 draws each token as a positive word with probability 0.15 and
a negative word with probability 0.03 (the reverse for label 0), otherwise a neutral word.
Batches come from a length-bucketing sampler: each step draws a bucket length L uniformly
from 16..112, the 32 sequences of the batch have lengths in L/2..L (one of them exactly L)
and are padded to L. Model (a CRNN-style text classifier): embedding(200 → 64, padding_idx
0) → Conv1d(64 → 128, kernel 5, padding 2) → ReLU → Conv1d(128 → 128, kernel 3, padding 1)
→ ReLU → GRU(128 → 96) over the packed sequences (``pack_padded_sequence``) → last hidden
state → linear(96 → 2). Adam(lr=2e-3), 300 steps; forward and loss under
``torch.autocast("cpu", dtype=torch.bfloat16)`` (the convolutions and the head run in bf16;
the GRU, which autocast does not cast, gets the conv output as float32).

Why memory grows although nothing leaks: the convolutions see a new (32 × C × L) input shape
whenever a bucket length L has not occurred before. Under bf16 autocast CPU convolutions go
through oneDNN, which compiles a primitive per new shape (forward, backward-data and
backward-weights of both convs) and keeps it in its LRU primitive caches (1024 entries by
default: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, ideep's ``LRU_CACHE_CAPACITY``). A length seen
before costs nothing. There are only 97 possible lengths, so the caches stop growing once
all have been seen; growth is fast at first and slows as lengths repeat.

What is TRUE of the run (ground truth):
- Healthy: a bounded framework cache filling, not a leak (no memory_leak). Measured with the
  Recorder replaced by a stub (live heap = glibc mallinfo2 uordblks + hblkhd, RSS from
  /proc/self/statm, end of each step): live heap 121.7 / 193.2 / 250.4 / 276.1 / 286.0 /
  292.2 / 295.9 MiB at steps 0 / 50 / 100 / 150 / 200 / 250 / 299 (+71, +57, +26, +10, +6,
  +4 MiB per 50 steps), while the number of distinct bucket lengths seen so far is 1 / 34 /
  60 / 76 / 85 / 92 / 95. A step with a new length adds ≈1.9 MiB on average, a step with a
  length seen before adds nothing (mean -0.01 MiB). RSS: 365 → 461 → 526 → 565 → 583 → 607 →
  614 MiB, slowing likewise. With the recorder: 133.1 → 207.4 → 262.5 → 288.3 → 298.5 →
  304.7 → 308.3 MiB (plus a transient recorder bump of up to ≈40 MiB around step 51). With
  both cache capacities set to 16 the heap stays within 120.9-121.9 MiB from step 10 to 299.
- The loss falls from ≈0.69 (ln 2) to ≈0.2 (last-10 mean 0.197); no divergence, no NaN/Inf;
  nothing above info. (Measured: the loss sits at chance until step ≈30 with the global
  gradient norm at 0.14-0.95; as the model leaves that plateau (steps 40-55, no clipping) the
  gradient norm rises transiently to 2-8 (peak 8.4 at step 46) and the loss is noisy (0.28-
  0.91) — the learning transition, which settles by itself: from step 60 the gradient norm is
  0.1-5 (mostly 0.3-2) and the loss keeps falling. Not an explosion.)
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["memory_leak"],
}

STEPS, BATCH, VOCAB, EMB, CONV, HIDDEN = 300, 32, 200, 64, 128, 96
MIN_LEN, MAX_LEN = 16, 112
POS, NEG = range(1, 21), range(21, 41)


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One length bucket: 32 sequences of lengths L/2..L (one exactly L), padded to L."""
    L = int(torch.randint(MIN_LEN, MAX_LEN + 1, (1,), generator=g))
    lengths = torch.randint(L // 2, L + 1, (BATCH,), generator=g)
    lengths[0] = L
    y = torch.randint(0, 2, (BATCH,), generator=g)
    u = torch.rand(BATCH, L, generator=g)
    p_pos = torch.where(y == 1, 0.15, 0.03)[:, None]
    p_neg = torch.where(y == 1, 0.03, 0.15)[:, None]
    tok = torch.randint(41, VOCAB, (BATCH, L), generator=g)
    tok = torch.where(u < p_pos, torch.randint(POS.start, POS.stop, (BATCH, L), generator=g), tok)
    tok = torch.where((u >= p_pos) & (u < p_pos + p_neg),
                      torch.randint(NEG.start, NEG.stop, (BATCH, L), generator=g), tok)
    tok = tok.masked_fill(torch.arange(L)[None, :] >= lengths[:, None], 0)
    return tok, lengths, y


class ConvGRUClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB, padding_idx=0)
        self.conv = nn.Sequential(
            nn.Conv1d(EMB, CONV, 5, padding=2), nn.ReLU(),
            nn.Conv1d(CONV, CONV, 3, padding=1), nn.ReLU())
        self.gru = nn.GRU(CONV, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, 2)

    def forward(self, tok: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        feats = self.conv(self.emb(tok).transpose(1, 2)).transpose(1, 2).float()
        out, _ = self.gru(feats)  # over the padded batch; read each sequence at its last token
        last = out.gather(1, (lengths - 1)[:, None, None].expand(-1, 1, out.shape[2]))
        return self.head(last[:, 0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)

    model = ConvGRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses, seen = [], set()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for _ in range(STEPS):
            tok, lengths, y = batch(g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(tok, lengths).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            seen.add(tok.shape[1])
    print(f"loss first {losses[0]:.3f} last-10 mean {sum(losses[-10:]) / 10:.4f}; "
          f"{len(seen)} distinct bucket lengths")


if __name__ == "__main__":
    main()
