"""MobileNet-style depthwise-separable CNN with Adam at lr 1e-6 (cosine): the LR is far too low.

What it does: a small MobileNet-v1-style network (3x3 stem conv, four depthwise-separable
blocks: depthwise 3x3 conv-BN-ReLU6 then pointwise 1x1 conv-BN-ReLU6, two of them strided,
global average pool, linear head) classifies synthetic 3x16x16 images into 10 classes; each
class is a fixed random smooth pattern, shifted by up to 2 pixels, scaled by a random
contrast and buried in Gaussian noise. Fresh batches of 64 every step, 300 steps.
Adam with lr 1e-6 -- 1000x below the usual 1e-3 -- under CosineAnnealingLR(T_max=300) to 0.

What is TRUE of the run: a learning rate ~1000x too small. The loss never moves from its
initial value: it starts at 2.30 (chance is ln 10 = 2.303) and every 25-step mean over the
whole run lies between 2.335 and 2.363 (per-step values 2.22-2.46, pure batch noise); accuracy
stays at chance. The parameters barely change (head weight norm 1.8173 at step 0, 1.8171 at
step 200). The same script with --lr 1e-3 learns the task (loss 2.24 -> 0.23 over the same 300
steps), so the data and model are fine: the plateau is there from step 0 and is caused by the
LR. Gradients are NOT small: the total gradient norm is ~1.0 (0.8-1.4) from start to end with
no trend; the one tiny gradient, the stem BatchNorm's weight (~4e-6 from step 0), is
architectural (its scale is normalised away by the following depthwise conv + BatchNorm), not
caused by the LR. No divergence, no explosion.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [{"id": "loss_plateau", "first_step": 0, "tolerance": 15}],
    "forbidden": ["loss_divergence", "gradient_explosion"],
}

CLASSES, SIZE, BATCH, STEPS = 10, 16, 64, 300
LR = 1e-6


def separable(cin, cout, stride):
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
        nn.ReLU6(),
        nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6())


class TinyMobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU6())
        self.blocks = nn.Sequential(separable(16, 32, 1), separable(32, 64, 2),
                                    separable(64, 64, 1), separable(64, 128, 2))
        self.head = nn.Linear(128, CLASSES)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean((2, 3)))


def make_templates(gen):
    t = torch.randn(CLASSES, 3, SIZE // 4, SIZE // 4, generator=gen)
    return nn.functional.interpolate(t, size=(SIZE, SIZE), mode="bilinear",
                                     align_corners=False)


def batch(templates, gen):
    y = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    shifts = torch.randint(-2, 3, (BATCH, 2), generator=gen).tolist()
    x = torch.stack([torch.roll(templates[k], s, dims=(1, 2))
                     for k, s in zip(y.tolist(), shifts, strict=True)])
    x = x * (0.5 + torch.rand(BATCH, 1, 1, 1, generator=gen))
    return x + 0.8 * torch.randn(x.shape, generator=gen), y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--lr", type=float, default=LR, help="(a sanity check: 1e-3 learns)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    templates = make_templates(gen)

    model = TinyMobileNet()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = batch(templates, gen)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, lr=sched.get_last_lr()[0], acc=acc)
            sched.step()
            if step % 25 == 0:
                print(f"step {step} loss {loss.item():.4f} acc {acc.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
