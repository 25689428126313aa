"""Small ResNet (BatchNorm, 3 stages) on noisy synthetic 10-class images, batch 16, SGD with
momentum at a constant lr; from step 250 the loss weight silently becomes 3 instead of 1.

What it does: 9600 synthetic 3x16x16 images (10 classes; each image is its class's smooth
random colour pattern, circularly shifted by up to 3 px, at a random contrast, under pixel
noise of sd 2.2), one shuffled pass in batches of 16 (600 steps, no image seen twice). A
3-stage ResNet (basic blocks with BatchNorm, 16/32/48 channels, global average pool), SGD
lr 0.01 (constant), momentum 0.9, weight decay 5e-4. The optimised and recorded loss is
ce_weight(step) * cross-entropy; a config typo makes the weight 1.0 for steps 0-249 and 3.0
from step 250 on (an exact x3 rescale of the objective). The unscaled cross-entropy is
recorded as the metric "ce".

What is TRUE of the run (measured, and against the same run with the weight left at 1):
- Before step 250 the run learns normally and noisily (batch 16): cross-entropy median
  2.28 (steps 0-24) -> 1.27 (75-99) -> 0.70 (150-249); per-step sd ~0.2; accuracy ~0.8.
- From step 250 the recorded loss is exactly 3 x the cross-entropy, so it jumps and stays
  ~3x higher: median loss 0.70 over steps 150-249, 1.65 (250-274), 2.24 (275-299),
  1.63 (300-349), 1.17 (350-449), 1.03 (450-599; ce 0.34). The grad norm (pre-clip, no
  clipping here) jumps from ~2.6 to ~9 (median, 250-274), then settles to ~5 (450-599)
  versus ~2.3 in the unscaled run: under SGD the x3 acts as a x3 learning rate.
- Training absorbs it: the cross-entropy is briefly a little worse than the unscaled run
  (median 0.75 vs 0.49 over steps 275-299, 0.54 vs 0.48 over 300-349), equal by steps
  350-449 (0.389 vs 0.386) and close at the end (0.34 vs 0.31 over 450-599; accuracy 0.855
  vs 0.880 mean over 250-599). It keeps falling; it does not diverge, blow up or go NaN.
- So: a rescaled objective that training absorbs: healthy (nothing above info). The loss
  after step 250 sits at ~3x its previous level and then decreases again: not a divergence.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "forbidden": ["loss_divergence"]}

N, CLASSES, SIZE, BATCH, STEPS, SWITCH, K, LR = 9600, 10, 16, 16, 600, 250, 3.0, 0.01


def make_data():
    """Class prototypes are smooth random colour patterns; each image is its class prototype,
    circularly shifted by up to 3 px, at a random contrast, under heavy pixel noise."""
    g = torch.Generator().manual_seed(0)
    protos = F.interpolate(torch.randn(CLASSES, 3, 4, 4, generator=g), size=SIZE,
                           mode="bilinear", align_corners=False)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    shifts = torch.randint(-3, 4, (N, 2), generator=g)
    contrast = 0.5 + torch.rand(N, generator=g)
    x = torch.empty(N, 3, SIZE, SIZE)
    for i in range(N):
        x[i] = torch.roll(protos[y[i]], tuple(shifts[i].tolist()), dims=(1, 2)) * contrast[i]
    x += 2.2 * torch.randn(x.shape, generator=g)
    return TensorDataset(x, y)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Identity() if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout)))

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(h)) + self.skip(x))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.stages = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 48, 2))
        self.fc = nn.Linear(48, CLASSES)

    def forward(self, x):
        return self.fc(self.stages(self.stem(x)).mean((2, 3)))


def ce_weight(step):
    # The config meant {"ce": 1.0, "ce_late": 1.0}; a typo made the late weight 3.0.
    return 1.0 if step < SWITCH else K


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(1))
    model = SmallResNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        while step < STEPS:
            for x, y in rec.wrap_loader(loader):
                out = model(x)
                ce = F.cross_entropy(out, y)
                loss = ce_weight(step) * ce
                opt.zero_grad()
                loss.backward()
                opt.step()
                acc = (out.argmax(1) == y).float().mean()
                rec.step(loss=loss, ce=ce.detach(), acc=acc)
                if step % 30 == 0:
                    print(f"step {step} loss {loss.item():.3f} ce {ce.item():.3f} "
                          f"acc {acc.item():.2f}", flush=True)
                step += 1
                if step >= STEPS:
                    break


if __name__ == "__main__":
    main()
