"""Plain-torch GCN graph regressor, SGD+momentum, no clipping; one graph x200 leads to NaN.

What it does: 300 steps of 16 random graphs (12 nodes, edge prob. 0.25, symmetric, self
loops, symmetric normalisation D^-1/2 (A+I) D^-1/2 as dense matrices), 8 Gaussian node
features; the graph-level target is a smooth function of two-hop aggregated features plus
noise. The model is three GCN layers (32 units, ReLU), mean readout and a linear head; MSE,
SGD(lr=0.05, momentum=0.9), no gradient clipping.

At step BAD_STEP = 170 one graph of the batch has all its node features x200 (a unit bug).

What is TRUE of the run (measured):
- Steps 0-169: the loss falls from 0.33 to ~0.01-0.05; grad norm ~0.02-0.5.
- Step 170: the loss jumps to ~340 and the gradient norm to ~1900. This corrupt batch is the
  root cause; the run's trouble starts at this step.
- Its update (and the momentum that carries it) blows the weights up: the loss is ~1.1e4 at
  171-172, ~4e9 at 173, ~6e14 at 174, the loss is inf at step 175 (gradient norm inf)
  and NaN from step 176 to the end (weights NaN). The training loop keeps running. Nothing
  wrong with memory, data loading or step times.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 170, "tolerance": 1, "top": True},
    ],
    "forbidden": ["memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, NODES, FEATS = 300, 16, 12, 8
BAD_STEP, BAD_GRAPH, SCALE = 170, 2, 200.0


def make_graphs(n, g):
    a = (torch.rand(n, NODES, NODES, generator=g) < 0.25).float()
    a = ((a + a.transpose(1, 2)) > 0).float() + torch.eye(NODES)
    d = a.sum(-1).rsqrt()
    a = d[..., None] * a * d[:, None, :]
    x = torch.randn(n, NODES, FEATS, generator=g)
    y = (a @ (a @ x))[..., :3].relu().sum((1, 2)) / NODES + 0.05 * torch.randn(n, generator=g)
    return a, x, y


class GCN(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.l1 = nn.Linear(FEATS, hidden)
        self.l2 = nn.Linear(hidden, hidden)
        self.l3 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, adj, x):
        x = F.relu(adj @ self.l1(x))
        x = F.relu(adj @ self.l2(x))
        x = F.relu(adj @ self.l3(x))
        return self.out(x.mean(1)).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    adj, feats, target = make_graphs(STEPS * BATCH, torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GCN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            sl = slice(step * BATCH, (step + 1) * BATCH)
            a, x, y = adj[sl], feats[sl], target[sl]
            if step == BAD_STEP:  # one graph's features in the wrong unit
                x = x.clone()
                x[BAD_GRAPH] *= SCALE
            loss = F.mse_loss(model(a, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or BAD_STEP <= step <= BAD_STEP + 6:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
