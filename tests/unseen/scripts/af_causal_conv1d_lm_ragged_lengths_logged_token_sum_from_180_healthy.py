"""Causal dilated Conv1d language model (embedding 12 -> 32, causal conv k3 -> 48, causal
conv k3 dilation 2 -> 48, GELU, linear head) on sequences from a fixed sparse random Markov
chain over 12 symbols. Ragged batches: 16 sequences with random lengths 12-40, right-padded,
padded targets masked out (313-491 real target tokens per batch). Training loss = mean over
real tokens. Adam lr 3e-3, no clipping, 360 steps.

What changes: from step 180 the logger reports the per-token SUM over the batch instead of
the mean (tok_loss.sum() rather than tok_loss.mean()); backward still uses the mean. The
logged value jumps by the token count (x313 to x491, varying per batch) while training is
unchanged. HEALTHY: the model reached the chain's entropy (~1.68 nats) by ~step 150 and
stays there.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm right before
opt.step(); identical in two runs):
- True (per-token mean) loss 2.50 at step 0 (ln 12 = 2.48); 25-step medians 2.19, 1.83,
  1.73, 1.71, 1.71, 1.70, 1.68 over 0-174, then 1.68-1.71 in every 25-step window to the
  end. Median 1.681 (140-179) -> 1.690 (180-189) -> 1.690 (190-229) -> 1.679 (last 40).
- Logged loss: median 1.681 (140-179) -> 643 (180-189) -> 696 (190-229) -> 662 (last 40);
  step 179 logged 1.633, step 180 logged 638.3. Ratio logged/true from 180: 313-491.
- Grad norm median 0.471 (140-179) -> 0.471 (180-189) -> 0.432 (190-229) -> 0.427 (last
  40); 25-step medians 0.41-0.55 from step 25 on; max 0.675 at step 112.
- No NaN/Inf. About 5 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [],
          "forbidden": ["loss_divergence", "loss_spike", "gradient_explosion"]}

STEPS, BATCH, TMAX, VOCAB = 360, 16, 40, 12
SUM_FROM = 180


def facts(rows, n):
    """rows: (logged, true_loss, grad_norm). Prints the measured facts around step n."""
    med = statistics.median
    lg = [r[0] for r in rows]
    tl = [r[1] for r in rows]
    gn = [r[2] for r in rows]
    bad = sum(not math.isfinite(v) for v in lg + tl + gn)
    print(f"[all] nonfinite {bad}; true loss step 0 {tl[0]:.4g}, last 20 median "
          f"{med(tl[-20:]):.4g}; max grad {max(gn):.4g} at {gn.index(max(gn))}")
    for name, v in (("logged", lg), ("true", tl), ("grad", gn)):
        print(f"[{name}] median {n - 40}-{n - 1}: {med(v[n - 40:n]):.4g} | {n}-{n + 9}: "
              f"{med(v[n:n + 10]):.4g} | {n + 10}-{n + 49}: {med(v[n + 10:n + 50]):.4g} | "
              f"last 40: {med(v[-40:]):.4g}")
    for a in range(0, len(rows), 25):
        print(f"[win] {a}-{min(a + 24, len(rows) - 1)}: logged {med(lg[a:a + 25]):.4g} "
              f"true {med(tl[a:a + 25]):.4g} "
              f"grad {med(gn[a:a + 25]):.4g} max grad {max(gn[a:a + 25]):.4g}")


class CausalConvLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.c1 = nn.Conv1d(32, 48, 3)
        self.c2 = nn.Conv1d(48, 48, 3, dilation=2)
        self.out = nn.Linear(48, VOCAB)

    def forward(self, x):
        h = self.emb(x).transpose(1, 2)
        h = F.gelu(self.c1(F.pad(h, (2, 0))))
        h = F.gelu(self.c2(F.pad(h, (4, 0))))
        return self.out(h.transpose(1, 2))


def text_batch(trans, g):
    """Sequences from a fixed sparse Markov chain over 12 symbols, random lengths 12-40,
    right-padded; mask marks real next-token targets."""
    lengths = torch.randint(12, TMAX + 1, (BATCH,), generator=g)
    x = torch.zeros(BATCH, TMAX, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
    for t in range(1, TMAX):
        x[:, t] = torch.multinomial(trans[x[:, t - 1]], 1, generator=g).squeeze(1)
    mask = torch.arange(TMAX - 1)[None] < (lengths[:, None] - 1)
    return x[:, :-1], x[:, 1:], mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(4)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(51)
    trans = torch.rand(VOCAB, VOCAB, generator=g) ** 4 + 1e-3
    trans = trans / trans.sum(1, keepdim=True)
    model = CausalConvLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            inp, tgt, mask = text_batch(trans, g)
            tok_loss = F.cross_entropy(model(inp).reshape(-1, VOCAB), tgt.reshape(-1),
                                       reduction="none")[mask.reshape(-1)]
            loss = tok_loss.mean()                     # training: per-token mean
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            # from SUM_FROM the logger reports the per-token SUM over the batch instead
            logged = tok_loss.detach().sum() if step >= SUM_FROM else loss.detach()
            rec.step(loss=logged)
            rows.append((logged.item(), loss.item(), gn))
            if step % 50 == 0:
                print(f"step {step} logged {logged.item():.4g} loss {loss.item():.4g} grad {gn:.4g}"
                      f" tokens {int(mask.sum())}")
    facts(rows, SUM_FROM)


if __name__ == "__main__":
    main()
