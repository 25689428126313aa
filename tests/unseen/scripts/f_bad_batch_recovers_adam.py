"""MLP regressor on tabular data; one row's target is 500x out of scale; Adam shrugs it off.

What it does: 300 steps of 64 rows from 19200 pre-generated rows (16 Gaussian features;
target = 2·tanh(x·w/4) + 0.3·x0·x1 + noise 0.1), read in order by a DataLoader. MLP
16-64-64-1 with ReLU, MSE, Adam(lr=1e-3), no gradient clipping.

At step BAD_STEP = 170 one row of the batch has its target written x500 (a unit bug in one
record), so that batch's loss is dominated by the one row.

What is TRUE of the run (measured):
- Steps 0-169: the loss falls from ~1.8 to ~0.1 (0.09 at step 169); grad norm ~0.3-2.0.
- Step 170: loss spike: the loss is ~2160 and the gradient norm ~58 (about 100x its level).
  This single corrupt batch is the root cause.
- Adam bounds the size of that one update, so the model shrugs it off: from step 171 the loss
  is back near its level (0.12 at 171, 0.12-0.33 over 171-180, a mild bump with grad norm
  up to ~2.2), 0.09-0.21 over 181-200 and 0.05-0.2 (mean 0.08-0.1) to the end. No divergence, no
  NaN/Inf, nothing wrong with memory, data loading or step times.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 170, "tolerance": 1, "top": True},
    ],
    "forbidden": ["loss_divergence", "nonfinite", "memory_leak", "dataloader_bottleneck",
                  "gradient_explosion"],
}

STEPS, BATCH, DIM = 300, 64, 16
BAD_STEP, BAD_ROW, SCALE = 170, 5, 500.0


def make_data():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(DIM, generator=g)
    x = torch.randn(STEPS * BATCH, DIM, generator=g)
    y = (2 * torch.tanh(x @ w / 4) + 0.3 * x[:, 0] * x[:, 1]
         + 0.1 * torch.randn(len(x), generator=g))
    y[BAD_STEP * BATCH + BAD_ROW] *= SCALE  # the corrupt record
    return TensorDataset(x, y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=False)
    model = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step, (x, y) in enumerate(rec.wrap_loader(loader)):
            loss = nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step == BAD_STEP:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
