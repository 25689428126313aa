"""GRU sequence classifier with 15% label noise and batch 16 (noisy per-batch loss); at step
JUMP a config bug multiplies Adam's learning rate by 30 and the loss climbs and stays high:
LR RAISED x30 MID-RUN.

What it does: sequences of 20 steps of 6-dim N(0,1) noise in which a class-specific 6-dim
motif (3 classes) is added, scaled 1.2, at 3 random time steps; 15% of labels are replaced by a
random class. GRU(6, 48) -> last hidden -> Linear(48, 3), cross-entropy, fresh samples
every step, batch 16, 360 steps, Adam(lr 5e-3) constant; from step JUMP = 200 on the
learning rate is 0.15 (x30).

What is TRUE of the run (measured; WINDOW_MEANS printed at the end):
- Recorded lr 5e-3 for steps 0-199 and 0.15 from step 200 (JUMP).
- 36-step window means: 0.906, 0.483, 0.453, 0.442, 0.482, 0.553, 0.948, 1.07, 0.829, 1.35.
  20-step means from step 160: 0.439 (160-179), 0.415 (180-199), 0.796 (200-219),
  0.86, 1.124, 1.031 (260-279). Per-batch loss 0.087-2.704; chance is ln 3 = 1.10.
- Steps 198-211: 0.48, 0.16, 0.46, 1.03, 0.8, 0.66, 0.49, 1.05, 0.49, 0.49, 0.73, 0.28, 0.91,
  1.02: the rise starts at step 201 and the loss never returns to the pre-jump ~0.42.
- Grad-norm 20-step medians barely move (0.73, 0.55, 0.96, 1.04, 1.28, 1.02): Adam bounds
  the step, so this is a loss divergence without a gradient explosion; no NaN.
- Expected: loss_divergence at ~200 (tolerance 36 = 10% of the run).
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [{"id": "loss_divergence", "first_step": 200, "tolerance": 36}],
}

STEPS, BATCH, T, D, CLASSES, JUMP, LR = 360, 16, 20, 6, 3, 200, 5e-3


class GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(D, 48, batch_first=True)
        self.out = nn.Linear(48, CLASSES)

    def forward(self, x):
        _, h = self.gru(x)
        return self.out(h[-1])


def window_means(losses, k=10):
    n = len(losses) // k
    return [round(sum(losses[i * n:(i + 1) * n]) / n, 3) for i in range(k)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(7)
    motifs = torch.randn(CLASSES, D, generator=gen)

    def sample():
        y = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        x = torch.randn(BATCH, T, D, generator=gen)
        for i in range(BATCH):
            pos = torch.randperm(T, generator=gen)[:3]
            x[i, pos] += 1.2 * motifs[y[i]]
        flip = torch.rand(BATCH, generator=gen) < 0.15
        return x, torch.where(flip, torch.randint(0, CLASSES, (BATCH,), generator=gen), y)

    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    losses, gnorms = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == JUMP:
                for g in opt.param_groups:
                    g["lr"] = LR * 30                     # the bug
            x, y = sample()
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    print("WINDOW_MEANS", window_means(losses))
    print("20-step means 160-260", [round(sum(losses[i:i + 20]) / 20, 3)
                                    for i in range(160, 280, 20)])
    print("steps 198-212", [round(v, 2) for v in losses[198:212]])
    print("gnorm 20-step medians 160-260", [round(sorted(gnorms[i:i + 20])[10], 2)
                                            for i in range(160, 280, 20)])
    print("min/max", round(min(losses), 3), round(max(losses), 3))


if __name__ == "__main__":
    main()
