"""Pathological: a learning-rate spike. A residual MLP (pre-LayerNorm blocks) classifies a
tabular problem with SGD + momentum; an "LR range probe" left enabled in the training loop
multiplies the LR by 50 for exactly three steps (260, 261, 262), then the LR goes back. The
loss is thrown up over steps 261-263 (peak 55x the median) and takes some 20 steps to come
back.

What it does: 24 features: 16 informative ones (6 Gaussian class clusters, centres
N(0, 2^2 I), unit noise, mixed by a fixed random matrix) and 8 pure-noise ones; 6 classes,
3% label noise. Fresh samples every step, batch 64. Model: Linear(24-96), three residual
blocks x + W2 GELU(W1 LayerNorm(x)) (96-192-96), LayerNorm, Linear(96-6); cross-entropy;
SGD(lr 0.02, momentum 0.9, nesterov), cosine decay to 0.01 over 450 steps, no clipping. At
steps 260-262 the LR of every param group is set to 50x its scheduled value (0.0138 ->
~0.69); from step 263 it is the scheduled value again. The loss recorded at step S is
computed before that step's update, so the first loss that shows the damage is step 261.
Held-out accuracy on 3,000 samples printed every 50 steps and right after the event.

What is TRUE of the run (measured; printed at the end):
- Before the event: 30-step window medians 0.284, 0.285, 0.200, 0.144, 0.120, 0.183, 0.141,
  0.195 (steps 0-239); held-out accuracy 0.970 at step 49, 0.972 at 259. Median loss over
  steps 230-259: 0.133 (single steps up to ~0.6 from the 3% label noise).
- LR: 0.0200 at step 0, 0.0159 at 200, 0.0138 at 259; 0.6895 / 0.6878 / 0.6861 at steps
  260 / 261 / 262; 0.0137 at 263, 0.0125 at 300, 0.0100 at 449.
- The spike: steps 259-270: 0.239, 0.036, 0.404, 1.618, 7.328, 6.456, 4.356, 4.794, 2.251,
  1.388, 1.043, 0.564. The loss at 261 is the first raised value (3x the median), 262 is
  12x and 263 the peak (55x); steps 263-266 are the four largest losses of the run (the
  largest before is 2.02 at step 0). Held-out accuracy 0.262 at step 263, 0.784 at 270,
  0.887 at 280, 0.958 at 290, 0.963 at 299, 0.971 at 449.
- Recovery: below 1.1 from step 269, ~0.3-1.07 until step ~276, then ordinary (window
  medians 0.239 for 240-269 with the event, 0.360 for 270-299, then 0.182, 0.226, 0.213,
  0.210, 0.230); 5 steps in a row under 1.5x the old median from step 311. No NaN/Inf.
- Gradient norm: median 0.42; 0.23 at 260, 1.71 at 261, 3.62 at 262, 7.24 at 263 (max),
  6.76 at 264, 5.66 at 265.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

PROBE_STEPS, PROBE_MULT = (260, 261, 262), 50.0  # the probe left on

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 262, "tolerance": 1},
    ],
    "forbidden": ["nonfinite"],
}

STEPS, BATCH, FEAT, INFO, CLASSES, WIDTH = 450, 64, 24, 16, 6, 96


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def report(losses, gnorms, lrs, k=15):
    n = len(losses) // k
    med = [round(sorted(losses[i * n:(i + 1) * n])[n // 2], 3) for i in range(k)]
    print("WINDOW_MEDIANS (30 steps)", med)
    top = sorted(range(len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES (step, loss, next 3)",
          [(i, round(losses[i], 3), [round(v, 3) for v in losses[i + 1:i + 4]]) for i in top])
    g = sorted(gnorms)
    print("GNORM median", round(g[len(g) // 2], 3), "max", round(g[-1], 3),
          "at", gnorms.index(g[-1]), "nonfinite", sum(not math.isfinite(v) for v in losses))
    print("LR", [(i, f"{lrs[i]:.4f}") for i in (0, 100, 200, 258, 259, 260, 261, 262, 263, 300,
                                                  449)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(12)
    mix = torch.randn(INFO, INFO, generator=gen) / math.sqrt(INFO)
    centres = 2.0 * torch.randn(CLASSES, INFO, generator=gen)

    def sample(n):
        y = torch.randint(0, CLASSES, (n,), generator=gen)
        z = centres[y] + torch.randn(n, INFO, generator=gen)
        flip = torch.rand(n, generator=gen) < 0.03
        y = torch.where(flip, torch.randint(0, CLASSES, (n,), generator=gen), y)
        x = torch.cat([z @ mix, torch.randn(n, FEAT - INFO, generator=gen)], 1)
        return x, y

    xv, yv = sample(3000)
    model = nn.Sequential(nn.Linear(FEAT, WIDTH), Block(), Block(), Block(),
                          nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=0.01)
    losses, gnorms, lrs = [], [], []

    def val_acc():
        with torch.no_grad():
            return round((model(xv).argmax(1) == yv).float().mean().item(), 3)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            scheduled = sched.get_last_lr()
            for g, lr in zip(opt.param_groups, scheduled, strict=False):
                g["lr"] = lr * PROBE_MULT if step in PROBE_STEPS else lr
            x, y = sample(BATCH)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn.item())
            lrs.append(opt.param_groups[0]["lr"])
            for g, lr in zip(opt.param_groups, scheduled, strict=False):
                g["lr"] = lr                       # the scheduler continues from its own value
            sched.step()
            if (step + 1) % 50 == 0 or step in (259, 263, 270, 280, 290):
                print(step, "val_acc", val_acc())
    report(losses, gnorms, lrs)
    base = sorted(losses[230:260])[15]
    print(f"median loss 230-259: {base:.3f}; steps 258..290:",
          [round(v, 3) for v in losses[258:291]])
    back = next((j for j in range(261, STEPS) if max(losses[j:j + 5]) < 1.5 * base), None)
    print("back to the pre-spike level (5 steps in a row < 1.5x median) from step", back)
    print("gnorm 258..266", [round(v, 2) for v in gnorms[258:267]])


if __name__ == "__main__":
    main()
