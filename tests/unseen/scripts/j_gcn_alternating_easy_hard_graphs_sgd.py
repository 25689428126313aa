"""Dense-adjacency GCN for node classification, trained with SGD-momentum on two graph
datasets in strict alternation: clean, well-separated community graphs on even steps and
noisy, weakly clustered ones on odd steps.

What it does: every step draws 8 fresh stochastic-block-model graphs of 30 nodes in 3
communities; node features are a noisy copy of the community's centroid (16-dim, norm 2).
Even steps use the easy dataset (p_in 0.45, p_out 0.03, feature signal 0.6, noise 1.0), odd
steps the hard one (p_in 0.35, p_out 0.07, signal 0.4, noise 1.0); the task is the same
(predict each node's community, 3-way cross-entropy, chance ln 3 = 1.10). Model: 3 GCN layers
(symmetric-normalised adjacency with self-loops, width 48, ReLU, residual) and a linear
head. SGD lr 0.004 (constant), momentum 0.9, 560 steps.

What is TRUE of the run (measured; medians per dataset over 40-step windows):
- Both datasets are learnt together: easy 1.07 (steps 0-39) -> 0.79 (80-119) -> 0.45
  (160-199) -> 0.29 (240-279) -> ~0.21-0.23 (400-559); hard 1.09 -> 0.95 -> 0.78 -> 0.70 ->
  ~0.67-0.72 (400-559). Grad norm median 0.2-0.55 on both.
- The recorded loss alternates every step between the two levels (late: ~0.21 vs ~0.70,
  a 3.3x ratio): a period-2 saw-tooth from the data schedule, not spikes or instability.
  After step ~300 the losses improve only slowly (each dataset near what this model gets
  from fresh graphs); that is convergence, not a stall.
- No NaN/Inf, nothing wrong with memory, data or step times. Healthy: nothing above info.
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True,
          "forbidden": ["loss_spike", "loss_divergence", "gradient_explosion", "loss_plateau"]}

NODES, COMMS, FEAT, GRAPHS, STEPS, LR = 30, 3, 16, 8, 560, 0.004

# (p_in, p_out, feature signal, feature noise) of each dataset
EASY = (0.45, 0.03, 0.6, 1.0)
HARD = (0.35, 0.07, 0.4, 1.0)


def graph_batch(g, centroids, spec):
    """GRAPHS stochastic-block-model graphs; node features are a noisy copy of the
    community centroid. Returns normalised adjacency (G, N, N), features, labels."""
    p_in, p_out, signal, noise = spec
    y = torch.randint(0, COMMS, (GRAPHS, NODES), generator=g)
    same = (y[:, :, None] == y[:, None, :]).float()
    p = same * p_in + (1 - same) * p_out
    a = (torch.rand(GRAPHS, NODES, NODES, generator=g) < p).float().triu(1)
    a = a + a.transpose(1, 2) + torch.eye(NODES)
    d = a.sum(-1).rsqrt()
    a_hat = d[:, :, None] * a * d[:, None, :]
    x = signal * centroids[y] + noise * torch.randn(GRAPHS, NODES, FEAT, generator=g)
    return a_hat, x, y


class GCN(nn.Module):
    def __init__(self, hidden=48, layers=3):
        super().__init__()
        dims = [FEAT] + [hidden] * layers
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        self.out = nn.Linear(hidden, COMMS)

    def forward(self, a_hat, x):
        h = x
        for lin in self.lins:
            h = F.relu(a_hat @ lin(h)) + (h if h.shape[-1] == lin.out_features else 0)
        return self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    centroids = torch.randn(COMMS, FEAT, generator=torch.Generator().manual_seed(6))
    centroids = centroids / centroids.norm(dim=1, keepdim=True) * 2.0
    model = GCN()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            hard = step % 2 == 1
            a_hat, x, y = graph_batch(g, centroids, HARD if hard else EASY)
            logits = model(a_hat, x)
            loss = F.cross_entropy(logits.reshape(-1, COMMS), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = (logits.argmax(-1) == y).float().mean()
            rec.step(loss=loss, acc=acc, hard=float(hard))
            if step % 70 < 2:
                print(f"step {step} {'hard' if hard else 'easy'} loss {loss.item():.3f} "
                      f"acc {acc.item():.2f}", flush=True)


if __name__ == "__main__":
    main()
