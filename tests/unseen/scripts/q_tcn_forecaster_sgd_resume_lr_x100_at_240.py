"""A dilated causal TCN forecaster trained with SGD+momentum; at step 240 a resume bug
multiplies the learning rate by 100 (0.003 -> 0.3), and the run explodes: the gradient norm
goes 1.1 -> 55 -> 5e14 over steps 240-242 and the loss is NaN at step 243, where the loop's
NaN guard stops the run.

What it does: univariate series = 3 sines (periods 8-48, random phases, amplitudes 0.3-1.3)
+ a small random-walk drift + noise (std 0.1); from a 96-step context predict the next 8
values. Fresh batch of 32 series every step. Model: 1x1 input conv to 32 channels, 5 residual
TCN blocks (two causal Conv1d(k=3) with dilations 1, 2, 4, 8, 16, ReLU, no normalisation),
linear head on the last time step. SGD(lr 0.003, momentum 0.9), MSE, no clipping. At the start
of step 240 every param group's lr is multiplied by 100 (a stale scale factor applied when
the scheduler state is "restored"), so the update of step 240 is the first with lr 0.3. The
loop breaks after recording the first step whose loss is non-finite.

What is TRUE of the run (measured; printed at the end):
- Steps 0-239 are healthy: loss 1.665 at step 0, 30-step window means 0.984, 0.718, 0.629,
  0.623, 0.626, 0.553, 0.531, 0.493; gradient norm median 1.09 (window medians 0.92-1.61),
  max 2.68 at step 4.
- LR: 0.003 for steps 0-239, 0.3 from step 240.
- Step 240: loss 0.458, grad norm 1.10 (normal -- computed before the first large update).
  Step 241: loss 10.5, grad norm 55 (50x the pre-bug median): the explosion starts here.
  Step 242: loss 1.2e14, grad norm 5.0e14. Step 243: loss NaN, grad NaN; the run stops
  (244 steps recorded, 0-243).
- The gradient explosion (first step 241) and the loss divergence are both caused by the
  100x LR jump at step 240.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 241, "tolerance": 1},
        {"id": "loss_divergence"},
    ],
}

CONTEXT, HORIZON, BATCH, STEPS, LR, BUG_STEP, BUG_FACTOR = 96, 8, 32, 360, 0.003, 240, 100.0


def series(g, n):
    """Sum of 3 sines with random periods/phases/amplitudes + a random-walk drift + noise."""
    t = torch.arange(CONTEXT + HORIZON, dtype=torch.float32)
    periods = 8 + 40 * torch.rand(n, 3, 1, generator=g)
    phases = 2 * math.pi * torch.rand(n, 3, 1, generator=g)
    amps = 0.3 + torch.rand(n, 3, 1, generator=g)
    x = (amps * torch.sin(2 * math.pi * t / periods + phases)).sum(1)
    x = x + 0.02 * torch.randn(n, CONTEXT + HORIZON, generator=g).cumsum(1)
    x = x + 0.1 * torch.randn(n, CONTEXT + HORIZON, generator=g)
    return x[:, :CONTEXT].unsqueeze(1), x[:, CONTEXT:]


class CausalConv(nn.Conv1d):
    def __init__(self, cin, cout, k, dilation):
        super().__init__(cin, cout, k, dilation=dilation)
        self.pad = (k - 1) * dilation

    def forward(self, x):
        return super().forward(F.pad(x, (self.pad, 0)))


class TCNBlock(nn.Module):
    def __init__(self, c, dilation):
        super().__init__()
        self.conv1 = CausalConv(c, c, 3, dilation)
        self.conv2 = CausalConv(c, c, 3, dilation)

    def forward(self, x):
        return x + self.conv2(F.relu(self.conv1(x)))


class TCN(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.inp = nn.Conv1d(1, c, 1)
        self.blocks = nn.Sequential(*[TCNBlock(c, d) for d in (1, 2, 4, 8, 16)])
        self.out = nn.Linear(c, HORIZON)

    def forward(self, x):
        h = self.blocks(self.inp(x))
        return self.out(h[:, :, -1])


def grad_norm(params):
    gs = [p.grad.detach().norm() for p in params if p.grad is not None]
    return torch.stack(gs).norm().item() if gs else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = TCN()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses, total, lrs = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == BUG_STEP:
                # "resume" bug: the restored scheduler state is multiplied by a stale scale factor
                for group in opt.param_groups:
                    group["lr"] = group["lr"] * BUG_FACTOR
            x, y = series(g, BATCH)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            total.append(grad_norm(model.parameters()))
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            if step % 30 == 0 or step == STEPS - 1 or step >= BUG_STEP - 2:
                print(f"step {step} loss {loss.item():.4g} gn {total[-1]:.4g} lr {lrs[-1]:.3g}",
                      flush=True)
            if not math.isfinite(loss.item()):
                print(f"non-finite loss at step {step}: stopping")
                break
    w = 30
    print("WINDOW_MEANS", [round(sum(losses[i:i + w]) / w, 4) for i in range(0, BUG_STEP, w)])
    print("GN_WINDOW_MEDIANS", [round(torch.tensor(total[i:i + w]).median().item(), 4)
                                for i in range(0, BUG_STEP, w)])
    t = torch.tensor(total[:BUG_STEP])
    print("before bug: GN median", round(t.median().item(), 4), "max", round(t.max().item(), 4),
          "at", int(t.argmax()))
    nonfinite = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    print("first nonfinite loss step:", nonfinite[0] if nonfinite else None)


if __name__ == "__main__":
    main()
