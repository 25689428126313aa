"""DCN-v2 tabular classifier; from step 50 the loop keeps a Python "batch report" dict every step.

What it does: 5-way classification of synthetic customer rows (8 numeric columns, 4
categorical columns of 50 levels; the label depends on pairwise products of the numeric
columns and on per-category effects, plus noise); a fresh batch of 256 rows each step, 300
steps. Model, written after DCN-v2 (parallel form): embeddings (4 × 50 → 8) concatenated with
the numeric columns (40 features) → 3 cross layers x_{l+1} = x0 ⊙ (W x_l + b) + x_l alongside
a 2-layer MLP (128, 64) → concatenated → linear(104 → 5); Adam(lr=2e-3).

The bug: from REPORT_FROM = 50 on, every step builds an "audit record" of the batch out of
plain Python objects — row-id strings, "region=…/device=…/channel=…/plan=…" segment strings,
labels, per-row losses and confidences (floats) and per-row probability tuples: no tensors —
and appends it to a list that is never cleared. Each record is ≈112 KiB (tracemalloc),
250 records over the run.

What is TRUE of the run (ground truth):
- A leak from step 50 to the end (memory_leak, first step 50), linear, no plateau, made of
  Python objects. Measured with the Recorder replaced by a stub (end of each step): RSS is
  flat at 337.2-337.8 MiB over steps 0-49, then grows by 131 KiB a step to 370.3 MiB at step
  299 (+32 MiB). The glibc live heap (mallinfo2 uordblks + hblkhd) grows only 12 KiB a step
  (113.10 → 116.04 MiB): the small objects (floats, strings, tuples, the dict) live in
  CPython's own arenas, mapped directly and not counted by malloc; only the lists' pointer
  arrays go through malloc. With the recorder: RSS 390.5 MiB at step 50 → 428.0 MiB at step
  299 (+154 KiB a step); heap 124.9 → 132.0 MiB (of which a one-off 4 MiB at step 51 is the
  recorder's own).
- Training is otherwise healthy: the loss falls from 1.73 to ≈0.69; no divergence, no NaN/Inf.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 50, "tolerance": 10},
    ],
    "forbidden": ["loss_divergence", "nonfinite"],
}

STEPS, BATCH, NUM, CATS, CARD, EMB, CLASSES = 300, 256, 8, 4, 50, 8, 5
REPORT_FROM = 50
CAT_NAMES = ("region", "device", "channel", "plan")


class Table:
    """Synthetic customer table: 8 numeric columns, 4 categorical columns (50 levels each);
    the 5-way label depends on products of numeric columns and on category effects."""

    def __init__(self, g: torch.Generator) -> None:
        self.cat_effect = torch.randn(CATS, CARD, CLASSES, generator=g)
        self.w_pair = torch.randn(NUM, NUM, CLASSES, generator=g) * 0.3
        self.next_id = 0

    def batch(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, range]:
        num = torch.randn(BATCH, NUM, generator=g)
        cat = torch.randint(0, CARD, (BATCH, CATS), generator=g)
        score = torch.einsum("bi,bj,ijc->bc", num, num, self.w_pair)
        score += sum(self.cat_effect[k][cat[:, k]] for k in range(CATS))
        y = (score + 0.5 * torch.randn(BATCH, CLASSES, generator=g)).argmax(1)
        ids = range(self.next_id, self.next_id + BATCH)
        self.next_id += BATCH
        return num, cat, y, ids


class CrossLayer(nn.Module):
    """DCN-v2 cross layer: x_{l+1} = x0 * (W x_l + b) + x_l."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.lin(x) + x


class DCNv2(nn.Module):
    """Deep & Cross Network v2 (Wang et al. 2021), parallel structure: 3 cross layers and a
    2-layer MLP on the [numeric, embedded categorical] input, concatenated → linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(CARD, EMB) for _ in range(CATS))
        d = NUM + CATS * EMB
        self.cross = nn.ModuleList(CrossLayer(d) for _ in range(3))
        self.deep = nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU())
        self.head = nn.Linear(d + 64, CLASSES)

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([num] + [e(cat[:, k]) for k, e in enumerate(self.embs)], 1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.head(torch.cat([x, self.deep(x0)], 1))


def batch_report(step: int, ids: range, cat: torch.Tensor, y: torch.Tensor,
                 logits: torch.Tensor, per_sample: torch.Tensor) -> dict:
    """A per-batch audit record made of plain Python objects (no tensors)."""
    probs = logits.detach().softmax(1)
    return {
        "step": step,
        "row_ids": [f"cust-{i:08d}" for i in ids],
        "segments": ["/".join(f"{n}={v}" for n, v in zip(CAT_NAMES, row, strict=True))
                     for row in cat.tolist()],
        "labels": y.tolist(),
        "loss": per_sample.detach().tolist(),
        "confidence": probs.max(1).values.tolist(),
        "probs": [tuple(p) for p in probs.tolist()],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    table = Table(g)

    model = DCNv2()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    reports = []  # the leak, from REPORT_FROM on: one dict of Python objects per step
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            num, cat, y, ids = table.batch(g)
            logits = model(num, cat)
            per_sample = nn.functional.cross_entropy(logits, y, reduction="none")
            loss = per_sample.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= REPORT_FROM:
                reports.append(batch_report(step, ids, cat, y, logits, per_sample))
            rec.step(loss=loss)
            losses.append(loss.item())
    print(f"loss first {losses[0]:.3f} last-10 mean {sum(losses[-10:]) / 10:.4f}; "
          f"{len(reports)} batch reports kept")


if __name__ == "__main__":
    main()
