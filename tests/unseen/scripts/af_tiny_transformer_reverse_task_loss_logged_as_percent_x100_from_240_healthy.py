"""Tiny transformer (token embedding 10 -> 32 + learned positions, one TransformerEncoderLayer
with 2 heads, FF 64, no dropout, linear head) learning to output the reversal of a random
length-8 sequence over 10 symbols. Fresh batch of 32 every step, per-token cross entropy.
AdamW lr 3e-3 weight decay 0.01, no clipping, 400 steps.

What changes: from step 240 the logged value is the loss "in percent" (loss * 100), a
units change in the logging code only. Training is unaffected. HEALTHY: the task is
solved around step 175-200 and the true loss keeps shrinking.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm right before
opt.step(); identical in two runs):
- True loss 2.45 at step 0 (ln 10 = 2.30); 25-step medians 2.24, 1.99, 1.86, 1.80, 1.72,
  1.59, 0.88, 0.109 over 0-199 (the sudden 'grokking' drop is at ~150-200), 0.0108,
  0.0052, 0.0042, 0.0032, 0.0027, 0.0023, 0.0020, 0.0017 over 200-399. Median 0.0081
  (200-239) -> 0.0048 (240-249) -> 0.0037 (250-289) -> 0.0018 (last 40).
- Logged loss: median 0.0081 (200-239) -> 0.48 (240-249) -> 0.37 (250-289) -> 0.18 (last
  40): x100 the true loss from 240, i.e. x60 the pre-switch level at the switch.
- Grad norm median 0.032 (200-239) -> 0.016 (240-249) -> 0.012 (250-289) -> 0.0057 (last
  40); falling steadily; max of the run 0.86 at step 176; max after 240: 0.18 at one step in
  300-324.
- No NaN/Inf. About 4 s.
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

STEPS, BATCH, L, VOCAB, D = 400, 32, 8, 10, 32
PERCENT_FROM = 240


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


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(L, D) * 0.1)
        layer = nn.TransformerEncoderLayer(D, 2, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, x):
        return self.out(self.enc(self.tok(x) + self.pos))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(3)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(41)
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x = torch.randint(0, VOCAB, (BATCH, L), generator=g)
            y = x.flip(1)                                   # task: output the reversed sequence
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            # from PERCENT_FROM the dashboard logs the loss "in percent" (x100)
            logged = loss.detach() * (100.0 if step >= PERCENT_FROM else 1.0)
            rec.step(loss=logged)
            rows.append((logged.item(), loss.item(), gn))
            if step % 50 == 0:
                print(f"step {step} logged {logged.item():.4g} loss {loss.item():.4g} "
                      f"grad {gn:.4g}")
    facts(rows, PERCENT_FROM)


if __name__ == "__main__":
    main()
