"""Message-passing GNN (edge MLP messages summed with index_add_, GRU node update) on batches of
stochastic-block-model graphs; node classification + graph-level regression; SGD with Nesterov
momentum and ReduceLROnPlateau on a validation loss. HEALTHY.

What it does: a pool of 1,500 stochastic-block-model graphs (16-32 nodes, 3 communities,
edge probability 0.5 inside and 0.03 across); node features are a one-hot community hint
(x1.0) plus unit Gaussian noise on 8 dimensions. Each step batches 24 graphs (offset edge
lists). Model: linear embedding, 3 message-passing layers (edge MLP on [h_dst, h_src, 1/deg]
summed into nodes with index_add_ and divided by degree, GRUCell update, LayerNorm), a node
classification head, and a graph head on [mean, max] pooling (scatter_reduce amax) that
regresses the graph's standardised mean degree. Loss = node CE + 0.5 * graph MSE.
SGD(lr 0.05, momentum 0.9, nesterov, weight decay 1e-4); ReduceLROnPlateau(factor 0.5,
patience 1, threshold 1%) stepped every 30 steps on the validation loss of 200 held-out graphs.
420 steps.

What is TRUE of the run (measured):
- Loss 1.72 at step 0 (mean 1.41 over steps 0-9), mean 0.86 over steps 40-79, 0.75 over
  120-159, 0.60 over 200-239, 0.51 over 320-359, 0.48 over the last 40 steps. Per-batch loss
  is noisy (e.g. 0.41-1.02 within 240-279) because of the graph-regression term.
- Validation node accuracy 0.83 at step 29, 0.88 from step ~120 on (a 2-hop neighbour vote
  reaches ~0.87); validation graph MSE 1.02 at step 29, 0.48-0.51 at steps 389-419.
- ReduceLROnPlateau halved the LR once, after the evaluation at step 269: lr 0.05 for steps
  0-269, 0.025 from step 270 to the end.
- Grad norm median 1.09, max 5.1 (isolated, step window 240-279), no NaN/Inf.
- Step time median ~25 ms (p99 ~100 ms; the 30-step evaluations add time to one step each).
- Nothing is wrong: a healthy run.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
}

STEPS, GRAPHS_PER_BATCH, COMMUNITIES, FEAT, HIDDEN, LAYERS = 420, 24, 3, 8, 48, 3
EVAL_EVERY = 30
HINT, P_IN, P_OUT = 1.0, 0.5, 0.03
DEG_MEAN, DEG_STD = 4.3, 1.05
LR = 0.05


def make_graph(g):
    """One SBM graph: 16-32 nodes in 3 communities, dense inside, sparse across. Node features
    are a weak, noisy hint of the community, so neighbours must be pooled to classify well."""
    n = int(torch.randint(16, 33, (1,), generator=g))
    comm = torch.randint(0, COMMUNITIES, (n,), generator=g)
    same = comm[:, None] == comm[None, :]
    prob = torch.where(same, torch.tensor(P_IN), torch.tensor(P_OUT))
    adj = torch.rand(n, n, generator=g) < prob
    adj = torch.triu(adj, 1)
    adj = adj | adj.T
    src, dst = adj.nonzero(as_tuple=True)
    hint = F.one_hot(comm, COMMUNITIES).float() * HINT
    x = torch.cat([hint, torch.zeros(n, FEAT - COMMUNITIES)], 1) + torch.randn(n, FEAT, generator=g)
    # graph target: mean degree, standardised (~zero mean, unit scale); node inputs carry no degree
    target = (adj.sum(1).float().mean() - DEG_MEAN) / DEG_STD
    return x, src, dst, comm, target


def collate(graphs):
    xs, srcs, dsts, comms, targets, batch = [], [], [], [], [], []
    offset = 0
    for i, (x, src, dst, comm, within) in enumerate(graphs):
        xs.append(x)
        srcs.append(src + offset)
        dsts.append(dst + offset)
        comms.append(comm)
        targets.append(within)
        batch.append(torch.full((x.shape[0],), i, dtype=torch.long))
        offset += x.shape[0]
    return (torch.cat(xs), torch.cat(srcs), torch.cat(dsts), torch.cat(comms),
            torch.stack(targets), torch.cat(batch))


class MPNNLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.message = nn.Sequential(nn.Linear(2 * d + 1, d), nn.GELU(), nn.Linear(d, d))
        self.update = nn.GRUCell(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, h, src, dst, deg):
        edge_feat = (1.0 / deg[src].clamp(min=1)).unsqueeze(1)
        msg = self.message(torch.cat([h[dst], h[src], edge_feat], 1))
        agg = torch.zeros_like(h).index_add_(0, dst, msg) / deg.clamp(min=1).unsqueeze(1)
        return self.norm(self.update(agg, h))


class MPNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(FEAT, HIDDEN)
        self.layers = nn.ModuleList([MPNNLayer(HIDDEN) for _ in range(LAYERS)])
        self.node_head = nn.Linear(HIDDEN, COMMUNITIES)
        self.graph_head = nn.Sequential(nn.Linear(2 * HIDDEN, HIDDEN), nn.GELU(),
                                        nn.Linear(HIDDEN, 1))

    def forward(self, x, src, dst, batch, n_graphs):
        deg = torch.zeros(x.shape[0]).index_add_(0, dst, torch.ones(dst.shape[0]))
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, src, dst, deg)
        counts = torch.zeros(n_graphs).index_add_(0, batch, torch.ones(batch.shape[0]))
        mean = torch.zeros(n_graphs, HIDDEN).index_add_(0, batch, h) / counts[:, None]
        mx = torch.full((n_graphs, HIDDEN), -1e4).scatter_reduce_(
            0, batch[:, None].expand(-1, HIDDEN), h, "amax")
        return self.node_head(h), self.graph_head(torch.cat([mean, mx], 1)).squeeze(1)


def losses(model, batch):
    x, src, dst, comm, target, graph_of = batch
    node_logits, graph_pred = model(x, src, dst, graph_of, target.shape[0])
    node_loss = F.cross_entropy(node_logits, comm)
    graph_loss = F.mse_loss(graph_pred, target)
    acc = (node_logits.argmax(1) == comm).float().mean()
    return node_loss, graph_loss, acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    pool = [make_graph(g) for _ in range(1500)]
    val = collate([make_graph(g) for _ in range(200)])
    model = MPNN()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=1,
                                                       threshold=0.01)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            idx = torch.randint(0, len(pool), (GRAPHS_PER_BATCH,), generator=g).tolist()
            node_loss, graph_loss, acc = losses(model, collate([pool[i] for i in idx]))
            loss = node_loss + 0.5 * graph_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, node_loss=node_loss, graph_loss=graph_loss, node_acc=acc)
            if (step + 1) % EVAL_EVERY == 0:
                model.eval()
                with torch.no_grad():
                    vn, vg, vacc = losses(model, val)
                model.train()
                sched.step((vn + 0.5 * vg).item())
                print(f"step {step} loss {loss.item():.4f} val node {vn.item():.4f} "
                      f"graph {vg.item():.4f} acc {vacc.item():.3f} "
                      f"lr {opt.param_groups[0]['lr']:.2e}", flush=True)


if __name__ == "__main__":
    main()
