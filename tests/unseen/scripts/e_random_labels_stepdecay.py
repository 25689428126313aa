"""Small MLP-Mixer trained on random labels with step decay: nothing to learn, loss at chance.

What it does: an MLP-Mixer (4x4 patches of a 3x16x16 image -> 16 tokens of width 64, three
mixer blocks with LayerNorm, token-mixing MLP 16->32->16 and channel-mixing MLP 64->128->64,
GELU, mean-pool, linear head) classifies Gaussian-noise images into 10 classes. The labels are
drawn uniformly at random, independent of the images, and every step sees a fresh batch of 64
(no image is ever seen twice, so the network cannot memorise). AdamW lr 1e-3, weight decay
0.05, StepLR(step_size=100, gamma=0.3), 300 steps, cross-entropy.

What is TRUE of the run: the labels carry no information, so there is nothing to learn. The
loss sits at chance, ln 10 = 2.303, for the whole run: 2.33 at step 0, then every 25-step mean
between 2.302 and 2.316 (per-step 2.275-2.353); accuracy ~10%. The LR drops at steps 100 and
200 change nothing. The optimizer and the model work as intended (gradient norms 0.20-0.62, no
NaN); the data are the problem. A plateau at chance from step 0 is the truth of the run; no
divergence, no gradient explosion.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [{"id": "loss_plateau"}],
    "forbidden": ["loss_divergence", "gradient_explosion"],
}

CLASSES, SIZE, PATCH, DIM, BATCH, STEPS = 10, 16, 4, 64, 64, 300
TOKENS = (SIZE // PATCH) ** 2


class MixerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        self.token_mlp = nn.Sequential(nn.Linear(TOKENS, 32), nn.GELU(), nn.Linear(32, TOKENS))
        self.norm2 = nn.LayerNorm(DIM)
        self.channel_mlp = nn.Sequential(nn.Linear(DIM, 128), nn.GELU(), nn.Linear(128, DIM))

    def forward(self, x):                       # x: (batch, tokens, dim)
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.patchify = nn.Conv2d(3, DIM, PATCH, PATCH)
        self.blocks = nn.Sequential(*[MixerBlock() for _ in range(3)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, img):
        x = self.patchify(img).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)

    model = Mixer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.3)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = torch.randn(BATCH, 3, SIZE, SIZE, generator=gen)
            y = torch.randint(0, CLASSES, (BATCH,), generator=gen)   # independent of x
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, lr=sched.get_last_lr()[0], acc=acc)
            sched.step()
            if step % 25 == 0:
                print(f"step {step} loss {loss.item():.4f} (ln {CLASSES} = "
                      f"{math.log(CLASSES):.4f}) acc {acc.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
