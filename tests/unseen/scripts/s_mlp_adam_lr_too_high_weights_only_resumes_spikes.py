"""Pathological: real, repeated loss spikes. An MLP regressor trained with Adam at a learning
rate that is too high for Adam's first, sign-like updates (no gradient clipping), on a
preemptible job that resumes every 120 steps from a WEIGHTS-ONLY checkpoint: the optimizer's
moment estimates are lost at each resume, so the first updates after a resume move every
weight by about the full LR at once. The loss jumps 300-600x on the step after each resume
(to above the loss of the untrained model) and needs 40-80 steps to come back.

What it does: x ~ N(0, I_8) (a fixed table of 8,192 rows), clean target
y = sin(2 x0) + x1 x2 - 0.5 x3^2 (no noise), batch 512 sampled with replacement, MLP
8-256-256-1 (GELU), MSE, Adam(lr 2e-2) with a 20-step linear warmup at launch only (the
schedule is a function of the global step, so resumes do not warm up again), no clipping;
480 steps. At steps 120, 240 and 360 the job "resumes": the model is reloaded from the
state_dict saved at that step (same weights) and the optimizer state is dropped
(opt.state.clear(): step counts, exp_avg and exp_avg_sq are gone), as a restart that saves
only model.state_dict() would do. The loss recorded at step S is computed before that
step's update, so the damage of the first post-resume update at step S shows at S + 1.

What is TRUE of the run (measured; printed at the end):
- Loss 2.34 at step 0; 40-step window medians: 0.553, 0.082, 0.027, 0.217, 0.018, 0.008,
  0.112, 0.017, 0.008, 0.157, 0.027, 0.014 (the 4th, 7th and 10th windows hold the spikes).
- The spikes, each at the step after a resume (the loss at the resume step itself is
  normal):
    step 121: 5.66 (median of the 20 steps before: 0.0185), then 0.41, 0.93, 1.13, 0.98,
      0.90, 0.84, 0.82, ... back under 2x the pre-spike median at step 163;
    step 241: 3.80 (before: 0.0067), then 0.36, 0.58, 0.89, 0.72, 0.66, 0.57, 0.52, ...
      back under 2x at step 300;
    step 361: 2.76 (before: 0.0064), then 0.48, 0.69, 0.65, 0.57, 0.57, 0.66, 0.54, ...
      back under 2x at step 443.
  These are the three largest losses of the run; the next largest are steps 0 and 1 (2.34,
  2.31: the untrained model), and after step 12 every loss above 0.78 lies in the
  aftermath of one of these spikes (largest 1.13, step 124). No NaN/Inf; the run ends normally.
- Gradient norm: median 0.58, max 25.3 (step 241); 23.2 at step 121 and 20.0 at step 361
  against 0.43 / 0.22 / 0.20 on the resume steps.
- LR: 1e-3 at step 0, linear warmup to 2e-2 at step 19, constant 2e-2 after (the resumes
  do not change it).
- With lr 2e-3 instead (same resumes, measured) the post-resume losses are 0.24-0.29 and
  are back within 2-16 steps: the too-high LR turns the lost optimizer state into real
  spikes.
"""

import argparse
import io
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 121, "tolerance": 1},
    ],
    "forbidden": ["nonfinite"],
}

STEPS, BATCH, ROWS, LR, WARMUP = 480, 512, 8192, 2e-2, 20
RESUMES = (120, 240, 360)


def report(losses, gnorms, lrs, k=12):
    n = len(losses) // k
    med = [round(sorted(losses[i * n:(i + 1) * n])[n // 2], 4) for i in range(k)]
    print("WINDOW_MEDIANS (40 steps)", med)
    top = sorted(range(len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES (step, loss, next 3)",
          [(i, round(losses[i], 3), [round(v, 3) for v in losses[i + 1:i + 4]]) for i in top])
    g = sorted(gnorms)
    print("GNORM median", round(g[len(g) // 2], 3), "max", round(g[-1], 3),
          "at", gnorms.index(g[-1]), "nonfinite", sum(not math.isfinite(v) for v in losses))
    print("LR", [(i, f"{lrs[i]:.2e}") for i in (0, 10, 19, 20, len(lrs) - 1)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, 8, generator=gen)
    y = torch.sin(2 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] - 0.5 * x[:, 3:4] ** 2
    model = nn.Sequential(nn.Linear(8, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                          nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    losses, gnorms, lrs = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step in RESUMES:
                buf = io.BytesIO()
                torch.save(model.state_dict(), buf)        # weights-only checkpoint
                buf.seek(0)
                model.load_state_dict(torch.load(buf))
                opt.state.clear()                          # Adam moments lost on resume
                print("resume at step", step)
            idx = torch.randint(0, ROWS, (BATCH,), generator=gen)
            loss = nn.functional.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn.item())
            lrs.append(opt.param_groups[0]["lr"])
            sched.step()
    report(losses, gnorms, lrs)
    print("first steps", [round(v, 3) for v in losses[:8]])
    for r in RESUMES:
        base = sorted(losses[r - 20:r])[10]
        back = next((j for j in range(r + 1, STEPS) if losses[j] < 2 * base), None)
        print(f"resume {r}: median of 20 before {base:.4f}; steps {r - 1}..{r + 8}:",
              [round(v, 3) for v in losses[r - 1:r + 9]],
              f"back under 2x at step {back}", f"gnorm {r}: {gnorms[r]:.2f} {r + 1}: "
              f"{gnorms[r + 1]:.2f}")


if __name__ == "__main__":
    main()
