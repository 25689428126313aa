"""Dense-adjacency graph convolutional network on batches of random geometric graphs whose
node count varies from batch to batch and graph to graph (8-160 nodes); each batch is padded
to its largest graph and holds about 1,200 node slots (7-75 graphs), so the (graphs, nodes,
nodes) adjacency and every activation change shape every step. Node-level regression of the
two-hop neighbourhood size. HEALTHY.

What it does: random geometric graphs (nodes uniform in the unit square, edge under distance
0.18). Each step draws a largest size n from 16-160, fills 1,200 padded node slots with
1200 // n graphs (7-75) of n/2..n nodes, and pads them to n: dense (graphs, n, n) adjacency.
Node input: (x, y, 1); target: log(1 + nodes within two hops), MSE on real nodes. Model: input
linear, 4 dense GCN layers (bmm sum aggregation + a degree-normalised copy, residual,
LayerNorm), MLP head; hidden 64. Adam(2e-3), StepLR halving at steps 150 and 300, 400 steps.
Nothing is kept across steps but floats.

What is TRUE of the run (measured, three runs; heap = glibc mallinfo2 uordblks + hblkhd, RSS
from psutil, both right after rec.step):
- The batch shape changes almost every step (138 distinct padded sizes, each with its own graph
  count, over 400 steps); the largest padded size so far is 159 from step 13 and 160 from step
  150.
- Loss 1.85 at step 0; mean 0.40 over steps 0-39, 0.085 over 40-79, 0.048 over 80-119, then
  0.036-0.055 per 40-step window (0.036 over the last 40). Finite throughout.
- Heap: 125.8 MiB at step 0, within 125.7-127.1 MiB for the whole run; no trend after step ~80
  (slope within +-0.002 MiB/step in each of the last three quarters).
- RSS: 400 MiB at step 0, 413-419 over steps 40-79, ~420.5-420.8 from step ~80; then one late
  rise of 12-14 MiB whose step differs between runs, flat around it: run 2 420.8-421.9 over
  steps 80-299, +12 at step 300, 434.0 to the end; run 1 420.8 until a step between 160 and 199,
  433.2 to 359, 434.4 at the end; run 3 420.5-421.1 over 80-239, 424.2 over 280-374, +8 at 375
  and +6 at 376, 438.6 to the end (quarter slopes +0.14, +0.00, +0.05, +0.16). RSS at steps 0,
  100, 200, 300, 399 (run 2): 399.5, 420.8, 420.9, 434.0, 434.0 MiB; run 2 quarter slopes
  +0.135, +0.001, +0.011, +0.000 MiB/step.
- Nothing is wrong: a healthy run; its RSS growth is shape-driven (mostly in the first ~80
  steps, plus one late step of 12-14 MiB) and is not a leak: the heap stays flat.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
}

STEPS, NODE_SLOTS, MIN_NODES, MAX_NODES, HIDDEN, LAYERS = 400, 1200, 16, 160, 64, 4
RADIUS = 0.18
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


def make_batch(g):
    """A batch of random geometric graphs (nodes uniform in the unit square, edge when closer
    than RADIUS): a largest size n drawn from 16-160, the graphs' sizes from n/2..n, as many
    graphs as fit NODE_SLOTS padded slots. Node input: its coordinates and a constant 1;
    target: log(1 + number of nodes within two hops), which needs two rounds of aggregation."""
    n = int(torch.randint(MIN_NODES, MAX_NODES + 1, (1,), generator=g))
    graphs = NODE_SLOTS // n
    sizes = torch.randint(n // 2, n + 1, (graphs,), generator=g)
    sizes[0] = n
    pos = torch.rand(graphs, n, 2, generator=g)
    valid = torch.arange(n)[None] < sizes[:, None]                           # (G, n)
    pair = valid[:, :, None] & valid[:, None, :]
    adj = (torch.cdist(pos, pos) < RADIUS) & pair
    adj &= ~torch.eye(n, dtype=torch.bool)[None]
    a = adj.float()
    reach = ((a + a @ a) > 0) & pair & ~torch.eye(n, dtype=torch.bool)[None]
    target = torch.log1p(reach.sum(2).float())
    x = torch.cat([pos, torch.ones(graphs, n, 1)], 2) * valid[:, :, None]
    return x, a, valid, target


class DenseGCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, HIDDEN)
        self.self_lin = nn.ModuleList([nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS)])
        self.nbr_lin = nn.ModuleList([nn.Linear(HIDDEN, HIDDEN, bias=False)
                                      for _ in range(LAYERS)])
        self.norms = nn.ModuleList([nn.LayerNorm(HIDDEN) for _ in range(LAYERS)])
        self.out = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))

    def forward(self, x, a):
        h = F.relu(self.inp(x))
        deg = a.sum(2, keepdim=True)
        for lin_s, lin_n, norm in zip(self.self_lin, self.nbr_lin, self.norms, strict=True):
            # sum aggregation plus a mean-normalised copy: counts and averages both available
            agg = torch.bmm(a, h)
            h = norm(h + F.relu(lin_s(h) + lin_n(agg) / 8 + lin_n(agg / deg.clamp(min=1))))
        return self.out(h).squeeze(2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = DenseGCN()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=150, gamma=0.5)
    largest = 0
    trace = []                                  # (loss, RSS, heap) per step: floats only
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, a, valid, target = make_batch(g)
            pred = model(x, a)
            loss = F.mse_loss(pred[valid], target[valid])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            rec.step(loss=loss, nodes=int(valid.sum()), graphs=x.shape[0],
                     padded_nodes=x.shape[1])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            new = x.shape[1] > largest
            largest = max(largest, x.shape[1])
            if new or step % 40 == 0 or step == STEPS - 1:
                print(f"step {step} graphs {x.shape[0]} padded nodes {x.shape[1]}"
                      f"{' NEW MAX' if new else ''} "
                      f"loss {loss.item():.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB",
                      flush=True)
    summarize(trace)


if __name__ == "__main__":
    main()
