"""Biased matrix factorisation (recommender) with late-learning factor embeddings, SGD with
momentum; one batch of ratings on a 0-100 scale instead of 1-5 stars (x20) knocks it into
divergence.

What it does: 320 steps of 256 fresh (user, item, rating) triples, 300 users x 200 items;
the ratings come from a rank-8 model plus user/item biases and noise, clamped to 1-5 stars.
The model predicts mu + b_u + b_i + <p_u, q_i>: the biases and mu start at 0, the item
factors at exactly 0 and the user factors at N(0, 0.01), so the interaction term learns
late (a saddle: the factor gradients are ~0 at first and grow as the factors do). SGD with
momentum 0.9, lr 0.3 for mu and the biases, 2.0 for the factor tables (each row sees ~1 % of a
batch); MSE loss, no clipping.

At step BAD_STEP = 240 the batch's ratings are multiplied by 20: one partner exports ratings
as percentages (0-100) instead of stars.

What is TRUE of the run (measured):
- Steps 0-239: healthy learning. The loss falls from 12.6 (mu still 0) to ~0.9 by step 40
  (biases learnt), sits at 0.75-0.9 while the factors escape the saddle, then falls to
  ~0.18-0.35 (steps 200-239) as the interaction is learnt. The factor gradients grow through
  this ordinary learning: user.weight 0 at step 0, 4.2e-4 at step 1, 0.015 at step 80, 0.10
  at step 160 and 0.108 at step 239 (x250); item.weight 4.2e-3 at step 5 -> 0.096. The total
  gradient norm, dominated by mu early on, goes from 6.9 down to a median of ~0.23-0.34
  (max 0.73) over steps 40-239.
- Step 240: the mis-scaled batch. Loss 0.23 at step 239 -> 4811 at step 240; gradient norm
  0.25 -> 135 (x550), on every parameter (user.weight 0.108 -> 14.6, mu 0.18 -> 133).
- The momentum carries that step on and SGD never recovers: the gradient norm stays 74-300
  over steps 241-245 (loss 1124-6725), then climbs geometrically (2943 at 246, 2.4e6 at 247,
  1.7e13 at 248, inf at 249); the loss is NaN from step 250 to the end. The root cause, and the
  start of the trouble, is step 240: the gradients explode there and stay x300+ up until
  they become non-finite. Nothing wrong with memory, data loading or step times.
"""

import argparse

import torch
import torch.nn as nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 240, "tolerance": 1, "top": True},
    ],
    "forbidden": ["memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, USERS, ITEMS, RANK = 320, 256, 300, 200, 8
BAD_STEP, BAD_SCALE = 240, 20.0     # one batch exported on a 0-100 scale instead of 1-5 stars
LR_BIAS, LR_FACTORS = 0.3, 2.0


class MF(nn.Module):
    """Biased matrix factorisation: rating = mu + b_u + b_i + <p_u, q_i>.

    The item factors start at exactly 0 and the user factors near 0, so the interaction
    term learns late: the factor gradients are ~0 at first and grow as the factors do."""

    def __init__(self):
        super().__init__()
        self.mu = nn.Parameter(torch.zeros(()))
        self.user_bias = nn.Embedding(USERS, 1)
        self.item_bias = nn.Embedding(ITEMS, 1)
        self.user = nn.Embedding(USERS, RANK)
        self.item = nn.Embedding(ITEMS, RANK)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)
        nn.init.normal_(self.user.weight, std=0.01)
        nn.init.zeros_(self.item.weight)

    def forward(self, u, i):
        return (self.mu + self.user_bias(u).squeeze(-1) + self.item_bias(i).squeeze(-1)
                + (self.user(u) * self.item(i)).sum(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    P = torch.randn(USERS, RANK, generator=g) * 0.6
    Q = torch.randn(ITEMS, RANK, generator=g) * 0.6
    bu = torch.randn(USERS, generator=g) * 0.4
    bi = torch.randn(ITEMS, generator=g) * 0.4
    n = STEPS * BATCH
    us = torch.randint(0, USERS, (n,), generator=g)
    its = torch.randint(0, ITEMS, (n,), generator=g)
    r = 3.5 + bu[us] + bi[its] + (P[us] * Q[its]).sum(-1) + 0.3 * torch.randn(n, generator=g)
    ratings = r.clamp(1, 5)       # stars, 1-5
    model = MF()
    # The factor rows each see ~1 % of a batch, so they get a larger learning rate.
    opt = torch.optim.SGD([
        {"params": [model.mu, model.user_bias.weight, model.item_bias.weight], "lr": LR_BIAS},
        {"params": [model.user.weight, model.item.weight], "lr": LR_FACTORS},
    ], momentum=0.9)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            sl = slice(step * BATCH, (step + 1) * BATCH)
            u, i, y = us[sl], its[sl], ratings[sl]
            if step == BAD_STEP:
                y = y * BAD_SCALE       # the bug: this partner's ratings are percentages
            loss = ((model(u, i) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 20 == 0 or BAD_STEP - 1 <= step <= BAD_STEP + 3:
                print(f"step {step} loss {loss.item():.4g} |P| {model.user.weight.norm():.3g} "
                      f"|Q| {model.item.weight.norm():.3g}", flush=True)


if __name__ == "__main__":
    main()
