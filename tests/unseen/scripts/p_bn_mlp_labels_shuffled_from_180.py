"""MLP with BatchNorm + dropout classifying overlapping Gaussian clusters (5 classes, batch
32, noisy per-batch loss); a data-pipeline bug shuffles the labels within each batch from
step CORRUPT on, so labels no longer match inputs: the loss rises to chance and stays there.

What it does: 5 classes, each a mixture of 2 Gaussian blobs in 12 dims (centres drawn
N(0, 1.6^2), unit-variance noise), so classes overlap and even the best model errs. Model:
Linear(12,64)-BatchNorm-ReLU-Dropout(0.1)-Linear(64,64)-BatchNorm-ReLU-Linear(64,5),
cross-entropy, fresh samples every step, batch 32, 400 steps, SGD(lr 0.05, momentum 0.9,
nesterov) constant. From step CORRUPT = 180 the batch's labels are randomly permuted
(``y = y[randperm]``), i.e. the labels become independent of the inputs.

Expected finding: loss_divergence from ~step 180: the loss goes UP from its trained level
to (and beyond, at first) the chance level ln 5 = 1.61 and never comes back. The loss does
not sit still for long before the bug (it was falling), so "plateau" would describe only
the part after the rise; the event a reader needs is the rise, which is why the single id
chosen is loss_divergence. Tolerance 40 steps (10% of the run).

What is TRUE of the run (measured; WINDOW_MEANS printed at the end):
- 40-step window means: 0.414, 0.14, 0.129, 0.151, 1.606, 1.673, 1.643, 1.634, 1.632, 1.631.
  20-step means: 0.145 (140-159), 0.093 (160-179), 3.12 (180-199), 1.698, 1.648, 1.643.
- Steps 176-191: 0.01, 0.09, 0.09, 0.15, 7.79, 7.13, 6.05, 5.22, 4.74, 3.31, 2.9, 2.69, 2.15,
  1.98, 2.16, 1.82: the loss jumps at step 180 (the first corrupted batch) and then settles at
  chance, 1.63, for the rest of the run. LR constant 0.05.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [{"id": "loss_divergence", "first_step": 180, "tolerance": 40}],
}

STEPS, BATCH, DIM, CLASSES, CORRUPT = 400, 32, 12, 5, 180


def window_means(losses, k=10):
    n = len(losses) // k
    return [round(sum(losses[i * n:(i + 1) * n]) / n, 3) for i in range(k)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(8)
    centres = 1.6 * torch.randn(CLASSES, 2, DIM, generator=gen)

    def sample():
        y = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        k = torch.randint(0, 2, (BATCH,), generator=gen)
        return centres[y, k] + torch.randn(BATCH, DIM, generator=gen), y

    model = nn.Sequential(nn.Linear(DIM, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(),
                          nn.Linear(64, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = sample()
            if step >= CORRUPT:
                y = y[torch.randperm(BATCH, generator=gen)]   # the bug
            logits = model(x)
            loss = loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec.step(loss=loss, acc=(logits.argmax(1) == y).float().mean())
            losses.append(loss.item())
    print("WINDOW_MEANS", window_means(losses))
    print("20-step means 140-260", [round(sum(losses[i:i + 20]) / 20, 3)
                                    for i in range(140, 260, 20)])
    print("steps 176-192", [round(v, 2) for v in losses[176:192]])
    print("min/max", round(min(losses), 3), round(max(losses), 3))


if __name__ == "__main__":
    main()
