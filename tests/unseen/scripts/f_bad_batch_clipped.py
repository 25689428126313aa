"""1-D CNN frequency regressor, SGD+momentum with clip_grad_norm_(1.0); one target x1000.

What it does: 300 steps of 32 noisy sinusoids (length 128, frequency uniform in 0.05-0.30
rad/sample, random phase, Gaussian noise 0.5); the target is the frequency x10. Three conv
layers (16, 32, 32 channels, ReLU, max-pool), global average pool, linear; MSE,
SGD(lr=0.01, momentum=0.9), torch.nn.utils.clip_grad_norm_(max_norm=1.0) every step.

At step BAD_STEP = 170 one target of the batch is x1000 (written in the wrong unit).

What is TRUE of the run (measured):
- Steps 0-169: the loss falls from 3.4 to ~0.01-0.03 (120-169); the gradient norm before
  clipping is ~0.05-1.6 at that stage (clipping is only sometimes active).
- Step 170: the loss spikes to ~5.6e4 and the gradient norm before clipping to ~380; the
  update is clipped to norm 1. The corrupt batch is the root cause.
- Clipping limits the damage: the loss is 0.025 at step 171 and 0.005-0.026 from there to the
  end, i.e. at its level (grad norm <= 1.4); the spike is at step 170 only. No divergence,
  no NaN/Inf, nothing wrong with memory, data loading or step times.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 170, "tolerance": 1, "top": True},
    ],
    "forbidden": ["loss_divergence", "nonfinite", "memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, LENGTH = 300, 32, 128
BAD_STEP, BAD_ROW, SCALE = 170, 7, 1000.0


def make_data():
    g = torch.Generator().manual_seed(1)
    t = torch.arange(LENGTH).float()
    n = STEPS * BATCH
    freq = 0.05 + 0.25 * torch.rand(n, generator=g)
    phase = torch.rand(n, 1, generator=g) * 6.28
    x = torch.sin(freq[:, None] * t + phase) + 0.5 * torch.randn(n, LENGTH, generator=g)
    y = freq * 10
    y[BAD_STEP * BATCH + BAD_ROW] *= SCALE  # the corrupt label
    return TensorDataset(x[:, None], y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    data = make_data()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Conv1d(1, 16, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        nn.Flatten(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(data, batch_size=BATCH, shuffle=False)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step, (x, y) in enumerate(rec.wrap_loader(loader)):
            loss = F.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step == BAD_STEP:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
