"""GIN-style message-passing network (edge lists, index_add_ aggregation) that learns BFS
hop distances on random sparse graphs of 10-80 nodes; batches hold a varying number of
graphs and nodes. From step PROBE_FROM the loop evaluates a held-out probe batch every step
WITHOUT torch.no_grad() and appends the probe loss tensor itself (not .item()) to a list for
a plot, so every probe forward's autograd graph and saved activations stay alive: HOST
MEMORY LEAK from step 240 of 400.

What it does: random sparse graphs of 10-80 nodes (a random spanning tree plus random edges,
average degree ~2.6) with one marked source node; node input [is source, 3 noise dims];
target: hop distance from the source, capped at 6 (7 classes). Each step takes random graphs
from a pool of 1,200 while they fit 900 nodes (15-25 graphs, 822-900 nodes); edge lists are
offset and concatenated. Model: input linear, 6 GIN layers (index_add_ sum aggregation,
(1 + eps) self term, 2-layer MLP, residual, LayerNorm), hidden 64, linear head. Adam(2e-3),
400 steps. The bug: from PROBE_FROM = 240 every step computes the cross-entropy of 2 random
held-out graphs with autograd on and appends the loss tensor to `probe_curve`; no backward is
ever run on it, so the whole probe forward (its saved activations) stays alive: ~1.15 MiB a
step.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- Before step 240 the heap is flat: 131.8-132.7 MiB over steps 0-239 (132.6 at step 239).
- From step 240 it grows by ~1.15 MiB/step to the end, step sizes varying with the probe
  graphs' sizes, no plateau: 133.8 MiB at 240, 176.9 at 279, 199.9 at 300, 316.3 at 399 (+184
  MiB over 160 steps; slope 1.18 MiB/step over 300-399).
- RSS: 413 MiB at step 0, 437.0-437.2 over steps 80-239 (flat), then up from ~249: 484 at
  279, 506 at 300, 622 at 399 (+1.19 MiB/step over 300-399).
- Training itself is fine: loss 2.04 at step 0 (ln 7 = 1.95), mean 1.63 over steps 0-39, 0.78
  over 80-119, 0.44 over 160-199, 0.14 over 200-279, 0.017 over 280-319, 0.005 over the last 40;
  batch accuracy >= 0.99 from ~275; the probe loss tracks the training loss. Finite throughout.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 240, "tolerance": 20},
    ],
}

STEPS, PROBE_FROM, NODE_BUDGET, PROBE_GRAPHS = 400, 240, 900, 2
MIN_NODES, MAX_NODES, AVG_DEGREE, MAX_HOPS = 10, 80, 2.6, 6
FEAT, HIDDEN, LAYERS = 4, 64, 6
LR = 2e-3

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):
    _mallinfo2 = None
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _mallinfo2 is not None:
        mi = _mallinfo2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def summarize(trace):
    """Print the measured truths: (loss, RSS, heap) per step, as Python floats."""
    n = len(trace)
    for s in (0, n // 4, n // 2, 3 * n // 4, n - 1):
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        mean = sum(p[0] for p in part) / len(part)
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean {mean:.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a in range(0, n, n // 4):
        part = trace[a:a + n // 4]
        xs = range(len(part))
        xm = (len(part) - 1) / 2
        den = sum((x - xm) ** 2 for x in xs)
        slope = [sum((x - xm) * p[i] for x, p in zip(xs, part, strict=True)) / den for i in (1, 2)]
        print(f"[slope] steps {a}-{a + len(part) - 1}: rss {slope[0]:+.3f} MiB/step, "
              f"heap {slope[1]:+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1]) for s in range(1, n)
             if abs(trace[s][1] - trace[s - 1][1]) >= 4]
    print("[jumps] rss moves of 4 MiB or more: "
          + ", ".join(f"{s}:{d:+.0f}" for s, d in jumps[:40]))


def bfs_hops(n, src, dst, source):
    """Hop distance from `source` to every node, capped at MAX_HOPS (unreachable -> cap)."""
    hops = torch.full((n,), MAX_HOPS, dtype=torch.long)
    hops[source] = 0
    frontier = torch.zeros(n, dtype=torch.bool)
    frontier[source] = True
    for d in range(1, MAX_HOPS):
        reach = torch.zeros(n, dtype=torch.bool)
        reach[dst[frontier[src]]] = True
        frontier = reach & (hops == MAX_HOPS)
        hops[frontier] = d
    return hops


def make_graph(g):
    """A random sparse graph: a random spanning tree (keeps most nodes reachable) plus
    Erdos-Renyi edges up to an average degree of ~2.6; one marked source node. Node input:
    [is source, 3 noise dims]; target: hop distance from the source, capped at 6."""
    n = int(torch.randint(MIN_NODES, MAX_NODES + 1, (1,), generator=g))
    parent = (torch.rand(n - 1, generator=g) * torch.arange(1, n)).long()
    tree = torch.stack([torch.arange(1, n), parent])
    extra = torch.randint(0, n, (2, max(int(n * (AVG_DEGREE / 2 - 1)), 1)), generator=g)
    edges = torch.cat([tree, extra], 1)
    edges = edges[:, edges[0] != edges[1]]
    src, dst = torch.cat([edges[0], edges[1]]), torch.cat([edges[1], edges[0]])
    source = int(torch.randint(0, n, (1,), generator=g))
    x = torch.cat([torch.zeros(n, 1), torch.randn(n, FEAT - 1, generator=g)], 1)
    x[source, 0] = 1.0
    return x, src, dst, bfs_hops(n, src, dst, source)


def collate(graphs):
    xs, srcs, dsts, ys, offset = [], [], [], [], 0
    for x, src, dst, y in graphs:
        xs.append(x)
        srcs.append(src + offset)
        dsts.append(dst + offset)
        ys.append(y)
        offset += x.shape[0]
    return torch.cat(xs), torch.cat(srcs), torch.cat(dsts), torch.cat(ys)


class GINLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(()))
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN))
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, h, src, dst):
        agg = torch.zeros_like(h).index_add_(0, dst, h[src])
        return self.norm(h + F.relu(self.mlp((1 + self.eps) * h + agg)))


class GIN(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEAT, HIDDEN)
        self.layers = nn.ModuleList([GINLayer() for _ in range(LAYERS)])
        self.out = nn.Linear(HIDDEN, MAX_HOPS + 1)

    def forward(self, x, src, dst):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, src, dst)
        return self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    pool = [make_graph(g) for _ in range(1200)]
    held_out = [make_graph(g) for _ in range(200)]
    model = GIN()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    probe_curve = []                # the leak: loss tensors with their autograd graphs
    trace = []                                  # (loss, RSS, heap) per step: floats only
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            graphs, nodes = [], 0      # graphs until the node budget is used up
            while True:
                graph = pool[int(torch.randint(0, len(pool), (1,), generator=g))]
                if nodes + graph[0].shape[0] > NODE_BUDGET:
                    break
                graphs.append(graph)
                nodes += graph[0].shape[0]
            x, src, dst, y = collate(graphs)
            logits = model(x, src, dst)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean().item()
            if step >= PROBE_FROM:
                idx = torch.randint(0, len(held_out), (PROBE_GRAPHS,), generator=g).tolist()
                px, psrc, pdst, py = collate([held_out[i] for i in idx])
                probe_curve.append(F.cross_entropy(model(px, psrc, pdst), py))
            rec.step(loss=loss, acc=acc, graphs=len(graphs), nodes=nodes)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step in (PROBE_FROM - 1, PROBE_FROM + 1) or step == STEPS - 1:
                probe = f"{probe_curve[-1].item():.4f}" if probe_curve else "-"
                print(f"step {step} graphs {len(graphs)} nodes {nodes} loss {loss.item():.4f} "
                      f"acc {acc:.3f} probe {probe} kept {len(probe_curve)} rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB", flush=True)
    summarize(trace)


if __name__ == "__main__":
    main()
