"""S4/LRU-style diagonal linear recurrence whose decay parameter is pushed past 1 at step 200.

What it does: sequences of 64 steps of 4 Gaussian "sensor" channels; the target is 0.5 x
(EMA of channel 0, decay 0.8) + 0.3 x (EMA of channel 1, decay 0.95) at the last step, fresh
batches of 32 every step, 320 steps. Model ``Forecaster``: ``lru`` = a diagonal linear
recurrence h_t = lam * h_{t-1} + B x_t over 32 state channels (parameters ``lru.lam``, the
per-channel decay, initialised linspace(0.6, 0.97) and left unconstrained, and
``lru.inp.weight`` = B), then an MLP head (``head.0``/``head.2``, 32-64-1, GELU) on the last
state; MSE. Adam lr 2e-3, no clipping. At the start of step 200 (before its forward) a
"re-sampling" routine meant to convert the decays to a new sample rate
(lam ** (10 / 11.5)) multiplies them by 1.15 instead: the slow channels go past 1.
Standard preset with ``grad_norm_budget=0`` (gradient norms every step), profiler off.

What is TRUE of the run (measured):
- Steps 0-199 are healthy: median loss 0.527 (steps 0-19) -> 0.0019 (180-199); total
  gradient norm 2.8 (window median, steps 0-19) falling to 0.19 (180-199); step 199: loss
  0.0012, grad norm 0.14. max |lam| 0.97-0.99, none above 1.
- Step 200: 6 channels of ``lru.lam`` are above 1 (max 1.075), so lam^63 multiplies the
  state by up to ~100 and the gradient through the recurrence grows with it: the total
  gradient norm jumps from 0.14 (step 199) to 2.4e6 (step 200), 1.9e6 (201), 1.6e6 (202),
  then 1e4-4e4 by steps 206-208; the loss from 0.0012 to 3.96e4. The per-parameter norms at
  step 200 are dominated by the recurrent parameter: ``lru.lam`` 2.37e6 (0.09 at step 199),
  ``head.2.weight`` 1.8e5, ``lru.inp.weight`` 1.2e5, ``head.0.weight`` 9.8e4.
- Adam never brings the decays back under 1 (4 channels stay at ~1.065 to the end), so
  the gradients stay exploded: window medians 9.4e3 (steps 200-219), 1e3 (220-239),
  420-650 (240-319), 2,000-3,000x the pre-bug level; the loss stays at 6.6-12 (window
  medians from step 220), 3,500x worse than before the bug.
- No NaN/Inf anywhere. ~6 s on 2 CPU cores.
- Ground truth: a gradient explosion starting sharply at step 200, caused by the
  recurrent decay ``lru.lam``; the loss jump is its consequence.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 200, "tolerance": 1, "subject": "lru.lam"},
    ],
    "forbidden": ["nonfinite", "memory_leak", "dataloader_bottleneck", "dead_activation",
                  "vanishing_gradient"],
}

CH_IN, STATE, SEQ, BATCH, STEPS, BUG_AT, FACTOR = 4, 32, 64, 32, 320, 200, 1.15


class DiagonalRecurrence(nn.Module):
    """h_t = lam * h_{t-1} + B x_t with an unconstrained per-channel decay ``lam`` (the
    stable parameterisation would be lam = exp(-softplus(nu)); this one trusts |lam| < 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.lam = nn.Parameter(torch.linspace(0.6, 0.97, STATE))
        self.inp = nn.Linear(CH_IN, STATE, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.inp(x)
        h = torch.zeros(x.shape[0], STATE)
        for t in range(x.shape[1]):
            h = self.lam * h + u[:, t]
        return h


class Forecaster(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lru = DiagonalRecurrence()
        self.head = nn.Sequential(nn.Linear(STATE, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lru(x)).squeeze(1)


def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Four noisy sensor channels; the target is a mix of two exponential moving averages
    (time constants 5 and 20 steps) of channels 0 and 1 at the last step."""
    x = torch.randn(BATCH, SEQ, CH_IN, generator=g)
    t = torch.arange(SEQ - 1, -1, -1, dtype=torch.float32)
    y = 0.5 * (x[:, :, 0] * 0.8 ** t).sum(1) + 0.3 * (x[:, :, 1] * 0.95 ** t).sum(1)
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)

    model = Forecaster()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses, norms, lam_max = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0, grad_norm_budget=0.0) as rec:
        for step in range(STEPS):
            if step == BUG_AT:
                # "re-sample the decays from 10 Hz to 11.5 Hz": should be lam ** (10 / 11.5),
                # the code multiplies instead, pushing the slow channels past 1.
                with torch.no_grad():
                    model.lru.lam.mul_(FACTOR)
            x, y = batch(g)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            norms.append(float(torch.stack([p.grad.norm() for p in model.parameters()])
                               .norm()))
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            lam = model.lru.lam.detach().abs()
            lam_max.append((float(lam.max()), int((lam > 1).sum())))
    for a in range(0, STEPS, 20):
        lw, nw = sorted(losses[a:a + 20]), sorted(norms[a:a + 20])
        print(f"steps {a:3d}-{a + 19:3d}: median loss {lw[10]:10.4g}  median grad norm "
              f"{nw[10]:10.4g}  max |lam| {lam_max[a + 19][0]:.3f}  "
              f"channels with |lam| > 1: {lam_max[a + 19][1]}")


if __name__ == "__main__":
    main()
