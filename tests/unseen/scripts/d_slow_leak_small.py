"""GNN-style message passing (plain torch) with a small leak of 32 KiB a step from step 50.

What it does: node classification (3 classes) on one fixed random graph of 1024 nodes and
8192 directed edges; node features are 16-dim, class-dependent means plus noise, and edges
are mostly within a class (homophilous). Model: two message-passing layers written with
plain torch — per-edge gate ``w = sigmoid(a · [h_src, h_dst])`` (one float per edge),
messages ``w * W h_src`` summed into the destination with ``index_add_``, degree-normalised,
plus a self term, ReLU — then a linear head. Full-graph training with feature dropout 0.1
(so each step differs), Adam(lr=5e-3), 450 steps.

The bug: from step LOG_FROM = 50 on, the loop keeps the first layer's edge gates "to plot
how attention evolves": ``gate_log.append(w.detach().clone())`` — 8192 float32, 32,768 bytes
(32 KiB) per step, never cleared. Steps 0-49 keep nothing. Over the remaining 400 steps the
list grows to 400 × 32 KiB = 12.5 MiB, linearly.

What is TRUE of the run (ground truth):
- A small, steady host-memory leak starting at step 50: the live heap grows by 32 KiB every
  step from step 50 to step 449, with no plateau — a leak a user would want to hear about
  (memory_leak, first step 50). The per-step growth is small compared with the process's
  size (≈0.01% of RSS per step), so its first step is hard to pin exactly; ±20 steps is fair.
  Measured: the live heap is flat (124.89-124.92 MiB) over steps 1-49, then grows by 32 KiB at
  every step to step 449 (+12.5 MiB), apart from the recorder's own buffers (≈3 MiB taken at
  steps 50-52, given back at step 200).
- Training is otherwise healthy: the loss falls from ≈1.1 (ln 3) to a low value; no
  divergence, no NaN/Inf.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 50, "tolerance": 20},
    ],
    "forbidden": ["loss_divergence", "nonfinite"],
}

STEPS, NODES, EDGES, FEAT, HIDDEN, CLASSES = 450, 1024, 8192, 16, 32, 3
LOG_FROM = 50


def make_graph(g: torch.Generator):
    y = torch.randint(0, CLASSES, (NODES,), generator=g)
    means = torch.randn(CLASSES, FEAT, generator=g)
    x = means[y] * 0.7 + torch.randn(NODES, FEAT, generator=g)
    src = torch.randint(0, NODES, (EDGES,), generator=g)
    same = torch.rand(EDGES, generator=g) < 0.8
    # homophilous: 80% of edges go to a random node of the source's class
    by_class = [torch.nonzero(y == c).flatten() for c in range(CLASSES)]
    dst = torch.randint(0, NODES, (EDGES,), generator=g)
    for c in range(CLASSES):
        sel = same & (y[src] == c)
        pick = torch.randint(0, len(by_class[c]), (int(sel.sum()),), generator=g)
        dst[sel] = by_class[c][pick]
    deg = torch.zeros(NODES).index_add_(0, dst, torch.ones(EDGES)).clamp(min=1)
    return x, y, src, dst, deg


class GatedMP(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.msg = nn.Linear(cin, cout)
        self.self_ = nn.Linear(cin, cout)
        self.gate = nn.Linear(2 * cin, 1)

    def forward(self, h, src, dst, deg):
        w = torch.sigmoid(self.gate(torch.cat([h[src], h[dst]], dim=1))).squeeze(1)  # (E,)
        m = self.msg(h)[src] * w[:, None]
        agg = torch.zeros(h.shape[0], m.shape[1]).index_add(0, dst, m) / deg[:, None]
        return torch.relu(agg + self.self_(h)), w


class GNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = GatedMP(FEAT, HIDDEN)
        self.l2 = GatedMP(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, src, dst, deg):
        h, w1 = self.l1(self.drop(x), src, dst, deg)
        h, _ = self.l2(h, src, dst, deg)
        return self.head(h), w1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y, src, dst, deg = make_graph(torch.Generator().manual_seed(1))

    model = GNN()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    gate_log = []  # the leak, from LOG_FROM on: 32 KiB per step
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            logits, w1 = model(x, src, dst, deg)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= LOG_FROM:
                gate_log.append(w1.detach().clone())  # "to plot how attention evolves"
            rec.step(loss=loss)
            losses.append(loss.item())
    acc = (logits.argmax(1) == y).float().mean().item()
    held = sum(t.untyped_storage().nbytes() for t in gate_log)
    print(f"loss first {losses[0]:.3f} last-10 mean {sum(losses[-10:]) / 10:.4f} acc {acc:.3f}; "
          f"gate_log holds {len(gate_log)} tensors, {held / 2**10:.0f} KiB")


if __name__ == "__main__":
    main()
