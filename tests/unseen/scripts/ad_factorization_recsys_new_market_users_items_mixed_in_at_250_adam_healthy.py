"""Biased matrix-factorisation recommender (global bias + user bias + item bias + dot product
of 16-d user and item embeddings, embeddings initialised N(0, 0.1), biases 0) trained on
synthetic explicit ratings from a ground-truth rank-6 taste model: rating = 3.6 + user bias
(sd 0.4) + item bias (sd 0.5) + <u, i> (factors sd 0.55) + noise sd 0.3 (MSE floor 0.09).
Batches of 256 (user, item, rating) triples, MSE. Adam lr 3e-2 (constant), no clipping, 500
steps. Embedding tables hold 1300 users and 500 items: 800 users / 300 items of the launch
market and 500 / 200 of a second market.

The data change, by design: for steps 0-249 every interaction comes from the launch market;
from step 250 on, 40% of each batch comes from the new market (new users rating new items,
rows the model has never updated, and a different rating habit: those users rate 1.0 lower
on average). The loss jumps at 250 because 40% of the batch is unseen, then falls again as
the new rows are learned; the old market's error is not hurt (it keeps improving), and by
the end the mixed loss is below where it was before the change. The gradient norm rises in
the same step (x5) and settles within ~5 steps to ~1.5x its old level, then back down. No
growth, no instability. HEALTHY: a new data domain that the model absorbs.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Before: loss 13.8 at step 0; 25-step medians 8.8 (0-24), 2.94, 0.94, 0.82, 0.76, 0.71,
  0.63, 0.57, 0.456, 0.360 (225-249; median 0.365 over 220-249). Grad norm 5.6, 2.8, 0.40,
  then 0.21-0.30 (0.211 median over 220-249).
- Change at 250: loss 1.25, 1.12, 1.27, 0.90, 0.95 at 250-254 (max 1.27 at 252, x3.5);
  25-step medians 0.785 (250-274), 0.762, 0.719, 0.618, 0.560, 0.520, 0.429, 0.412, 0.348,
  0.333 (475-499); last-20 median 0.330. Grad 1.11 at 250 (x5.3 the 0.211 median), 0.84,
  0.98, 0.69, 0.79; 25-step medians 0.370, 0.372, 0.341, 0.298, 0.280, 0.265, 0.238, 0.226,
  0.212, 0.214.
- Held-out split (a fresh batch of each market, evaluated every 50 steps from 250): old
  market MSE 0.299 (250), 0.243, 0.171, 0.195, 0.191 (450); new market (noise-free targets)
  2.25 (250), 1.75, 1.01, 0.88, 0.63 (450).
- Max grad norm of the run 7.34 at step 1. No NaN/Inf. About 3.5 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [],
          "forbidden": ["gradient_explosion", "loss_divergence", "nonfinite"]}

STEPS, BATCH, RANK, DIM = 500, 256, 6, 16
OLD_USERS, OLD_ITEMS, NEW_USERS, NEW_ITEMS = 800, 300, 500, 200
SWITCH, NEW_SHARE = 250, 0.4
LR = 3e-2


class FactorModel(nn.Module):
    """Biased matrix factorisation: rating = global + user bias + item bias + <u, i>."""

    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(OLD_USERS + NEW_USERS, DIM)
        self.item = nn.Embedding(OLD_ITEMS + NEW_ITEMS, DIM)
        self.ubias = nn.Embedding(OLD_USERS + NEW_USERS, 1)
        self.ibias = nn.Embedding(OLD_ITEMS + NEW_ITEMS, 1)
        self.glob = nn.Parameter(torch.zeros(1))
        for e in (self.user, self.item):
            nn.init.normal_(e.weight, std=0.1)
        for e in (self.ubias, self.ibias):
            nn.init.zeros_(e.weight)

    def forward(self, u, i):
        return (self.glob + self.ubias(u).squeeze(1) + self.ibias(i).squeeze(1)
                + (self.user(u) * self.item(i)).sum(1))


def make_world(g):
    """Ground-truth low-rank taste model for both markets. The new market's users and items
    have their own factors and a different rating habit (mean 2.6 instead of 3.6)."""
    uf = torch.randn(OLD_USERS + NEW_USERS, RANK, generator=g) * 0.55
    itf = torch.randn(OLD_ITEMS + NEW_ITEMS, RANK, generator=g) * 0.55
    ub = 0.4 * torch.randn(OLD_USERS + NEW_USERS, generator=g)
    ib = 0.5 * torch.randn(OLD_ITEMS + NEW_ITEMS, generator=g)
    ub[OLD_USERS:] -= 1.0
    return uf, itf, ub, ib


def rating_batch(world, step, g):
    """Before SWITCH only the old market's interactions; from SWITCH on, 40% of each batch
    comes from the new market (new users rating new items), the rest as before. Ratings are
    3.6 + biases + <u, i> + noise sd 0.3."""
    uf, itf, ub, ib = world
    u = torch.randint(0, OLD_USERS, (BATCH,), generator=g)
    i = torch.randint(0, OLD_ITEMS, (BATCH,), generator=g)
    if step >= SWITCH:
        new = torch.rand(BATCH, generator=g) < NEW_SHARE
        u = torch.where(new, OLD_USERS + torch.randint(0, NEW_USERS, (BATCH,), generator=g), u)
        i = torch.where(new, OLD_ITEMS + torch.randint(0, NEW_ITEMS, (BATCH,), generator=g), i)
    r = 3.6 + ub[u] + ib[i] + (uf[u] * itf[i]).sum(1) + 0.3 * torch.randn(BATCH, generator=g)
    return u, i, r


def facts(rows):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    s = SWITCH
    print(f"[all] nonfinite {sum(not math.isfinite(v) for v in loss + gn)}; "
          f"loss step 0 {loss[0]:.4g}, last 20 median {med(loss[-20:]):.4g}; max grad "
          f"{max(gn):.4g} at {max(range(len(gn)), key=gn.__getitem__)}")
    print(f"[switch {s}] loss median {s - 30}-{s - 1}: {med(loss[s - 30:s]):.4g}, at "
          f"{s}..{s + 4}: {' '.join(f'{v:.4g}' for v in loss[s:s + 5])}, max "
          f"{max(loss[s:s + 30]):.4g} at {max(range(s, s + 30), key=loss.__getitem__)} | grad "
          f"median {s - 30}-{s - 1}: {med(gn[s - 30:s]):.4g}, at {s}..{s + 4}: "
          f"{' '.join(f'{v:.3g}' for v in gn[s:s + 5])}, max {max(gn[s:s + 30]):.4g} at "
          f"{max(range(s, s + 30), key=gn.__getitem__)}")
    for a in range(0, len(rows), 25):
        print(f"[win] {a}-{a + 24}: loss {med(loss[a:a + 25]):.4g} max {max(loss[a:a + 25]):.4g}"
              f" grad {med(gn[a:a + 25]):.4g} max grad {max(gn[a:a + 25]):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(21)
    world = make_world(g)
    model = FactorModel()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            u, i, r = rating_batch(world, step, g)
            pred = model(u, i)
            loss = F.mse_loss(pred, r)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step >= SWITCH and step % 50 == 0:
                with torch.no_grad():
                    uo, io, ro = rating_batch(world, 0, g)
                    un = OLD_USERS + torch.randint(0, NEW_USERS, (BATCH,), generator=g)
                    inn = OLD_ITEMS + torch.randint(0, NEW_ITEMS, (BATCH,), generator=g)
                    uf, itf, ub, ib = world
                    rn = 3.6 + ub[un] + ib[inn] + (uf[un] * itf[inn]).sum(1)
                    print(f"  [split] step {step}: old-market batch mse "
                          f"{F.mse_loss(model(uo, io), ro).item():.4f}, new-market (noise-free) "
                          f"mse {F.mse_loss(model(un, inn), rn).item():.4f}")
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.4f} grad_norm {gn:.4g}", flush=True)
    facts(rows)


if __name__ == "__main__":
    main()
