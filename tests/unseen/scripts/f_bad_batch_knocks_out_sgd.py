"""Small ResNet (BatchNorm) on synthetic images, SGD+momentum; one image x300 knocks it out.

What it does: 10-class images 3x16x16 (a fixed random template per class plus unit Gaussian
noise), 400 steps of 32 images read in order. A small ResNet (stem conv 16, one residual block
of two 3x3 conv+BN at 16 channels, strided conv to 32, one residual block at 32, global average
pool, linear), cross-entropy, SGD(lr=0.05, momentum=0.9), no clipping.

At step BAD_STEP = 170 one image of the batch has its pixels x300 (raw 0-255 values where
normalised ones were expected).

What is TRUE of the run (measured):
- Steps 0-169: the loss falls from 2.3 to <0.15 by step 120 and ~0.003 at 140-169 (the task
  is easy); the grad norm is at most ~1.8 over 120-169 (~0.05 just before step 170).
- Step 170: the loss jumps to ~3.5 (about 1000x) and the gradient norm to ~140 (about 2000x).
  The corrupt batch is the root cause; the damage starts at that step.
- Its huge update, carried on by momentum, knocks the model far off: the loss is ~80 at
  steps 171-172, 4-15 up to ~step 180, then sits at chance level (~2.0-2.3) from ~step 190 to
  ~260 and only slowly comes down (1.7 at 280, 0.9-2.05 over 261-399, mean 1.5): at the end
  of the run it is still hundreds of times its level before the bad batch. No NaN/Inf;
  nothing wrong with memory, data loading or step times.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 170, "tolerance": 1, "top": True},
    ],
    "forbidden": ["nonfinite", "memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, CLASSES = 400, 32, 10
BAD_STEP, BAD_IMAGE, SCALE = 170, 3, 300.0


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNet(nn.Module):
    def __init__(self, k=CLASSES):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block1 = Block(16)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.block2 = Block(32)
        self.fc = nn.Linear(32, k)

    def forward(self, x):
        x = self.block1(F.relu(self.stem(x)))
        x = self.block2(F.relu(self.down(x)))
        return self.fc(x.mean((2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    templates = torch.randn(CLASSES, 3, 16, 16, generator=g)
    labels = torch.randint(0, CLASSES, (STEPS * BATCH,), generator=g)
    images = templates[labels] + torch.randn(STEPS * BATCH, 3, 16, 16, generator=g)
    model = ResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = images[step * BATCH:(step + 1) * BATCH]
            y = labels[step * BATCH:(step + 1) * BATCH]
            if step == BAD_STEP:  # one image in raw pixel units
                x = x.clone()
                x[BAD_IMAGE] *= SCALE
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step == BAD_STEP:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
