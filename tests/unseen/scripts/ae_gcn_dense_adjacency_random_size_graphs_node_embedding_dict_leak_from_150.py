"""Graph classification with a dense-adjacency GCN on random graphs of random size, with a
real leak from step 150: an "embedding drift" monitor switched on at step 150 stores the
node embeddings of the whole batch (8 x n x 64 floats, ~116 KiB a step) in a dict keyed by
step and never prunes it. LEAK from step 150.

What it does: each batch is 8 random graphs of 10-64 nodes (sizes uniform), each an
Erdos-Renyi graph, a two-block stochastic block model or a rewired ring lattice (the
class), all with mean degree ~4; the batch is padded to its largest graph (dense (8, n, n)
adjacency + node mask), so the padded size n (33-64 in this run) changes from batch to
batch. Node inputs: degree, log degree, mask, triangles / degree^2. Model: linear 4->64,
3 residual GCN layers (D^-1/2 (A+I) D^-1/2 h W, LayerNorm, ReLU), mean + max readout,
MLP 128->64->3. Adam(2e-3), 480 steps, one thread; the model is called directly.

What grows: before step 150 nothing (batched matmuls cache nothing per shape: a new padded
size costs the heap ~5 KiB); from step 150 the monitor dict, every step.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, read after each step once the
step's batch, logits and loss are dropped):
- Padded sizes: 29 distinct (33-64), new ones met 21 / 5 / 1 / 2 times in the four
  quarters, the last at step 457.
- The monitor at the end: 330 entries (steps 150-479), 37.25 MiB, 115.6 KiB a step on
  average.
- Heap: 124.8 MiB at step 0, 125.2 at 80, 126.6 at 160, 135.8 at 240, 145.0 at 320, 154.2
  at 400, 163.1 at 479.
- Heap rise: steps 1-74 +0.40 MiB (5-6 KiB a step, new sizes or not); 75-149 +0.13 MiB
  over 75 steps (1.8 KiB a step); 150-314 +18.9 MiB (118 KiB a step); 315-479 +18.8 MiB
  (117 KiB a step).
- RSS: 392 MiB at step 0, 404 at 80, 405 at 160, 412 at 240, 422 at 320, 431 at 400, 442 at
  479.
- Training works but the task is hard (ER vs block model): loss 1.13 at step 0 (chance
  1.10), 48-step window means 1.10, 0.95, 0.75, 0.76, 0.72, 0.72, 0.63, 0.64, 0.62, 0.65;
  finite throughout. About 5 s on 2 cores.
"""

import argparse
import ctypes
import os
import random

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 150, "tolerance": 24}]}

STEPS, BATCH, HIDDEN, CLASSES = 480, 8, 64, 3
MIN_NODES, MAX_NODES = 10, 64
MONITOR_FROM = 150           # the embedding monitor is switched on here

# ---- memory measurement (only for the numbers in the docstring; the recorder reads its own) --
class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):            # not glibc: heap figures read nan
    _mallinfo2 = None
_PAGE = os.sysconf("SC_PAGE_SIZE")


def heap_mib():
    """Bytes malloc has handed out and not got back (mallinfo2 uordblks + hblkhd), MiB."""
    if _mallinfo2 is None:
        return float("nan")
    m = _mallinfo2()
    return (m.uordblks + m.hblkhd) / 2 ** 20


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 2 ** 20


