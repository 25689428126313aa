"""DeepFM click-through-rate model (Guo et al. 2017) on synthetic ad logs: five single-valued
categorical fields (vocabularies 40, 25, 60, 12, 30) as nn.Embedding, one multi-valued
"tags" field (vocabulary 50, 1-5 tags a row) as nn.EmbeddingBag(mode="mean") with offsets,
and 3 dense features. First-order part: 1-D embeddings + EmbeddingBag + Linear(3, 1);
FM part: pairwise interactions of the seven 16-D field vectors (the dense features projected
to a 16-D vector); deep part: MLP 112 -> 128 -> 64 -> 1 (ReLU) on the same vectors. The
three logits are summed; BCE-with-logits loss.

Data: 40,000 training rows and 5,000 validation rows from a known generator (per-value
effects, a rank-4 latent interaction between fields 3 and 4, a tag effect, linear dense effects,
labels ~ Bernoulli(sigmoid(logit)); click rate ~0.4), so the Bayes-optimal loss is known
(printed: the mean binary entropy of the true click probabilities). Map-style Dataset with a
collate_fn that builds the EmbeddingBag's flat index and offsets; shuffled DataLoader
(batch 256, seeded) wrapped by rec.wrap_loader; 600 steps (3.8 epochs).

Loop: Adam (lr 2e-3); every 50 steps a validation pass inside the loop (not a recorded
step) feeds ReduceLROnPlateau(factor 0.5, patience 1, threshold 1e-3), which halves the lr
when validation stops improving.

What is TRUE of the run (measured by this script with plain torch, printed below):
- Click rate 0.444; Bayes-optimal loss 0.4392 (train) / 0.4369 (validation); a constant
  predictor would score 0.687.
- Training loss 1.24 at step 0 (the random FM interactions start well above the prior's
  0.687); 50-step window means 0.936, 0.564, 0.514, 0.510, 0.503, 0.496, 0.481, 0.472, 0.471,
  0.466, 0.463, 0.461 — fast first-order learning by step ~100, then a slower second phase
  (steps ~300-450) in which the FM picks up the field-3 x field-4 interaction; still
  improving at the end. Per-step spread +-0.07 (batch 256, Bernoulli labels).
- Validation every 50 steps: 0.679, 0.519, 0.519, 0.507, 0.502, 0.501, 0.488, 0.476, 0.473,
  0.477, 0.475, 0.468. ReduceLROnPlateau halves the lr once: 2e-3 for steps 0-549, 1e-3 for
  550-599 (after two evaluations without a 0.1% improvement, at 499 and 549).
- Gradient norm 0.45 at step 0, window medians 0.33-0.48, max 0.78. No NaN/Inf.
- Healthy: a CTR model converging towards the Bayes loss; nothing to report.
- About 17 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, EVAL_EVERY, EMB = 600, 256, 50, 16
VOCABS, TAGS, DENSE = (40, 25, 60, 12, 30), 50, 3


class AdLogGenerator:
    def __init__(self, g):
        self.g = g
        self.effects = [0.8 * torch.randn(v, generator=g) for v in VOCABS]
        self.u = torch.randn(VOCABS[3], 4, generator=g) * 0.7
        self.v = torch.randn(VOCABS[4], 4, generator=g) * 0.7
        self.tag_eff = 0.9 * torch.randn(TAGS, generator=g)
        self.dense_w = torch.tensor([0.6, -0.4, 0.3])

    def rows(self, n):
        g = self.g
        cats = torch.stack([torch.randint(0, v, (n,), generator=g) for v in VOCABS], 1)
        nt = torch.randint(1, 6, (n,), generator=g)
        tags = [torch.randint(0, TAGS, (int(k),), generator=g) for k in nt]
        dense = torch.randn(n, DENSE, generator=g)
        logit = -0.4 + sum(self.effects[f][cats[:, f]] for f in range(len(VOCABS)))
        logit = logit + (self.u[cats[:, 3]] * self.v[cats[:, 4]]).sum(1)
        logit = logit + torch.stack([self.tag_eff[t].mean() for t in tags]) + dense @ self.dense_w
        p = torch.sigmoid(logit)
        y = (torch.rand(n, generator=g) < p).float()
        return cats, tags, dense, y, p


class AdLogs(Dataset):
    def __init__(self, cats, tags, dense, y):
        self.cats, self.tags, self.dense, self.y = cats, tags, dense, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.cats[i], self.tags[i], self.dense[i], self.y[i]


def collate(batch):
    cats, tags, dense, y = zip(*batch, strict=True)
    lengths = torch.tensor([len(t) for t in tags])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return torch.stack(cats), torch.cat(tags), offsets, torch.stack(dense), torch.stack(y)


class DeepFM(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.ModuleList(nn.Embedding(v, 1) for v in VOCABS)
        self.first_tags = nn.EmbeddingBag(TAGS, 1, mode="mean")
        self.first_dense = nn.Linear(DENSE, 1)
        self.emb = nn.ModuleList(nn.Embedding(v, EMB) for v in VOCABS)
        self.emb_tags = nn.EmbeddingBag(TAGS, EMB, mode="mean")
        self.dense_proj = nn.Linear(DENSE, EMB)
        for e in [*self.emb, self.emb_tags]:
            nn.init.normal_(e.weight, std=0.1)
        self.deep = nn.Sequential(nn.Linear(7 * EMB, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                                  nn.Linear(64, 1))

    def forward(self, cats, tags, offsets, dense):
        first = (sum(e(cats[:, f]) for f, e in enumerate(self.first))
                 + self.first_tags(tags, offsets) + self.first_dense(dense)).squeeze(1)
        vecs = torch.stack([e(cats[:, f]) for f, e in enumerate(self.emb)]
                           + [self.emb_tags(tags, offsets), self.dense_proj(dense)], 1)
        fm = 0.5 * (vecs.sum(1).pow(2) - vecs.pow(2).sum(1)).sum(1)
        deep = self.deep(vecs.flatten(1)).squeeze(1)
        return first + fm + deep


def binary_entropy(p):
    p = p.clamp(1e-7, 1 - 1e-7)
    return -(p * p.log() + (1 - p) * (1 - p).log())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = AdLogGenerator(torch.Generator().manual_seed(31))
    ctr, ttr, dtr, ytr, ptr = gen.rows(40_000)
    cva, tva, dva, yva, pva = gen.rows(5_000)
    bayes_tr, bayes_va = binary_entropy(ptr).mean().item(), binary_entropy(pva).mean().item()
    prior = ytr.mean().item()
    print(f"[data] click rate {prior:.3f}; Bayes loss train {bayes_tr:.4f} val {bayes_va:.4f}; "
          f"constant-prior loss {binary_entropy(torch.tensor(prior)).item():.4f}")
    loader = DataLoader(AdLogs(ctr, ttr, dtr, ytr), batch_size=BATCH, shuffle=True,
                        drop_last=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(2))
    val = collate(list(zip(cva, tva, dva, yva, strict=True)))
    model = DeepFM()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1,
                                                         threshold=1e-3)
    rows, evals = [], []
    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        while step < STEPS:
            for cats, tags, offsets, dense, y in rec.wrap_loader(loader):
                lr = opt.param_groups[0]["lr"]
                loss = F.binary_cross_entropy_with_logits(model(cats, tags, offsets, dense), y)
                opt.zero_grad()
                loss.backward()
                gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item()
                opt.step()
                rec.step(loss=loss, lr=lr)
                rows.append((step, loss.item(), gn, lr))
                if (step + 1) % EVAL_EVERY == 0:
                    with torch.no_grad():
                        vl = F.binary_cross_entropy_with_logits(model(*val[:4]), val[4]).item()
                    plateau.step(vl)
                    evals.append((step, vl, opt.param_groups[0]["lr"]))
                    print(f"[eval] after step {step}: val loss {vl:.4f} (Bayes {bayes_va:.4f}); "
                          f"lr now {opt.param_groups[0]['lr']:.2e}", flush=True)
                if step % 25 == 0:
                    print(f"step {step} lr {lr:.2e} loss {loss.item():.4f} grad_norm {gn:.3g}",
                          flush=True)
                step += 1
                if step >= STEPS:
                    break
    for a in range(0, STEPS, 50):
        part = rows[a:a + 50]
        print(f"[win] steps {a}-{a + 49}: lr {part[0][3]:.2e}; loss mean "
              f"{sum(r[1] for r in part) / 50:.4f} min {min(r[1] for r in part):.4f} max "
              f"{max(r[1] for r in part):.4f}; grad norm median "
              f"{sorted(r[2] for r in part)[25]:.3g} max {max(r[2] for r in part):.3g}")
    drops = [r[0] for r in rows[1:] if r[3] < rows[r[0] - 1][3]]
    print(f"[lr] lr lowered (first step at the new lr): {drops}; final {rows[-1][3]:.2e}; "
          f"nonfinite {sum(not math.isfinite(r[1]) for r in rows)}")


if __name__ == "__main__":
    main()
