"""LSTM next-value regressor on noisy sinusoids; one batch carries a corrupt sample.

A one-layer LSTM (hidden 32) reads sequences of 24 values (sums of two sinusoids with random
frequency and phase plus noise) and predicts the next value at every position (MSE). Adam,
lr 1e-2, gradient clipping at norm 1.0 (the usual LSTM recipe), 300 steps of 32 sequences.

At step BAD_STEP = 150 one sequence of the batch is corrupt: its values were scaled by 1e3 (a
unit mix-up in one record). Measured: the loss falls from 0.9 to about 0.03 by
step 60, then slowly to 0.02, and 3.9e4 at step 150 alone; the gradient norm before clipping is
about 0.04-0.7 elsewhere and 390 at step 150 (the update is clipped to norm 1). From step 151
on the loss is back at its level (0.019-0.028) and keeps falling slowly; the largest loss of
any other step is 0.99 (in the first steps).

What is true of the run: one loss spike at step 150 caused by one bad batch (the root cause a
user must see), full recovery, no divergence, no NaN.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 150, "tolerance": 1, "top": True},
    ],
    "forbidden": ["loss_divergence", "nonfinite"],
}

STEPS = 300
BATCH = 32
SEQ = 24
BAD_STEP = 150


class Sinusoids(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        t = torch.arange(SEQ + 1, dtype=torch.float32)
        f = torch.rand(n, 2, 1, generator=g) * 0.5 + 0.1
        ph = torch.rand(n, 2, 1, generator=g) * 6.28
        self.x = (torch.sin(f * t + ph).sum(1) + 0.05 * torch.randn(n, SEQ + 1, generator=g))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        s = self.x[i]
        return s[:-1, None], s[1:, None]


class LSTMRegressor(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.rnn = nn.LSTM(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Sinusoids(STEPS * BATCH, seed=1), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(2))
    model = LSTMRegressor()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.MSELoss()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step, (x, y) in enumerate(rec.wrap_loader(loader)):
            if step == BAD_STEP:  # one corrupt record: values in the wrong unit
                x, y = x.clone(), y.clone()
                x[0] *= 1e3
                y[0] *= 1e3
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step == BAD_STEP:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
