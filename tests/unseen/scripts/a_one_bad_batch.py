"""An MLP classifier that meets one corrupt record in its training data (at step 97).

What it does: a 5-class problem in 32 dimensions (Gaussian class clusters, 10% label noise),
6400 pre-shuffled rows read in order by a DataLoader (batch 32, so exactly 200 steps, one
epoch), MLP 32-128-128-5 with ReLU, cross-entropy, Adam(lr=1e-3). One row of the file,
BAD_ROW = 97·32 + 10, is corrupt: its features were written ×1000 (a unit bug in the
export: millimetres instead of metres). That row is only ever seen in the batch of step 97.

What is TRUE of the run (ground truth):
- Steps 0-96 are normal: the loss falls from ~1.6 to ~0.9, the gradient norm is ~1.
- Step 97: a loss spike caused by that one batch: the loss jumps to ~200 (the corrupt row's
  own cross-entropy is ~6400) and the gradient norm to ~540 (×~500 its usual
  level of ~1). This single-batch data problem is the root cause to report.
- Adam bounds the size of that step's update (|m/√v| ≈ 3 per weight), so the model is not
  destroyed: from step 98 the loss is back at its pre-spike level (~0.9) and training goes
  on, only slowly improving (Adam's second moments stay inflated by the spike, and the task's
  label noise bounds the loss anyway). It recovers; there
  is no divergence, no NaN/Inf, nothing wrong with memory, data loading or step times.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 97, "tolerance": 1, "top": True},
    ],
    "forbidden": ["loss_divergence", "nonfinite", "dataloader_bottleneck", "memory_leak",
                  "dead_activation", "vanishing_gradient"],
}

BATCH, STEPS, DIM, CLASSES = 32, 200, 32, 5
BAD_STEP, BAD_COL, SCALE = 97, 10, 1000.0
BAD_ROW = BAD_STEP * BATCH + BAD_COL


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = BATCH * STEPS
    centers = torch.randn(CLASSES, DIM, generator=g) * 0.35
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = centers[y] + torch.randn(n, DIM, generator=g)
    noisy = torch.rand(n, generator=g) < 0.1
    y[noisy] = torch.randint(0, CLASSES, (int(noisy.sum()),), generator=g)
    x[BAD_ROW] *= SCALE                      # the corrupt record
    return TensorDataset(x, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=False)
    model = nn.Sequential(nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for x, y in rec.wrap_loader(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    for a in range(0, STEPS, 10):
        print(f"steps {a:3d}-{a + 9:3d}: mean loss {sum(losses[a:a + 10]) / 10:8.3f}")
    print(f"step {BAD_STEP}: loss {losses[BAD_STEP]:.1f}  (step {BAD_STEP - 1}: "
          f"{losses[BAD_STEP - 1]:.3f}, step {BAD_STEP + 1}: {losses[BAD_STEP + 1]:.3f})")


if __name__ == "__main__":
    main()
