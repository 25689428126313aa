"""GRU classifier (GRU 3 -> 32, last hidden state, linear 32 -> 3) on 20-step sequences: each
step is a one-hot 'vote' for one of 3 channels, weighted by a random 0.5-1.5, plus noise
sd 0.3 on all channels; the class is the channel with the largest total vote. Fresh batch
of 64 every step, cross entropy (mean). Adam lr 2e-3, no clipping, 400 steps.

What changes: from step 220 a logging refactor computes the logged value with
F.cross_entropy(..., reduction="sum") on the same (detached) logits, so the logged number
is the batch SUM (x64) instead of the mean. Training still backpropagates the mean loss;
nothing about the optimisation changes. HEALTHY.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm right before
opt.step(); identical in two runs):
- True (mean) loss 1.105 at step 0; 25-step medians 1.08, 0.97, 0.80, 0.59, 0.54, 0.53,
  0.50, 0.47 over 0-199; 0.47-0.50 every 25-step window over 200-399 (a flat, noisy late
  phase). Median 0.475 (180-219) -> 0.482 (220-229) -> 0.491 (230-269) -> 0.482 (last 40).
- Logged loss: median 0.475 (180-219) -> 30.9 (220-229) -> 31.4 (230-269) -> 30.8 (last
  40) = 64 x the mean.
- Grad norm median 1.52 (180-219) -> 1.73 (220-229) -> 1.64 (230-269) -> 1.92 (last 40);
  25-step medians 1.06-1.76 over 50-224 and 1.32-1.97 over 225-399; max 5.08 at step 230
  (GRU gradients are spiky throughout: 25-step maxima 1.9-5.1 from step 25 on).
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

STEPS, BATCH, T, CLASSES = 400, 64, 20, 3
SUM_FROM = 220


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


class GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(CLASSES, 32, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.head(self.gru(x)[0][:, -1])


def seq_batch(g):
    """Sequences of 20 steps over 3 channels, each step a random one-hot 'vote' for one
    channel scaled by a random weight in [0.5, 1.5], plus noise sd 0.3 on every channel;
    the class is the channel with the largest total vote."""
    ch = torch.randint(0, CLASSES, (BATCH, T), generator=g)
    w = 0.5 + torch.rand(BATCH, T, generator=g)
    x = F.one_hot(ch, CLASSES).float() * w[..., None]
    y = x.sum(1).argmax(1)
    return x + 0.3 * torch.randn(BATCH, T, CLASSES, generator=g), y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(2)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(31)
    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = seq_batch(g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)          # training always uses the mean
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            if step >= SUM_FROM:                        # logging refactor: reduction="sum"
                logged = F.cross_entropy(logits.detach(), y, reduction="sum")
            else:
                logged = loss.detach()
            rec.step(loss=logged)
            rows.append((logged.item(), loss.item(), gn))
            if step % 50 == 0:
                print(f"step {step} logged {logged.item():.4g} loss {loss.item():.4g} "
                      f"grad {gn:.4g}")
    facts(rows, SUM_FROM)


if __name__ == "__main__":
    main()
