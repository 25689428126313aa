"""Small conv net on synthetic stroke images, trained with OneCycleLR: a healthy run.

A 3-block conv net (conv-BatchNorm-ReLU, two strided, global average pool, linear head)
classifies noisy 16x16 images into 6 stroke patterns (horizontal, vertical, two diagonals,
plus and corner) at random positions. SGD with Nesterov momentum 0.9, weight decay 5e-4,
OneCycleLR(max_lr=0.05): warm-up over the first 30% of the 300 steps, cosine annealing to
~0 after. Batches of 32 from a DataLoader.

Measured: the loss falls from 1.88 at step 0 (ln 6 = 1.79) to ~0.15 at the end; 25-step
means 1.80, 1.68, 1.40, 0.97, 0.58, 0.42, 0.28, 0.23, 0.19, 0.17, 0.16, 0.15 (slow during the
first ~50 steps of warm-up, fastest around the LR peak at step 90, flattening as the LR anneals
to ~0). Held-out accuracy at the end 98%. Gradient norms stay at 0.5-1.4 with no trend
upward; no NaN, no loss jump beyond batch-to-batch noise.

What is true of the run: healthy. Nothing above info.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_spike", "gradient_explosion", "loss_divergence", "loss_plateau"],
}

STEPS = 300
BATCH = 32
SIZE = 16
CLASSES = 6


def strokes(n, gen):
    imgs = torch.zeros(n, 1, SIZE, SIZE)
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    ar = torch.arange(7)
    for i in range(n):
        r0, c0 = (torch.randint(0, SIZE - 7, (2,), generator=gen)).tolist()
        k = int(labels[i])
        rows, cols = {0: (ar * 0 + 3, ar), 1: (ar, ar * 0 + 3), 2: (ar, ar), 3: (ar, 6 - ar),
                      4: (torch.cat([ar * 0 + 3, ar]), torch.cat([ar, ar * 0 + 3])),
                      5: (torch.cat([ar * 0, ar]), torch.cat([ar, ar * 0]))}[k]
        imgs[i, 0, rows + r0, cols + c0] = 1.0
    imgs += 0.35 * torch.randn(imgs.shape, generator=gen)
    return imgs, labels


def block(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(block(1, 16, 1), block(16, 32, 2), block(32, 32, 2),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.head(self.features(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    x, y = strokes(STEPS * BATCH, gen)
    xv, yv = strokes(512, gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(2))
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=STEPS,
                                                pct_start=0.3)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step, (xb, yb) in enumerate(rec.wrap_loader(loader)):
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            rec.step(loss=loss)
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        acc = (model(xv).argmax(1) == yv).float().mean().item()
    print(f"held-out accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
