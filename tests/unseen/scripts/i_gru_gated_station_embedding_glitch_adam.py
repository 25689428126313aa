"""GRU forecaster with a per-station embedding behind a gate initialised at 0 (the embedding
learns late); one sequence of one batch is a sensor logging millivolts (x1000).

What it does: 340 steps of 48 windows of 24 hourly readings from 40 stations (per-station
daily cycle, offset and amplitude, plus AR(1) noise); the target is the next reading of the
station's reference sensor, which differs by a per-station calibration offset the window
cannot show: only the station embedding can learn it. Model: GRU(1 -> 32) over the window,
final state + gate * station_embedding (gate a scalar at 0), then a tanh MLP head. Adam,
linear warmup over 40 steps to 3e-3, then linear decay (to 20 % at the end); MSE, no
clipping.

At step BAD_STEP = 260 one sequence of the batch (row 11: its window and its target) is
multiplied by 1000: a sensor that reported millivolts instead of volts.

What is TRUE of the run (measured):
- Steps 0-259: ordinary learning. The loss falls from 1.90 to ~0.03-0.04 by step ~130 and
  stays there (median 0.033, max 0.042 over steps 230-259); the total gradient norm falls
  from ~1.9 to a median of ~0.25 (max 0.51 over 230-259). The gate opens to ~-0.22 over the
  first ~140 steps and the station embedding's gradient grows with it: exactly 0 at step 0,
  1.1e-5 at step 1, 1e-3 at step 20, 0.013 at step 40, 0.037 at step 80, ~0.024-0.035 over
  steps 120-259 (x3000 from step 1).
- Step 260: loss spike, caused by the glitched sequence: loss 0.040 at step 259 -> 3935 at
  step 260 -> 0.042 at step 261; gradient norm 0.38 -> 538 -> 0.34. The trouble starts
  exactly at this step.
- After it, training continues normally: Adam's inflated second moment slows it a little,
  the loss is slightly higher than before (median 0.045, max 0.057 over 261-280; median
  0.040, max 0.062 over 281-339) and the gradient norm is back in its usual range (median
  0.34 / max 0.58 over 261-280, median 0.29 over 281-339). No lasting gradient growth, no
  NaN/Inf, nothing wrong with memory, data loading or step times.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 260, "tolerance": 1, "top": True},
    ],
    "forbidden": ["gradient_explosion", "nonfinite", "memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, WINDOW, STATIONS, HIDDEN = 340, 48, 24, 40, 32
WARMUP, PEAK_LR = 40, 3e-3
BAD_STEP, BAD_ROW, GLITCH = 260, 11, 1000.0


class Forecaster(nn.Module):
    """GRU over the last WINDOW readings + a per-station embedding behind a gate at 0.

    The gate starts closed (0), so the station embedding gets no gradient at first and only
    starts learning once the gate has opened: its gradient grows by orders of magnitude."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(1, HIDDEN, batch_first=True)
        self.station = nn.Embedding(STATIONS, HIDDEN)
        self.gate = nn.Parameter(torch.zeros(1))
        self.head = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))

    def forward(self, x, s):
        _, h = self.gru(x.unsqueeze(-1))
        h = h[-1] + self.gate * self.station(s)
        return self.head(h).squeeze(-1)


def make_series(n, g):
    """Per-station daily cycle (station-specific amplitude, phase and offset) + AR(1) noise.

    The target is the next reading of the station's reference sensor, which differs from the
    logged one by a per-station calibration offset that the window cannot show: only the
    station embedding can learn it."""
    amp = 0.5 + torch.rand(STATIONS, generator=g)
    phase = torch.rand(STATIONS, generator=g) * 2 * torch.pi
    offset = torch.randn(STATIONS, generator=g) * 0.8
    s = torch.randint(0, STATIONS, (n,), generator=g)
    t0 = torch.randint(0, 24, (n,), generator=g)
    t = t0[:, None] + torch.arange(WINDOW + 1)[None]
    clean = offset[s, None] + amp[s, None] * torch.sin(2 * torch.pi * t / 24 + phase[s, None])
    noise = torch.zeros(n, WINDOW + 1)
    eps = torch.randn(n, WINDOW + 1, generator=g) * 0.15
    for k in range(WINDOW + 1):
        noise[:, k] = (0.7 * noise[:, k - 1] if k else 0) + eps[:, k]
    calib = torch.randn(STATIONS, generator=g) * 0.6
    series = clean + noise
    return series[:, :-1], series[:, -1] + calib[s], s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    windows, targets, stations = make_series(STEPS * BATCH, g)
    # One sequence in the batch at BAD_STEP was logged by a sensor reporting millivolts.
    windows[BAD_STEP * BATCH + BAD_ROW] *= GLITCH
    targets[BAD_STEP * BATCH + BAD_ROW] *= GLITCH
    model = Forecaster()
    opt = torch.optim.Adam(model.parameters(), lr=PEAK_LR)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / WARMUP) * (1 - 0.8 * s / STEPS))
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            sl = slice(step * BATCH, (step + 1) * BATCH)
            pred = model(windows[sl], stations[sl])
            loss = F.mse_loss(pred, targets[sl])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            rec.step(loss=loss)
            if step % 20 == 0 or BAD_STEP - 1 <= step <= BAD_STEP + 2:
                print(f"step {step} loss {loss.item():.4g} gate {model.gate.item():.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
