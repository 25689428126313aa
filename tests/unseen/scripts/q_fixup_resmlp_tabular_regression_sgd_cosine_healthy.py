"""Healthy: a normalisation-free residual MLP with Fixup initialisation (the last layer of
every residual branch AND the output layer initialised to zero, scalar biases and a scalar
multiplier per branch, first branch layer scaled by L^-1/2) on a synthetic tabular regression,
SGD with momentum and cosine decay. Every parameter except the output layer has an exactly-zero
gradient at step 0; the branch gradients grow from 0 as the output layer and the zero-init
branch layers move away from zero. Nothing is wrong.

What it does: 16 Gaussian features; target = sin(1.5 x0) + 0.8 x1 x2 + 0.5 relu(x3 - 0.5)
+ 0.6 tanh(2 x4) x5 + 0.4 x6 - 0.3 x7^2 + 0.2 noise, standardised with the training mean/std.
8,000 training rows (batches of 64 drawn with replacement), 1,000 validation rows. Model: stem
Linear(16, 96) -> 6 Fixup blocks (x + scale * fc2(relu(fc1(x + b1) + b2)) + b3, fc2 = 0) ->
ReLU -> ``out`` = Linear(96, 1), zero-initialised. SGD(lr 0.05, momentum 0.9, wd 1e-4),
CosineAnnealingLR to 1e-3 over 400 steps, MSE, no clipping.

What is TRUE of the run (measured; printed at the end):
- Loss 1.289 at step 0; 40-step window means 0.745, 0.352, 0.251, 0.217, 0.157, 0.096, 0.066,
  0.060, 0.055, 0.051; window maxima 1.289, 0.57, 0.40, 0.38, 0.26, 0.24, 0.093, 0.085, 0.083,
  0.084. Validation MSE 1.025 at step 0, 0.357 at step 50, 0.242 at 100, 0.130 at 200, 0.064 at
  300 and at the end (the noise floor after standardisation is 0.022).
- Gradients: at step 0 only ``out`` has a gradient (1.319 = the total); the summed gradient norm
  of the six branch ``fc1`` weights is exactly 0 at steps 0 and 1, 0.0002 at step 2, 0.0125 at
  step 5, 0.054 at step 10, 0.21 at step 25, then 0.17-0.50 for the rest of the run (40-step
  window medians 0.22, 0.32, 0.26, 0.23, 0.23, 0.25, 0.23, 0.22, 0.19, 0.19). Total gradient
  norm: window medians 1.43, 1.12, 0.92, 0.76, 0.65, 0.64, 0.51, 0.47, 0.44, 0.40; overall
  median 0.647, max 3.48 at step 8, min 0.229 (step 394). No NaN/Inf.
- LR: 0.05 at step 0, 0.043 at step 100, 0.0255 at step 200, 0.0082 at step 300, 0.001 at 399.
- Healthy: the zero-to-nonzero growth of the branch gradients is Fixup working as designed.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

FEATURES, WIDTH, BLOCKS, BATCH, STEPS, LR = 16, 96, 6, 64, 400, 0.05


def make_data(g, n):
    """Synthetic tabular regression: smooth nonlinear effects, two interactions, a threshold
    effect and noise; target standardised (std ~1)."""
    x = torch.randn(n, FEATURES, generator=g)
    y = (torch.sin(1.5 * x[:, 0]) + 0.8 * x[:, 1] * x[:, 2] + 0.5 * torch.relu(x[:, 3] - 0.5)
         + 0.6 * torch.tanh(2 * x[:, 4]) * x[:, 5] + 0.4 * x[:, 6] - 0.3 * x[:, 7] ** 2
         + 0.2 * torch.randn(n, generator=g))
    return x, y


class FixupBlock(nn.Module):
    """x + scale * W2 relu(W1 (x + b1) + b2) + b3, with W2 = 0 at init (Fixup)."""

    def __init__(self, d):
        super().__init__()
        self.b1 = nn.Parameter(torch.zeros(1))
        self.fc1 = nn.Linear(d, d, bias=False)
        self.b2 = nn.Parameter(torch.zeros(1))
        self.fc2 = nn.Linear(d, d, bias=False)
        self.scale = nn.Parameter(torch.ones(1))
        self.b3 = nn.Parameter(torch.zeros(1))
        nn.init.kaiming_normal_(self.fc1.weight, nonlinearity="relu")
        with torch.no_grad():
            self.fc1.weight.mul_(BLOCKS ** -0.5)      # L^(-1/(2m-2)) with m = 2 layers
        nn.init.zeros_(self.fc2.weight)

    def forward(self, x):
        h = F.relu(self.fc1(x + self.b1) + self.b2)
        return x + self.scale * self.fc2(h) + self.b3


class FixupResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.Sequential(*[FixupBlock(WIDTH) for _ in range(BLOCKS)])
        self.out = nn.Linear(WIDTH, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x):
        return self.out(F.relu(self.blocks(self.stem(x)))).squeeze(1)


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
    train_x, train_y = make_data(g, 8000)
    val_x, val_y = make_data(g, 1000)
    mu, sd = train_y.mean(), train_y.std()
    train_y, val_y = (train_y - mu) / sd, (val_y - mu) / sd
    model = FixupResMLP()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=LR * 0.02)
    losses, total, branch, out = [], [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            idx = torch.randint(0, train_x.shape[0], (BATCH,), generator=g)
            loss = F.mse_loss(model(train_x[idx]), train_y[idx])
            opt.zero_grad()
            loss.backward()
            total.append(grad_norm(model.parameters()))
            branch.append(grad_norm([b.fc1.weight for b in model.blocks]))
            out.append(grad_norm(model.out.parameters()))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            rec.step(loss=loss)
            sched.step()
            losses.append(loss.item())
            if step % 25 == 0 or step == STEPS - 1 or step in (1, 2, 5, 10):
                with torch.no_grad():
                    vloss = F.mse_loss(model(val_x), val_y).item()
                print(f"step {step} loss {loss.item():.4f} val {vloss:.4f} gn {total[-1]:.4f} "
                      f"branch_fc1 {branch[-1]:.4f} out {out[-1]:.4f} lr {lr:.4f}", flush=True)
    w = STEPS // 10
    print("WINDOW_MEANS", [round(sum(losses[i:i + w]) / w, 3) for i in range(0, STEPS, w)])
    print("LOSS_WINDOW_MAX", [round(max(losses[i:i + w]), 3) for i in range(0, STEPS, w)])
    print("GN_WINDOW_MEDIANS", [round(torch.tensor(total[i:i + w]).median().item(), 4)
                                for i in range(0, STEPS, w)])
    print("BRANCH_FC1_WINDOW_MEDIANS", [round(torch.tensor(branch[i:i + w]).median().item(), 4)
                                        for i in range(0, STEPS, w)])
    print("GN_WINDOW_MAX", [round(max(total[i:i + w]), 3) for i in range(0, STEPS, w)])
    t = torch.tensor(total)
    base = t[:w].median().item()
    hits = [i for i, v in enumerate(total) if v > 10 * base]
    print("first step with total grad norm > 10x the first window's median:",
          hits[0] if hits else None)
    print("GN median", round(t.median().item(), 4), "max", round(t.max().item(), 4),
          "at", int(t.argmax()), "min", round(t.min().item(), 4), "at", int(t.argmin()))


if __name__ == "__main__":
    main()
