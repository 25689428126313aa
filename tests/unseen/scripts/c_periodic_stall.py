"""Two-layer GCN on a synthetic community graph; every 40 steps the loop blocks for 1 s.

A GCN (Kipf & Welling: symmetric-normalised adjacency with self-loops, 16 -> 32 -> 4,
dropout 0.3) classifies the nodes of a 400-node stochastic block model (4 communities,
p_in 0.04, p_out 0.01) from weak noisy features, 10% of the labels flipped. Each step is a
mini-batch of 32 labelled nodes drawn by a DataLoader (full-graph propagation), Adam lr 5e-3,
weight decay 5e-4, 320 steps. At steps 40, 80, ..., 280 (7 times) the loop calls a
synchronous "checkpoint upload" that blocks for 1 s with the process idle (time.sleep), after
the optimizer step and before rec.step(), inside the step.

Measured: those 7 steps take ~1.0 s each while the others take a few ms, so they are the
slowest steps of the run by far (only step 0, the first step, is also slower than the rest);
the data wait is negligible throughout (the stall is not in data loading). Training itself
is healthy: the loss falls from 1.39 (step 0) to ~0.62-0.66 (20-step means from step 140
on; the flipped labels and weak features set that floor), gradient norms stay at 0.2-0.9 with
no growth, no spikes. No NaN.

What is true of the run: periodic step-time outliers (a warning at least: 7 steps ~100x the
median) from step 40 on, every 40 steps; nothing else is wrong.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "step_time_outlier", "first_step": 40, "tolerance": 1, "top": True},
    ],
    "forbidden": ["dataloader_bottleneck", "loss_spike", "gradient_explosion",
                  "loss_divergence", "nonfinite"],
}

STEPS = 320
STALL_EVERY = 40
N, K, F = 400, 4, 16


def make_graph(gen):
    y = torch.arange(N) % K
    p = torch.where(y[:, None] == y[None, :], 0.04, 0.01)
    a = (torch.rand(N, N, generator=gen) < p).float().triu(1)
    a = a + a.T + torch.eye(N)
    d = a.sum(1).rsqrt()
    a_hat = d[:, None] * a * d[None, :]
    means = torch.randn(K, F, generator=gen) * 0.4
    x = means[y] + torch.randn(N, F, generator=gen)
    flip = torch.rand(N, generator=gen) < 0.1
    y_obs = torch.where(flip, torch.randint(0, K, (N,), generator=gen), y)
    return a_hat, x, y_obs


class GCN(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.lin1 = nn.Linear(F, hidden)
        self.lin2 = nn.Linear(hidden, K)
        self.drop = nn.Dropout(0.3)

    def forward(self, a_hat, x):
        h = torch.relu(a_hat @ self.lin1(self.drop(x)))
        return a_hat @ self.lin2(self.drop(h))


def upload_checkpoint(model):
    """Stands in for a blocking upload of the weights: the process just waits."""
    _ = {k: v.clone() for k, v in model.state_dict().items()}
    time.sleep(1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    a_hat, x, y = make_graph(gen)
    train_idx = torch.randperm(N, generator=gen)[:320]
    loader = DataLoader(train_idx, batch_size=32, shuffle=True,
                        generator=torch.Generator().manual_seed(2))
    model = GCN()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        while step < STEPS:
            for idx in rec.wrap_loader(loader):
                out = model(a_hat, x)
                loss = nn.functional.cross_entropy(out[idx], y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step > 0 and step % STALL_EVERY == 0:
                    upload_checkpoint(model)
                rec.step(loss=loss)
                if step % 40 == 0:
                    print(f"step {step} loss {loss.item():.4f}", flush=True)
                step += 1
                if step == STEPS:
                    break


if __name__ == "__main__":
    main()
