"""TabTransformer (Huang et al. 2020) for binary classification of synthetic "loan" rows:
6 categorical columns (cardinalities 4-12) embedded to 24 dims plus a column embedding,
2 post-LN transformer encoder layers (4 heads, FF 64) over the 6 column tokens, flattened and
concatenated with 4 LayerNorm'd continuous features, MLP 148-64-1. The label is a noisy rule
mixing category interactions and continuous thresholds (Bayes error about 8%). BCE with
logits, AdamW(1e-3, wd 1e-4), batch 64, 400 steps.

What changes at step 200: manual static loss scaling is switched on, as a port to a
half-precision kernel path would do without ``GradScaler``: ``(loss * 1024).backward()``,
then every ``p.grad`` is divided by 1024 by hand before ``opt.step()``; the value handed to
``rec.step(loss=...)`` is the *scaled* loss (what ``backward()`` ran on). So from step 200
the recorded loss is 1024x larger while the gradients the optimizer (and the recorder's
optimizer pre-hook) sees are exactly as before. HEALTHY by design: the update is unchanged
(bit-for-bit up to float rounding), and the unscaled loss / accuracy keep improving.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``, i.e. after unscaling;
medians over 20-step windows):
- recorded (scaled) loss: median 0.477 over steps 180-199, 502.5 over 200-219 (x1053), 477.9
  over 220-239, 418.1 over the last 20; values 0.474 at 199, 505.6 at 200, 504.1 at 201.
- grad norm (unscaled, as the optimizer sees it): 0.508 over 180-199, 0.559 over 200-219
  (x1.10), 0.580 over 220-239, 0.609 over the last 20; 0.535 at 199, 0.538 at 200, 0.560 at
  201 (the slow rise is already there before 200: 40-step medians 0.417 0.453 0.459 0.537
  0.519 | 0.564 0.574 0.634 0.616 0.637).
- unscaled BCE: 0.477 over 180-199, 0.491 over 200-219, 0.467 over 220-239, 0.408 over the
  last 20; 40-step medians 0.637 0.575 0.548 0.522 0.489 | 0.474 0.448 0.463 0.442 0.420.
- batch accuracy: 0.781 over 180-199, 0.820 over the last 20.
- LR constant 1e-3. No NaN or inf (no overflow: float32 throughout). About 10 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, DIM, SWITCH, SCALE = 400, 64, 24, 200, 1024.0
CARDS = (4, 6, 8, 12, 5, 7)
NUM_CONT = 4


class TabTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeds = nn.ModuleList(nn.Embedding(c, DIM) for c in CARDS)
        self.col_embed = nn.Parameter(torch.randn(len(CARDS), DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.cont_norm = nn.LayerNorm(NUM_CONT)
        self.mlp = nn.Sequential(nn.Linear(len(CARDS) * DIM + NUM_CONT, 64), nn.ReLU(),
                                 nn.Dropout(0.1), nn.Linear(64, 1))

    def forward(self, cat, cont):
        tok = torch.stack([e(cat[:, i]) for i, e in enumerate(self.embeds)], 1) + self.col_embed
        h = self.encoder(tok).flatten(1)
        return self.mlp(torch.cat([h, self.cont_norm(cont)], 1)).squeeze(1)


def rows(g, tables):
    cat = torch.stack([torch.randint(0, c, (BATCH,), generator=g) for c in CARDS], 1)
    cont = torch.randn(BATCH, NUM_CONT, generator=g) * torch.tensor([1.0, 2.0, 0.5, 3.0])
    score = (tables[0][cat[:, 0], cat[:, 1]] + tables[1][cat[:, 2], cat[:, 3]]
             + 0.8 * tables[2][cat[:, 4]] * cont[:, 0] + 0.6 * (cont[:, 1] > 1.0).float()
             - 0.5 * cont[:, 3].abs() / 3.0 + 0.3 * tables[3][cat[:, 5]])
    y = (score + 0.35 * torch.randn(BATCH, generator=g) > 0.2).float()
    return cat, cont, y


def grad_norm(model):
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()
                         if p.grad is not None))


def report(n_change, rows, names):
    med = statistics.median
    for j, name in enumerate(names):
        col = [r[j] for r in rows]
        b = med(col[n_change - 20:n_change])
        a = med(col[n_change:n_change + 20])
        print(f"[{name}] med {n_change - 20}-{n_change - 1}: {b:.4g}  {n_change}-{n_change + 19}: "
              f"{a:.4g} (x{a / b:.3g})  {n_change + 20}-{n_change + 39}: "
              f"{med(col[n_change + 20:n_change + 40]):.4g}  last20: {med(col[-20:]):.4g}  "
              f"at {n_change - 1},{n_change},{n_change + 1}: "
              + ", ".join(f"{v:.4g}" for v in col[n_change - 1:n_change + 2])
              + f"  step0: {col[0]:.4g}  nonfinite: {sum(not math.isfinite(v) for v in col)}")
        print(f"[{name}] 40-step medians: "
              + " ".join(f"{med(col[a:a + 40]):.4g}" for a in range(0, len(col), 40)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(17)
    tables = (torch.randn(CARDS[0], CARDS[1], generator=g),
              torch.randn(CARDS[2], CARDS[3], generator=g),
              torch.randn(CARDS[4], generator=g), torch.randn(CARDS[5], generator=g))
    model = TabTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    out = []
    with Recorder(args.run_dir, model=model, optimizer=opt,
                  hparams={"static_loss_scale": SCALE, "loss_scale_from": SWITCH}) as rec:
        for step in range(STEPS):
            cat, cont, y = rows(g, tables)
            logits = model(cat, cont)
            loss = F.binary_cross_entropy_with_logits(logits, y)
            scale = SCALE if step >= SWITCH else 1.0
            scaled = loss * scale
            opt.zero_grad()
            scaled.backward()
            if scale != 1.0:
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.div_(scale)
            gn = grad_norm(model)
            opt.step()
            acc = ((logits > 0).float() == y).float().mean().item()
            rec.step(loss=scaled, bce=loss.detach(), acc=acc, loss_scale=scale)
            out.append((scaled.item(), gn, loss.item(), acc))
            if step % 40 == 0:
                print(f"step {step} recorded {scaled.item():.4f} bce {loss.item():.4f} "
                      f"acc {acc:.3f} gnorm {gn:.3f}", flush=True)
    report(SWITCH, out, ("loss", "gnorm", "bce", "acc"))


if __name__ == "__main__":
    main()
