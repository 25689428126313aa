"""BiLSTM sequence tagger on sentences whose lengths are heavy-tailed (lognormal): each batch
is padded to its own longest sentence, so the step time follows the batch's longest sentence.
HEALTHY.

What it does: synthetic tagging. Tokens come from a 200-word vocabulary; every word belongs to
one of 8 word classes and the tag of a position is (class of the word + class of the previous
word) mod 8, so the model needs context. Each step draws 16 sentences with lengths
round(exp(N(ln 20, 1.0))) clipped to 4..512 (median 20 tokens, a long right tail), pads them to
the batch's longest one and runs Embedding(200, 32) -> packed bidirectional LSTM(64) ->
Linear(128, 8); cross-entropy over the real positions only. Adam(2e-3), clip 1.0, 400 steps.
The real token count of the batch (sum of the 16 lengths) is passed as ``rec.step(tokens=)``.

What is TRUE of the run (measured twice on the shared 2-core machine, 25-34 s wall; figures
from the recorded ``steps`` table of the judged run, the second run in brackets):
- Sentence lengths (same in every run, seeded): median 14 tokens, mean 23.6, p99 156, max
  512. Longest sentence per batch: median 81, p90 177, >= 256 in 16 of 360 batches, 512 once
  (step 107). Real tokens per step: 155-915, median 357.
- Step time (steps 2-359): median 44 ms, p10 27, p90 90, p99 188, max 446 ms [median 61,
  p90 134]; 19.6 s in all [27.9 s]. It follows the batch's longest sentence (~0.74 ms per
  padded position; corr(real tokens, step time) 0.73, corr(longest, step time) 0.71).
- Slowest steps: 52 (446 ms; the recorder's own profiler window, ``standard`` preset
  profile_start=50, 427 ms of CPU) and 1 (283 ms, warm-up); then only long batches: 107 (247
  ms, longest 512), 202 (204 ms, 433), 186 (195, 348), 173 (182, 335), 147 (171, 342) ... all
  <= 5.6x the median, scattered, none periodic. No data loader (data wait not recorded).
- Loss (50-step means): 1.61, 0.64, 0.12, 0.024, 0.011, 0.006, 0.004, 0.004 (max 2.09 at
  step 0), finite throughout.
- RSS 395 -> 488 MB, rising in steps over the first ~200 steps as longer batches first appear
  (424 by step 49, 480 by 100, 488 at ~200), then flat (488.2-488.6 MB over steps 200-359).
- Nothing is wrong: variable step time from variable (heavy-tailed) work, reported as tokens.
"""

import argparse
import math
import time

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, VOCAB, CLASSES, TAGS = 360, 16, 200, 8, 8
MU, SIGMA, MIN_LEN, MAX_LEN = math.log(14), 1.0, 4, 512


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32, padding_idx=0)
        self.lstm = nn.LSTM(32, 64, batch_first=True, bidirectional=True)
        self.out = nn.Linear(128, TAGS)

    def forward(self, tok, lengths):
        packed = pack_padded_sequence(self.emb(tok), lengths, batch_first=True,
                                      enforce_sorted=False)
        h, _ = self.lstm(packed)
        h, _ = pad_packed_sequence(h, batch_first=True, total_length=tok.shape[1])
        return self.out(h)


def make_batch(gen, word_class):
    z = torch.randn(BATCH, generator=gen)
    lengths = (MU + SIGMA * z).exp().round().clamp(MIN_LEN, MAX_LEN).long()
    longest = int(lengths.max())
    real = torch.arange(longest)[None, :] < lengths[:, None]
    tok = torch.randint(1, VOCAB, (BATCH, longest), generator=gen) * real
    prev = torch.cat([torch.zeros(BATCH, 1, dtype=torch.long), tok[:, :-1]], 1)
    tags = torch.where(word_class[prev] < CLASSES // 2, word_class[tok],
                       (word_class[tok] + 1) % TAGS)
    tags[~real] = -100
    return tok, lengths, tags


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(11)
    word_class = torch.randint(0, CLASSES, (VOCAB,), generator=gen)
    word_class[0] = 0
    model = Tagger()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses, durs, longest, ntok = [], [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        last = time.perf_counter()
        for _step in range(STEPS):
            tok, lengths, tags = make_batch(gen, word_class)
            logits = model(tok, lengths)
            loss = nn.functional.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1),
                                               ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss, tokens=int(lengths.sum()))
            now = time.perf_counter()
            durs.append(now - last)
            last = now
            losses.append(loss.item())
            longest.append(tok.shape[1])
            ntok.append(int(lengths.sum()))
    d = durs[2:]
    print(f"step time median {pct(d, 0.5) * 1e3:.1f} ms, p10 {pct(d, 0.1) * 1e3:.1f}, "
          f"p90 {pct(d, 0.9) * 1e3:.1f}, p99 {pct(d, 0.99) * 1e3:.1f}, max "
          f"{max(d) * 1e3:.1f} ms; total {sum(durs):.1f} s")
    print(f"longest sentence per batch: median {pct(longest, 0.5)}, p90 {pct(longest, 0.9)}, "
          f"max {max(longest)}; tokens per batch median {pct(ntok, 0.5)}, min {min(ntok)}, "
          f"max {max(ntok)}")
    mx, my = sum(longest) / STEPS, sum(durs) / STEPS
    cov = sum((a - mx) * (b - my) for a, b in zip(longest, durs, strict=True))
    corr = cov / math.sqrt(sum((a - mx) ** 2 for a in longest)
                           * sum((b - my) ** 2 for b in durs))
    print(f"corr(longest sentence, step time) = {corr:.3f}")
    ms_per_tok = sorted(1e3 * t / n for t, n in zip(durs[2:], longest[2:], strict=True))
    print(f"ms per padded position: median {ms_per_tok[len(ms_per_tok) // 2]:.3f}")
    top = sorted(range(STEPS), key=lambda i: -durs[i])[:8]
    print("slowest steps (step, ms, longest):",
          [(i, round(durs[i] * 1e3, 1), longest[i]) for i in top])
    print("steps > 3x median:", sum(t > 3 * pct(d, 0.5) for t in durs))
    w = 50
    print("loss window means", [round(sum(losses[i:i + w]) / w, 3) for i in range(0, STEPS, w)])
    print("loss max", round(max(losses), 3), "at", losses.index(max(losses)))


if __name__ == "__main__":
    main()
