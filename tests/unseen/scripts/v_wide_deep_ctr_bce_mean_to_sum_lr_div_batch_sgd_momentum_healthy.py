"""Healthy: a wide & deep click-through-rate model trained with SGD + momentum; at step 200
the BCE loss switches from reduction="mean" to reduction="sum" over the batch of 64 and, on
purpose, the learning rate is divided by 64 at the same step, so every SGD update is exactly
what it would have been. The recorded loss and gradient norm jump ~64x and stay there; the
model keeps improving.

What it does: 6 categorical fields of 40 values each; clicks are drawn from a logistic model
with per-value effects and two pairwise interactions (fields 0x1 and 2x3). Fresh batch of 64
per step. Model: a wide part (one learned weight per field value, summed) plus a deep part
(8-d embeddings of the 6 fields, concatenated, MLP 48-64-32-1, ReLU). BCE with logits.
SGD(lr 0.2, momentum 0.9) for steps 0-199; reduction "sum" and lr 0.2 / 64 = 0.003125 from
step 200. 400 steps, no clipping. The per-sample BCE is recorded as the metric
bce_per_sample.

What is TRUE of the run (measured; printed at the end):
- Steps 0-199 (mean): loss 0.698 at step 0, 25-step window medians 0.657, 0.602, 0.562,
  0.564, 0.546, 0.519, 0.501, 0.509; held-out BCE 0.701 -> 0.513 (step 199). Gradient norm
  window medians 0.163-0.133 (median 0.135 over 100-199).
- Step 200: loss 0.571 (199) -> 33.84 (200) = 64 x 0.529; gradient norm 0.119 -> 9.42.
- Steps 200-399 (sum): loss window medians 33.2, 33.6, 32.3, 33.4, 31.5, 32.7, 32.3, 30.2,
  i.e. per-sample 0.520, 0.525, 0.505, 0.521, 0.492, 0.511, 0.505, 0.472 -- still falling;
  held-out BCE 0.512 (200) -> 0.496 (399). Gradient norm median 8.55 over 200-399 (window
  medians 7.8-9.2; 63x the 100-199 median), max 14.6 at step 322, no growth.
- LR: 0.2, then 0.003125 from step 200. No NaN/Inf. A healthy run: nothing above info.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

FIELDS, CARD, EMB, BATCH, STEPS, LR, SWITCH = 6, 40, 8, 64, 400, 0.2, 200


def make_truth(g):
    """Ground-truth click model: per-field value effects plus two pairwise interactions."""
    main = 0.8 * torch.randn(FIELDS, CARD, generator=g)
    cross01 = 1.0 * torch.randn(CARD, CARD, generator=g)
    cross23 = 1.0 * torch.randn(CARD, CARD, generator=g)
    return main, cross01, cross23


def sample(g, truth, n):
    main, cross01, cross23 = truth
    x = torch.randint(0, CARD, (n, FIELDS), generator=g)
    logit = main[torch.arange(FIELDS), x].sum(1) + cross01[x[:, 0], x[:, 1]] \
        + cross23[x[:, 2], x[:, 3]] - 0.5
    y = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    return x, y


class WideDeep(nn.Module):
    def __init__(self):
        super().__init__()
        self.offsets = nn.Parameter(torch.arange(FIELDS) * CARD, requires_grad=False)
        self.wide = nn.Embedding(FIELDS * CARD, 1)
        self.deep_emb = nn.Embedding(FIELDS * CARD, EMB)
        nn.init.zeros_(self.wide.weight)
        nn.init.normal_(self.deep_emb.weight, std=0.1)
        self.deep = nn.Sequential(nn.Linear(FIELDS * EMB, 64), nn.ReLU(),
                                  nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        idx = x + self.offsets
        wide = self.wide(idx).sum((1, 2))
        deep = self.deep(self.deep_emb(idx).flatten(1)).squeeze(1)
        return wide + deep


def med(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)
    truth = make_truth(g)
    xv, yv = sample(g, truth, 4096)
    model = WideDeep()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    losses, per_sample, gnorms, lrs = [], [], [], []

    def val():
        with torch.no_grad():
            return round(F.binary_cross_entropy_with_logits(model(xv), yv).item(), 4)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == SWITCH:
                # the loss becomes a sum over the batch; the lr is divided by the batch size
                # so that the SGD update stays exactly the same
                for group in opt.param_groups:
                    group["lr"] = LR / BATCH
            x, y = sample(g, truth, BATCH)
            reduction = "sum" if step >= SWITCH else "mean"
            loss = F.binary_cross_entropy_with_logits(model(x), y, reduction=reduction)
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(p.grad.pow(2).sum().item() for p in params))
            opt.step()
            ps = loss.item() / (BATCH if step >= SWITCH else 1)
            rec.step(loss=loss, bce_per_sample=ps)
            losses.append(loss.item())
            per_sample.append(ps)
            gnorms.append(gn)
            lrs.append(opt.param_groups[0]["lr"])
            if step % 25 == 0 or SWITCH - 1 <= step <= SWITCH + 1 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} per-sample {ps:.4f} gn {gn:.4f} "
                      f"lr {lrs[-1]:.5f} val_bce {val()}", flush=True)
    w = 25
    for name, v in (("loss", losses), ("per-sample bce", per_sample), ("gnorm", gnorms)):
        print(name, "25-step window medians",
              [round(med(v[i:i + w]), 4) for i in range(0, STEPS, w)])
    print("gnorm median 100-199", round(med(gnorms[100:SWITCH]), 4), "median 200-399",
          round(med(gnorms[SWITCH:]), 4), "max", round(max(gnorms), 3), "at",
          gnorms.index(max(gnorms)), "nonfinite", sum(not math.isfinite(v) for v in losses))
    print("LR changes", [(i, lr) for i, lr in enumerate(lrs) if i == 0 or lrs[i - 1] != lr])


if __name__ == "__main__":
    main()
