"""Plain CNN (no norm layers), SGD+momentum, 8 classes; one raw-pixel batch knocks it to chance.

What it does: 8-class grey images 1x12x12, pixels in [0, 1] (sigmoid of a fixed random
template per class, scaled x1.5, plus unit Gaussian noise), fed normalised as
(p - 0.5) / 0.25 (values within +-2); 300 steps of 32 images read in order. Model: conv 1->16
3x3, ReLU, max-pool, conv 16->32 3x3, ReLU, max-pool, flatten, linear 288->64, ReLU, linear 64->8;
cross-entropy, SGD(lr=0.03, momentum=0.9), no clipping.

At step BAD_STEP = 140 the whole batch arrives un-normalised: p * 255 (raw 0-255 pixel
values, all positive, ~100-250x the magnitude of the normalised ones; a preprocessing branch
was skipped for one shard).

What is TRUE of the run (measured, two runs identical):
- ln C = ln 8 = 2.079.
- Steps 0-139: the loss falls from 2.11 (step 0) to <0.01 by step 50 and ~2e-5 (median,
  max 1.7e-4) over steps 100-139; the grad norm there is ~5e-4 (max 0.011).
- Step 140 (the raw batch): loss 810, grad norm 3772 (~x10^7 both). Its update, carried on by
  momentum, gives losses 3.7e4 / 2.2e4 / 383 at steps 141-143 (grad norm 1.6e4-1.8e4), 2.61
  at 144.
- Steps 145-299: the loss sits at chance level, 2.05-2.13 (median 2.08 = ln 8) for all 155
  remaining steps, grad norm ~0.17; the ReLU units are dead, the model outputs the class
  prior and never recovers. The damage starts at step 140 and the corrupt batch is the root
  cause. No NaN/Inf; nothing else wrong (memory, data loading, step times).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 140, "tolerance": 1},
    ],
}

STEPS, BATCH, CLASSES = 300, 32, 8
BAD_STEP, SCALE = 140, 255.0
MEAN, STD = 0.5, 0.25


class SmallCNN(nn.Module):
    def __init__(self, k=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 3 * 3, 64)
        self.fc2 = nn.Linear(64, k)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    templates = 1.5 * torch.randn(CLASSES, 1, 12, 12, generator=g)
    labels = torch.randint(0, CLASSES, (STEPS * BATCH,), generator=g)
    # pixels in [0, 1]; the network is fed them normalised to about [-2, 2]
    pixels = torch.sigmoid(templates[labels] + torch.randn(STEPS * BATCH, 1, 12, 12, generator=g))
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            p = pixels[step * BATCH:(step + 1) * BATCH]
            x = (p - MEAN) / STD
            y = labels[step * BATCH:(step + 1) * BATCH]
            if step == BAD_STEP:  # the whole batch in raw 0-255 pixel units, not normalised
                x = p * SCALE
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step in (BAD_STEP - 1, BAD_STEP, BAD_STEP + 1):
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
