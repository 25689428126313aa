"""Matrix-factorisation recommender, Adam + MultiStepLR (x0.1 at 50% and 75%): healthy.

What it does: 300 users x 200 items; 200,000 observed ratings drawn from a rank-6 ground
truth (user and item factors) plus Gaussian rating noise of std 0.5, so the best possible
mean-squared error is 0.25. The model has 16-dimensional user and item embeddings plus
per-user and per-item biases (rating = <u, i> + b_u + b_i). Adam, lr 0.08, MSE on random
mini-batches of 512 ratings, 300 steps; MultiStepLR(milestones=[150, 225], gamma=0.1).

What is TRUE of the run: healthy. Measured (25-step means of the recorded minibatch loss):
1.38, 0.97, 0.64, 0.54, 0.50, 0.47 at lr 0.08 (fast at first, then slower and slower); 0.46,
0.36, 0.32 at lr 0.008 (the drop removes Adam's jitter on the embeddings, so the loss first
falls faster again, then slows); 0.305, 0.299, 0.290 at lr 0.0008 (slow, but still going down
to the very end; the last minibatch loss, 0.256, is the lowest of the run). Every 25-step mean
is below the one before it, from the first to the last. The full-data MSE at the end is 0.295
against a noise floor of 0.25, so there is still something left to fit and the model is still
fitting it. The first ~20 steps wobble between 1.19 and 1.55 (minibatch noise while Adam sets
its step sizes) before the fall starts. Gradient norm 0.28 at most, shrinking to ~0.13; no NaN.
Learning that slows after each scheduled LR drop is the schedule doing what it is meant to do,
not a plateau: nothing above info.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_plateau", "loss_divergence", "gradient_explosion"],
}

USERS, ITEMS, RANK, DIM = 300, 200, 6, 16
N_RATINGS, NOISE = 200_000, 0.5
STEPS, BATCH = 300, 512


class MatrixFactorisation(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(USERS, DIM)
        self.item = nn.Embedding(ITEMS, DIM)
        self.user_bias = nn.Embedding(USERS, 1)
        self.item_bias = nn.Embedding(ITEMS, 1)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def forward(self, u, i):
        dot = (self.user(u) * self.item(i)).sum(1)
        return dot + self.user_bias(u)[:, 0] + self.item_bias(i)[:, 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    true_u = torch.randn(USERS, RANK, generator=g) / RANK ** 0.25
    true_i = torch.randn(ITEMS, RANK, generator=g) / RANK ** 0.25
    users = torch.randint(0, USERS, (N_RATINGS,), generator=g)
    items = torch.randint(0, ITEMS, (N_RATINGS,), generator=g)
    ratings = ((true_u[users] * true_i[items]).sum(1)
               + NOISE * torch.randn(N_RATINGS, generator=g))

    model = MatrixFactorisation()
    opt = torch.optim.Adam(model.parameters(), lr=0.08)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[STEPS // 2, 3 * STEPS // 4],
                                                 gamma=0.1)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            idx = torch.randint(0, N_RATINGS, (BATCH,), generator=g)
            loss = nn.functional.mse_loss(model(users[idx], items[idx]), ratings[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss, lr=sched.get_last_lr()[0])
            sched.step()
            if step % 25 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
    with torch.no_grad():
        full = nn.functional.mse_loss(model(users, items), ratings).item()
    print(f"full-data MSE {full:.4f} (noise floor {NOISE ** 2:.2f})")


if __name__ == "__main__":
    main()
