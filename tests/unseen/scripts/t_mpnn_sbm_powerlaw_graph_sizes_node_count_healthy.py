"""Edge-MLP message-passing network doing node classification on stochastic-block-model graphs
whose sizes follow a power law: each step batches 8 graphs of 12-700 nodes (Pareto, alpha
1.2), so the nodes (and edges) in a step vary ~10x and the step time with them. The step's
node count is passed as ``rec.step(tokens=)``. HEALTHY.

What it does: every graph has two equal communities; a node's label is its community. Edges:
3 per node (made undirected, so ~6 per node on average), 85% within the community. Node
features: 8 dims, Gaussian noise of std 1.0 plus +-0.35 on dims 0-3 by community, so a node
alone is only ~75% separable and its neighbourhood carries the rest. Per step: 8 graph sizes
round(12 * U^(-1/1.2)) clipped to 12..700, graphs concatenated with node offsets (one big
disconnected graph). Model: Linear(8, 64) encoder; 3 message-passing layers, each an edge MLP
Linear(128, 64)-ReLU on [h_src, h_dst], mean-aggregated at the destination with
``index_add_``, then h + MLP(Linear(128, 64)-ReLU-Linear(64, 64)) on [h, message] and
LayerNorm; Linear(64, 2) head; cross-entropy over all nodes. Adam(3e-3), 400 steps.

What is TRUE of the run (measured twice on the shared 2-core machine, 19-25 s wall; figures
from the recorded ``steps`` table of the judged run, the second run in brackets):
- Nodes per step (seeded, same in every run): 117-1,130, median 262, p90 669 (~6 incoming
  edges per node on average).
- Step time (steps 2-399): median 26 ms, p10 16.5, p90 50, p99 77, max 102 ms (step 52, the
  recorder's own profiler window; step 1 120 ms, warm-up) [median 35, p10 18, p90 71, max
  150 ms at step 254, 855 nodes]. It follows the nodes in the step (corr 0.73 with the step
  time, 0.82 with its CPU time; ~120 us per node); the slow steps are the big-graph steps
  (271: 92 ms, 916 nodes; 280: 85 ms, 1,130 nodes; 237: 70 ms, 978 nodes), scattered, none
  periodic; 4.2 s of run-queue wait in all from other processes on the shared cores.
- Loss (per-node cross-entropy; 50-step means) 0.336, 0.266, 0.238, 0.292, 0.263, 0.263,
  0.270, 0.247; node accuracy ~0.86 -> ~0.90 from step ~100 (the features' noise caps it).
  Median loss 0.236 from step 50, p99 0.545; the highest after step 10 is 0.684 at step 301,
  a small batch (206 nodes), as the other high ones (79: 0.62, 127 nodes; 264: 0.55, 118
  nodes). Finite.
- RSS 395 -> 457 MB: 428 by step 25, 436 by 150, flat 436.3-436.4 over 150-290, +20 MB over
  300-325 (big-graph batches), flat 456.9 to the end.
- Nothing is wrong: variable graph sizes, the node count passed as tokens.
"""

import argparse
import math
import time

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, GRAPHS, FEAT, DIM, ALPHA, N_MIN, N_MAX = 400, 8, 8, 64, 1.2, 12, 700


def make_graph(n, gen):
    half = n // 2
    comm = (torch.arange(n) >= half).long()
    x = torch.randn(n, FEAT, generator=gen)
    x[:, :4] += 0.35 * (2 * comm[:, None] - 1)
    src = torch.randint(0, n, (3 * n,), generator=gen)
    same = torch.rand(3 * n, generator=gen) < 0.85
    dst_comm = torch.where(same, comm[src], 1 - comm[src])
    lo = torch.randint(0, half, (3 * n,), generator=gen)
    hi = torch.randint(half, n, (3 * n,), generator=gen)
    dst = torch.where(dst_comm == 0, lo, hi)
    return x, torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]), comm


def make_batch(gen):
    u = torch.rand(GRAPHS, generator=gen)
    sizes = (N_MIN * u.pow(-1 / ALPHA)).round().clamp(N_MIN, N_MAX).long().tolist()
    xs, es, ys, off = [], [], [], 0
    for n in sizes:
        x, e, y = make_graph(n, gen)
        xs.append(x)
        es.append(e + off)
        ys.append(y)
        off += n
    return torch.cat(xs), torch.cat(es, 1), torch.cat(ys), sizes


class MPLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.edge = nn.Sequential(nn.Linear(2 * DIM, DIM), nn.ReLU())
        self.update = nn.Sequential(nn.Linear(2 * DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, h, edges, deg):
        src, dst = edges
        msg = self.edge(torch.cat([h[src], h[dst]], 1))
        agg = torch.zeros_like(h).index_add_(0, dst, msg) / deg
        return self.norm(h + self.update(torch.cat([h, agg], 1)))


class MPNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(FEAT, DIM)
        self.layers = nn.ModuleList(MPLayer() for _ in range(3))
        self.head = nn.Linear(DIM, 2)

    def forward(self, x, edges):
        deg = torch.zeros(x.shape[0]).index_add_(0, edges[1], torch.ones(edges.shape[1]))
        deg = deg.clamp(min=1)[:, None]
        h = self.enc(x)
        for layer in self.layers:
            h = layer(h, edges, deg)
        return self.head(h)


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(12)
    model = MPNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, durs, nodes, accs = [], [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        last = time.perf_counter()
        for _step in range(STEPS):
            x, edges, y, sizes = make_batch(gen)
            logits = model(x, edges)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss, tokens=sum(sizes))
            now = time.perf_counter()
            durs.append(now - last)
            last = now
            losses.append(loss.item())
            nodes.append(sum(sizes))
            accs.append((logits.argmax(1) == y).float().mean().item())
    d = durs[2:]
    print(f"step time median {pct(d, 0.5) * 1e3:.1f} ms, p10 {pct(d, 0.1) * 1e3:.1f}, p90 "
          f"{pct(d, 0.9) * 1e3:.1f}, p99 {pct(d, 0.99) * 1e3:.1f}, max {max(d) * 1e3:.1f} ms; "
          f"total {sum(durs):.1f} s")
    print(f"nodes per step: min {min(nodes)}, p10 {pct(nodes, 0.1)}, median {pct(nodes, 0.5)}, "
          f"p90 {pct(nodes, 0.9)}, max {max(nodes)}")
    mx, my = sum(nodes) / STEPS, sum(durs) / STEPS
    cov = sum((a - mx) * (b - my) for a, b in zip(nodes, durs, strict=True))
    corr = cov / math.sqrt(sum((a - mx) ** 2 for a in nodes) * sum((b - my) ** 2 for b in durs))
    print(f"corr(nodes, step time) = {corr:.3f}")
    us = sorted(1e6 * t / n for t, n in zip(durs[2:], nodes[2:], strict=True))
    print(f"us per node: median {us[len(us) // 2]:.1f}")
    top = sorted(range(STEPS), key=lambda i: -durs[i])[:8]
    print("slowest steps (step, ms, nodes)", [(i, round(durs[i] * 1e3, 1), nodes[i]) for i in top])
    w = 50
    print("loss window means", [round(sum(losses[i:i + w]) / w, 3) for i in range(0, STEPS, w)])
    print("node acc window means", [round(sum(accs[i:i + w]) / w, 3)
                                    for i in range(0, STEPS, w)])
    print("loss max", round(max(losses[10:]), 3), "at", losses.index(max(losses[10:])))


if __name__ == "__main__":
    main()
