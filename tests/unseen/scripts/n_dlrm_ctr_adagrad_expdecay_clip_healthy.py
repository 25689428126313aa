"""DLRM-style click-through-rate model (bottom MLP for dense features, one embedding table per
categorical field with Zipf-distributed ids, pairwise dot-product interaction, top MLP) with an
auxiliary dwell-time regression head; Adagrad, exponential learning-rate decay, gradient
clipping at norm 1.0. HEALTHY.

What it does: a synthetic click log from a hidden model: 13 log-normal dense features (log1p),
8 categorical fields (cardinalities 20-2000, Zipf(1.1)-distributed ids), click logit = sum of
pairwise dot products of hidden 4-d latent vectors + per-value biases + a linear dense term;
clicks ~ Bernoulli (rate 0.37) and a dwell-time target softplus(logit) + noise. Model: DLRM
(bottom MLP 13-64-16, one 16-d embedding table per field with DLRM's uniform init, pairwise
dot-product interaction of the 9 vectors, top MLP 52-64-32, click and dwell heads).
Loss = BCE + 0.2 * dwell MSE. Adagrad(lr 0.05), ExponentialLR(gamma 0.996 per step: 0.05 ->
0.010), clip_grad_norm_(1.0). 400 steps of batch 256. Embedding gradients are sparse by
design (only the rows seen in a batch; rare ids of the large tables are seen rarely).

What is TRUE of the run (measured):
- Loss 1.26 at step 0 (mean 1.12 over steps 0-9), mean 0.81 over steps 40-79, 0.72 over
  120-159, 0.67 over 200-239, 0.64 over the last 40 steps. Held-out (8,192 rows): BCE 0.680
  before -> 0.498 after (a constant predictor scores 0.659), dwell MSE 3.06 -> 0.75.
- Pre-clip grad norm median 0.33, max 1.45 (step 0-39); clipping acted on 3 of 400 steps,
  all early. No NaN/Inf.
- Step time median ~7 ms.
- Nothing is wrong: a healthy run.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
}

STEPS, BATCH, DENSE, EMB_DIM = 400, 256, 13, 16
CARDINALITIES = [100, 500, 1000, 50, 2000, 20, 300, 800]
LR, GAMMA, CLIP, AUX_WEIGHT = 0.05, 0.996, 1.0, 0.2
TRUE_DIM = 4


class World:
    """The hidden generative model of clicks: latent vectors per category value, a dense
    weight vector, and an observation-noise level."""

    def __init__(self, g):
        self.latent = [torch.randn(c, TRUE_DIM, generator=g) * 0.6 for c in CARDINALITIES]
        self.bias = [torch.randn(c, generator=g) * 0.5 for c in CARDINALITIES]
        self.w_dense = torch.randn(DENSE, generator=g) * 0.4
        self.zipf = [self._zipf_probs(c) for c in CARDINALITIES]

    @staticmethod
    def _zipf_probs(c, s=1.1):
        p = 1.0 / torch.arange(1, c + 1).float() ** s
        return p / p.sum()

    def sample(self, n, g):
        raw = torch.exp(torch.randn(n, DENSE, generator=g))    # log-normal, counts-like features
        dense = torch.log1p(raw)
        ids = torch.stack([torch.multinomial(p, n, replacement=True, generator=g)
                           for p in self.zipf], 1)
        vecs = torch.stack([lat[ids[:, i]] for i, lat in enumerate(self.latent)], 1)   # n x F x k
        inter = torch.einsum("nik,njk->nij", vecs, vecs)
        iu = torch.triu_indices(len(CARDINALITIES), len(CARDINALITIES), 1)
        pair = inter[:, iu[0], iu[1]].sum(1)
        first = torch.stack([b[ids[:, i]] for i, b in enumerate(self.bias)], 1).sum(1)
        logit = 0.5 * pair + first + (dense - 0.6) @ self.w_dense - 1.0
        click = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
        dwell = F.softplus(logit) + 0.3 * torch.randn(n, generator=g)     # seconds-ish, scaled
        return dense, ids, click, dwell


def mlp(sizes, last_act=True):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom = mlp([DENSE, 64, EMB_DIM])
        self.tables = nn.ModuleList([nn.Embedding(c, EMB_DIM) for c in CARDINALITIES])
        for t in self.tables:                      # DLRM init: U(-1/sqrt(n), 1/sqrt(n))
            bound = 1 / math.sqrt(t.num_embeddings)
            nn.init.uniform_(t.weight, -bound, bound)
        n_vec = len(CARDINALITIES) + 1
        self.n_pairs = n_vec * (n_vec - 1) // 2
        self.top = mlp([EMB_DIM + self.n_pairs, 64, 32], last_act=True)
        self.click_head = nn.Linear(32, 1)
        self.dwell_head = nn.Linear(32, 1)

    def forward(self, dense, ids):
        d = self.bottom(dense)
        vecs = torch.stack([d] + [t(ids[:, i]) for i, t in enumerate(self.tables)], 1)
        inter = vecs @ vecs.transpose(1, 2)
        iu = torch.triu_indices(vecs.shape[1], vecs.shape[1], 1)
        z = self.top(torch.cat([d, inter[:, iu[0], iu[1]]], 1))
        return self.click_head(z).squeeze(1), self.dwell_head(z).squeeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    world = World(g)
    val = world.sample(8192, g)
    model = DLRM()
    opt = torch.optim.Adagrad(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=GAMMA)

    @torch.no_grad()
    def evaluate():
        model.eval()
        dense, ids, click, dwell = val
        logit, pred_dwell = model(dense, ids)
        out = (F.binary_cross_entropy_with_logits(logit, click).item(),
               F.mse_loss(pred_dwell, dwell).item())
        model.train()
        return out

    base_rate = val[2].mean().item()
    entropy = -(base_rate * math.log(base_rate) + (1 - base_rate) * math.log(1 - base_rate))
    print(f"click rate {base_rate:.3f}: BCE of a constant predictor {entropy:.4f}; "
          f"val before {evaluate()}", flush=True)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            dense, ids, click, dwell = world.sample(BATCH, g)
            logit, pred_dwell = model(dense, ids)
            bce = F.binary_cross_entropy_with_logits(logit, click)
            aux = F.mse_loss(pred_dwell, dwell)
            loss = bce + AUX_WEIGHT * aux
            opt.zero_grad()
            loss.backward()
            pre_clip = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            rec.step(loss=loss, bce=bce, dwell_mse=aux, grad_norm_preclip=pre_clip)
            sched.step()
            if step % 50 == 0 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} bce {bce.item():.4f} "
                      f"aux {aux.item():.4f} preclip {pre_clip.item():.3f} "
                      f"lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    print(f"val after (bce, dwell mse): {evaluate()}")


if __name__ == "__main__":
    main()