class Ledger:
    """One row per optimizer step, taken after the step's own tensors are dropped:
    (met a new input shape, heap MiB, RSS MiB, bytes held by the suspect container MiB, loss)."""

    def __init__(self):
        self.rows = []

    def add(self, new_shape, held_bytes, loss):
        self.rows.append((bool(new_shape), heap_mib(), rss_mib(), held_bytes / 2 ** 20, loss))

    def report(self, cuts):
        rows, n = self.rows, len(self.rows)
        first = [s for s, r in enumerate(rows) if r[0]]
        q = (n + 3) // 4
        print(f"[shapes] {len(first)} steps met a new input shape, the last at step "
              f"{first[-1] if first else None}; by quarter: "
              + ", ".join(str(sum(a <= s < a + q for s in first)) for a in range(0, n, q)))
        for s in sorted({0, n // 6, n // 3, n // 2, 2 * n // 3, 5 * n // 6, n - 1}):
            _, heap, rss, held, loss = rows[s]
            print(f"[mem] step {s}: heap {heap:.2f} MiB  rss {rss:.1f} MiB  held {held:.2f} MiB  "
                  f"loss {loss:.4f}")
        edges = sorted({1, *cuts, n})
        for i in range(len(edges) - 1):
            a, b = edges[i], edges[i + 1]
            parts = []
            for col, name in ((1, "heap"), (2, "rss"), (3, "held")):
                dn = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if rows[s][0]]
                dr = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if not rows[s][0]]
                parts.append(f"{name} {sum(dn):+.2f} MiB at {len(dn)} new-shape steps "
                             f"({1024 * sum(dn) / max(len(dn), 1):+.0f} KiB each), "
                             f"{sum(dr):+.2f} at {len(dr)} repeat steps "
                             f"({1024 * sum(dr) / max(len(dr), 1):+.1f} KiB each)")
            print(f"[rise] steps {a}-{b - 1}: " + "; ".join(parts))
        w = max(n // 10, 1)
        print("[loss] window means: " + ", ".join(
            f"{sum(r[4] for r in rows[a:a + w]) / len(rows[a:a + w]):.3f}"
            for a in range(0, n, w)) + "; window maxima: " + ", ".join(
            f"{max(r[4] for r in rows[a:a + w]):.3f}" for a in range(0, n, w)))

def random_graph(r, g, kind, n):
    """Dense symmetric 0/1 adjacency (n x n, no self loops), mean degree about 4.
    kind 0: Erdos-Renyi; 1: two-block stochastic block model; 2: ring lattice (k=4) with
    15% of its edges rewired (small world)."""
    if kind == 0:
        a = (torch.rand(n, n, generator=g) < 4.0 / (n - 1)).float()
    elif kind == 1:
        half = n // 2
        block = torch.zeros(n, n, dtype=torch.bool)
        block[:half, :half] = True
        block[half:, half:] = True
        p = torch.where(block, torch.tensor(3.6 / half), torch.tensor(0.4 / half))
        a = (torch.rand(n, n, generator=g) < p).float()
    else:
        idx = torch.arange(n)
        a = torch.zeros(n, n)
        for k in (1, 2):
            a[idx, (idx + k) % n] = 1.0
        src, dst = a.triu(1).nonzero(as_tuple=True)
        for e in range(len(src)):
            if r.random() < 0.15:
                a[src[e], dst[e]] = 0.0
                a[src[e], r.randrange(n)] = 1.0
    a = a.triu(1)
    return ((a + a.T) > 0).float()


def make_batch(r, g):
    """BATCH graphs of random sizes, padded to the largest in the batch."""
    sizes = [r.randint(MIN_NODES, MAX_NODES) for _ in range(BATCH)]
    kinds = [r.randrange(CLASSES) for _ in range(BATCH)]
    n = max(sizes)
    adj = torch.zeros(BATCH, n, n)
    mask = torch.zeros(BATCH, n)
    for i, (k, s) in enumerate(zip(kinds, sizes, strict=True)):
        adj[i, :s, :s] = random_graph(r, g, k, s)
        mask[i, :s] = 1.0
    return adj, mask, torch.tensor(kinds)


class DenseGCN(nn.Module):
    """3 GCN layers on padded dense adjacency (h <- relu(D^-1/2 (A + I) D^-1/2 h W)), node
    input features (degree, log degree, 1, triangle count / degree^2), mean + max readout,
    2-layer head."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, HIDDEN)
        self.layers = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.norms = nn.ModuleList(nn.LayerNorm(HIDDEN) for _ in range(3))
        self.head = nn.Sequential(nn.Linear(2 * HIDDEN, HIDDEN), nn.ReLU(),
                                  nn.Linear(HIDDEN, CLASSES))

    def forward(self, adj, mask):
        n = adj.shape[1]
        deg = adj.sum(-1)
        tri = torch.diagonal(adj @ adj @ adj, dim1=1, dim2=2) / 2
        x = torch.stack([deg / 4, torch.log1p(deg), mask,
                         tri / deg.clamp(min=1) ** 2], -1)
        a_hat = adj + torch.eye(n) * mask.unsqueeze(-1)
        d = a_hat.sum(-1).clamp(min=1).rsqrt()
        a_hat = d.unsqueeze(-1) * a_hat * d.unsqueeze(-2)
        h = self.inp(x) * mask.unsqueeze(-1)
        for lin, ln in zip(self.layers, self.norms, strict=True):
            h = h + F.relu(ln(a_hat @ lin(h))) * mask.unsqueeze(-1)
        cnt = mask.sum(1, keepdim=True)
        mean = h.sum(1) / cnt
        mx = h.masked_fill(mask.unsqueeze(-1) == 0, -1e4).max(1).values
        return self.head(torch.cat([mean, mx], -1)), h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    r, g = random.Random(11), torch.Generator().manual_seed(11)
    model = DenseGCN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    embedding_monitor = {}    # step -> node embeddings, for a drift plot
    seen, ledger = set(), Ledger()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(args.steps):
            adj, mask, y = make_batch(r, g)
            new = adj.shape[1] not in seen
            seen.add(adj.shape[1])
            logits, h = model(adj, mask)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= MONITOR_FROM:
                # THE BUG: the drift plot wanted one snapshot every 50 steps; this keeps the
                # node embeddings of the whole batch (BATCH x n x HIDDEN floats) of every step
                embedding_monitor[step] = h.detach().clone()
            rec.step(loss=loss)
            lv = loss.item()
            del adj, mask, y, logits, h, loss
            ledger.add(new, sum(t.numel() * 4 for t in embedding_monitor.values()), lv)
            if step % 60 == 0:
                print(f"step {step} loss {lv:.3f} sizes seen {len(seen)} "
                      f"kept {len(embedding_monitor)} heap {heap_mib():.1f} MiB", flush=True)
    ledger.report(cuts=(MONITOR_FROM // 2, MONITOR_FROM, (MONITOR_FROM + args.steps) // 2))
    held = sum(t.numel() * 4 for t in embedding_monitor.values())
    print(f"[held] monitor: {len(embedding_monitor)} entries, {held / 2 ** 20:.2f} MiB, "
          f"{held / max(len(embedding_monitor), 1) / 1024:.1f} KiB a step on average; "
          f"padded sizes seen: {sorted(seen)}")


if __name__ == "__main__":
    main()
