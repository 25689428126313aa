"""Augmented Neural ODE classifier on 2-D concentric rings (class 0: radius < 0.5, class 1:
radius 0.8..1.2; a plain 2-D ODE flow cannot separate them without extra dimensions). Inputs
are lifted to 6 dimensions (2 coordinates + 4 zeros), integrated by a hand-written fixed-step
RK4 solver (8 steps over t in [0, 1]) through dynamics f(h, t) = Linear(7->64) -> tanh ->
Linear(64->64) -> tanh -> Linear(64->6), and read out by Linear(6->2). SGD (momentum 0.9,
lr 0.03), a batch of 128 fresh ring points a step, 400 steps.

The bug: the schedule was meant to be a MultiStepLR decay by gamma = 0.02 at step 250
(lr 0.03 -> 0.0006 for the fine-tuning phase). It is written as a LambdaLR whose factor after
the milestone is `1 / GAMMA` instead of `GAMMA`, so from step 250 the learning rate is
0.03 * 50 = 1.5 — a x50 jump where a x1/50 drop was intended.

What is TRUE of the run (measured by this script with plain torch, printed below):
- Steps 0-249 (lr 0.03): loss 0.70 at step 0, ~0.69 until step ~100, then learns: 0.53 at
  step 150, 0.010 at 200, 0.0002-0.0004 at steps 247-249; validation accuracy 1.000 from ~200.
  Gradient norm 0.10 at step 0, at most 1.84 over steps 200-249, 0.008 at step 249.
- Step 250 is the first step run with lr 1.5 (its own gradient is still normal, 0.0071, loss
  0.0002). From step 251 the gradient explodes: grad norm 7.8 at 251 (1000x step 249), 20 at
  252, 844 at 253, 9.8e5 at 254, 2.2e9 at 256; loss 0.19, 9.2, 44, 305, 3.0e6 over steps
  251-255 and 4e10 at 256; accuracy back to chance (0.35-0.67) from step 251.
- The explosion goes on to the end, finite: loss max 3e13 over steps 250-274, 1e24 over
  375-399; gradient norm 5e9-1.7e12 maxima per 25 steps. No NaN/Inf in 400 steps.
- Root cause: the learning-rate schedule (x50 at step 250) -> gradient explosion dated 250/251.
- About 8 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 250, "tolerance": 1}]}

STEPS, BATCH, AUG, HID, SOLVER_STEPS = 400, 128, 4, 64, 8
BASE_LR, MILESTONE, GAMMA = 0.03, 250, 0.02


def spirals(n, g):
    """Class 0: uniform angle, radius U(0, 0.5); class 1: radius U(0.8, 1.2)."""
    y = torch.randint(0, 2, (n,), generator=g)
    ang = 2 * math.pi * torch.rand(n, generator=g)
    inner = 0.5 * torch.rand(n, generator=g)
    outer = 0.8 + 0.4 * torch.rand(n, generator=g)
    r = torch.where(y == 0, inner, outer)
    x = torch.stack([r * torch.cos(ang), r * torch.sin(ang)], 1)
    return x, y


class Dynamics(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(dim + 1, HID)
        self.fc2 = nn.Linear(HID, HID)
        self.fc3 = nn.Linear(HID, dim)

    def forward(self, t, h):
        tt = torch.full_like(h[:, :1], t)
        z = torch.tanh(self.fc1(torch.cat([h, tt], 1)))
        return self.fc3(torch.tanh(self.fc2(z)))


class ODEClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.func = Dynamics(2 + AUG)
        self.readout = nn.Linear(2 + AUG, 2)

    def forward(self, x):
        h = torch.cat([x, x.new_zeros(x.shape[0], AUG)], 1)
        dt = 1.0 / SOLVER_STEPS
        for i in range(SOLVER_STEPS):                 # classic RK4
            t = i * dt
            k1 = self.func(t, h)
            k2 = self.func(t + dt / 2, h + dt / 2 * k1)
            k3 = self.func(t + dt / 2, h + dt / 2 * k2)
            k4 = self.func(t + dt, h + dt * k3)
            h = h + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return self.readout(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    model = ODEClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    # intended: factor GAMMA after the milestone; written: 1 / GAMMA
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < MILESTONE else 1 / GAMMA)
    xv, yv = spirals(1024, torch.Generator().manual_seed(99))
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = spirals(BATCH, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item()
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss, lr=lr)
            rows.append((step, loss.item(), gn, lr))
            if step % 50 == 0 or MILESTONE - 3 <= step <= MILESTONE + 12:
                with torch.no_grad():
                    acc = (model(xv).argmax(1) == yv).float().mean().item()
                print(f"step {step} lr {lr:.3g} loss {loss.item():.4g} grad_norm {gn:.4g} "
                      f"val_acc {acc:.3f}", flush=True)
    pre = [r for r in rows if MILESTONE - 50 <= r[0] < MILESTONE]
    print(f"[pre] steps {MILESTONE - 50}-{MILESTONE - 1}: loss {min(r[1] for r in pre):.3g}.."
          f"{max(r[1] for r in pre):.3g}, grad norm {min(r[2] for r in pre):.3g}.."
          f"{max(r[2] for r in pre):.3g}")
    for a in range(MILESTONE, STEPS, 25):
        part = [r for r in rows if a <= r[0] < a + 25]
        print(f"[post] steps {a}-{a + 24}: loss max {max(r[1] for r in part):.4g} "
              f"grad norm max {max(r[2] for r in part):.4g} nonfinite "
              f"{sum(not math.isfinite(r[1]) for r in part)}")


if __name__ == "__main__":
    main()
