"""Shared-trunk multi-task MLP that alternates tasks by step: 3 steps of A, then 1 of B.

What it does: a trunk (3 Linear+GELU layers with LayerNorm) feeds two heads. Task A is a
10-way classification (cross-entropy, starts at ~ln 10 = 2.3 and falls to ~0.7); task B is a
regression of a smooth function of the same inputs whose targets have a large scale, so its
MSE is roughly 10x task A's loss throughout (starts ~17, falls to ~8; noise floor ~4.8).
Optimizer steps 3, 7, 11, ... (step % 4 == 3) train task B, all others train task A; one
Adam optimizer over all parameters, 320 optimizer steps, one rec.step per optimizer step.

What is TRUE of the run: it is healthy. Both tasks learn (each task's own loss falls steadily).
The recorded loss jumps up ~10x every 4th step and the gradient norm is larger on those
steps, but that saw-tooth is the schedule of the multi-task loop, by design: not a loss
spike, not a gradient explosion, not a divergence. No finding above info is expected.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_spike", "gradient_explosion", "loss_divergence", "nonfinite",
                  "loss_plateau", "no_gradient", "unused_module"],
}

STEPS = 320
BATCH = 64
DIM = 32


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(DIM, 128), nn.GELU(), nn.LayerNorm(128),
            nn.Linear(128, 128), nn.GELU(), nn.LayerNorm(128),
            nn.Linear(128, 64), nn.GELU())
        self.cls_head = nn.Linear(64, 10)
        self.reg_head = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 1))

    def forward(self, x, task):
        h = self.trunk(x)
        return self.cls_head(h) if task == "A" else self.reg_head(h).squeeze(-1)


def make_data(g, n):
    """Inputs; class labels from a fixed random projection; a scaled smooth target."""
    x = torch.randn(n, DIM, generator=g)
    proj = torch.randn(DIM, 10, generator=torch.Generator().manual_seed(1))
    logits = x @ proj
    y_cls = (logits + 0.8 * torch.randn(n, 10, generator=g)).argmax(1)
    w = torch.randn(DIM, generator=torch.Generator().manual_seed(2)) / DIM ** 0.5
    y_reg = 5.0 * torch.sin(x @ w * 1.5) + 2.5 * (x[:, 0] * x[:, 1]).tanh()
    y_reg = y_reg + 2.2 * torch.randn(n, generator=g)   # irreducible noise, MSE floor ~4.8
    return x, y_cls, y_reg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x_all, ycls_all, yreg_all = make_data(g, 16384)

    model = MultiTask()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ce, mse = nn.CrossEntropyLoss(), nn.MSELoss()

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step in range(STEPS):
            idx = torch.randint(0, x_all.shape[0], (BATCH,), generator=g)
            x = x_all[idx]
            task = "B" if step % 4 == 3 else "A"
            out = model(x, task)
            loss = ce(out, ycls_all[idx]) if task == "A" else mse(out, yreg_all[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss, task_b=float(task == "B"))
            if step % 40 == 0 or step >= STEPS - 4:
                print(step, task, round(loss.item(), 3))


if __name__ == "__main__":
    main()
