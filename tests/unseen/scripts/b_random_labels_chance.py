"""Small CNN trained on pure-noise images with uniformly random labels: nothing to learn.

What it does: a LeNet-style CNN (conv-BN-ReLU-pool x2, then 2 Linear layers) on 3x16x16
Gaussian-noise images whose labels are drawn uniformly from 10 classes independently of the
image. The dataset holds 8000 samples and is read once (250 steps of batch 32, shuffled,
through a DataLoader), so no sample is seen twice and the network cannot memorise labels.
SGD with momentum 0.9, lr 0.01, cross-entropy.

What is TRUE of the run: there is no signal in the data. The loss sits at chance level,
~ln(10) = 2.30, from start to end (2.34 in the first 25 steps while the network learns to
predict the uniform prior, then 2.303 +- 0.01); it neither falls below chance, nor rises,
nor spikes; accuracy stays ~10%. The optimizer and the model work as intended; the gradient
norm shrinks (~2 -> ~0.17) only because the one thing there is to fit, the uniform prior,
is fitted: that is not a vanishing-gradient pathology. The data (labels) are the problem.
Not a divergence, not a loss spike, not a gradient explosion. A plateau mention is
acceptable but not required (the loss never moved).
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [],
    "forbidden": ["loss_divergence", "loss_spike", "gradient_explosion", "nonfinite",
                  "vanishing_gradient", "memory_leak", "dataloader_bottleneck"],
}

N, BATCH = 8000, 32


class LeNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
                                        nn.Linear(64, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(N, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (N,), generator=g)       # independent of the images
    loader = DataLoader(TensorDataset(images, labels), batch_size=BATCH, shuffle=True,
                        generator=g)

    model = LeNetish()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step, (x, y) in enumerate(rec.wrap_loader(loader)):
            logits = model(x)
            loss = loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc)
            if step % 25 == 0:
                print(step, round(loss.item(), 3), round(acc.item(), 3))


if __name__ == "__main__":
    main()
