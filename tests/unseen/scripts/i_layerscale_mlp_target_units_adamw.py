"""Residual MLP with LayerScale gates initialised at 0 (tabular regression); one record of one
batch has its target in grams instead of kilograms (x1000).

What it does: 300 steps of 64 fresh samples of 16 Gaussian features; the target is a smooth
nonlinear function of them (sines, a tanh and a product term) plus N(0, 0.1) noise, in the
order of a few units. The model is a linear stem to width 96, 4 pre-norm residual MLP blocks
x + gamma * fc2(silu(fc1(LayerNorm(x)))) with a per-channel LayerScale gamma initialised at
exactly 0 (each block starts as the identity), then LayerNorm + linear head. AdamW (wd 0.05
on matrices only, none on gammas/biases/norms), linear warmup over 40 steps to 2e-3, cosine
decay to 10 %. MSE loss, no clipping.

At step BAD_STEP = 210 one record of the batch (row 5) has its target multiplied by 1000:
it came from a source that writes grams, not kilograms. The recorded loss is the MSE that was
back-propagated.

What is TRUE of the run (measured):
- Steps 0-209: ordinary learning. The loss falls from 4.31 to a noisy ~1.1-1.3 (median 1.12
  over steps 180-209, single steps up to ~2.8 early and ~1.7 late: the product term is hard
  to fit); the total gradient norm falls from ~9-10 to a median of ~3.4 (max 5.1 over
  180-209). Meanwhile the blocks' weights, which get exactly zero gradient at step 0
  (gamma = 0), see their gradients grow as the gammas open: e.g. blocks.1.fc1.weight 1.4e-4
  at step 1, 1.9e-3 at step 5, 0.21 at step 100, 0.31 at step 200 (x2000); every fcN.weight
  grows x400-x2000 from step 1 to step 200.
- Step 210: loss spike, caused by the mis-scaled record: loss 1.00 at step 209 -> 111072 at
  step 210 -> 1.30 at step 211; gradient norm 2.9 -> 932 -> 4.6. The trouble starts exactly
  at this step.
- After it, AdamW has absorbed the spike into its moments: a mild, temporary disturbance
  (loss median 1.35, max 1.85 over steps 211-230; gradient norm median 5.2, max 9.3), then
  back to the pre-spike regime (loss median 1.26, gradient norm median 3.7 over 231-299).
  The gradients do not stay up (no lasting explosion), no NaN/Inf, nothing wrong with
  memory, data loading or step times.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 210, "tolerance": 1, "top": True},
    ],
    "forbidden": ["gradient_explosion", "nonfinite", "memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, D_IN, WIDTH, DEPTH = 300, 64, 16, 96, 4
BAD_STEP, BAD_ROW, BAD_FACTOR = 210, 5, 1000.0
PEAK_LR, WARMUP = 2e-3, 40


def lr_factor(step):
    """Linear warmup from ~0, then cosine decay to 10 % of the peak."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    t = (step - WARMUP) / (STEPS - WARMUP)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))


class LayerScaleBlock(nn.Module):
    """Pre-norm residual MLP block whose branch is scaled per channel by gamma, init 0."""

    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.gamma = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return x + self.gamma * self.fc2(F.silu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(D_IN, WIDTH)
        self.blocks = nn.Sequential(*[LayerScaleBlock(WIDTH) for _ in range(DEPTH)])
        self.head = nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 1))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x))).squeeze(-1)


def target(x, w1, w2):
    """A smooth nonlinear function of the features (in kilograms), plus noise."""
    return torch.sin(x @ w1).sum(-1) * 0.5 + (x @ w2).tanh() * 1.5 + x[:, 0] * x[:, 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    w1 = torch.randn(D_IN, 8, generator=g) * 0.6
    w2 = torch.randn(D_IN, generator=g) * 0.4
    xs = torch.randn(STEPS * BATCH, D_IN, generator=g)
    ys = target(xs, w1, w2) + 0.1 * torch.randn(STEPS * BATCH, generator=g)
    # One record of the batch at BAD_STEP came from a source that writes grams, not kilograms.
    ys[BAD_STEP * BATCH + BAD_ROW] *= BAD_FACTOR
    model = Net()
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters()
                if not (n.endswith("weight") and p.dim() == 2)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=PEAK_LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = xs[step * BATCH:(step + 1) * BATCH]
            y = ys[step * BATCH:(step + 1) * BATCH]
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step == BAD_STEP:
                print(f"step {step} loss {loss.item():.4g} gamma "
                      f"{[round(b.gamma.abs().mean().item(), 3) for b in model.blocks]}",
                      flush=True)


if __name__ == "__main__":
    main()
