"""MLP-Mixer (patch embedding, token-mixing and channel-mixing MLPs, LayerNorm, residuals)
classifying synthetic textured 16x16 images with SGD + momentum; a hand-written step-decay
scheduler inverts its factor, so at step JUMP_STEP the learning rate is multiplied by 50
instead of divided by 50, and the loss diverges: LR RAISED x50 MID-RUN.

What it does: 16x16 RGB textures (4 grating orientations + a checkerboard, random
frequency, phase, contrast and tint, pixel noise 0.8); MLP-Mixer with 4x4 patches (16 tokens),
dim 64, 4 blocks, LayerNorm, mean pooling. SGD(lr 0.02, momentum 0.9), batch 64, 320 steps.
The StepDecay scheduler (stepped after rec.step) divides by its factor 0.02 instead of
multiplying, so from step 200 on the learning rate is 1.0 (x50) instead of 4e-4.

What is TRUE of the run (measured; the recorded lr is 0.02 for steps 0-199 and 1.0 from 200):
- Steps 0-199: loss 1.62 at step 0, mean 1.00 over steps 20-39, 0.03 over 60-79, 0.0035 over
  180-199 (0.0010 at step 198, 0.0014 at 199); grad norm median 0.05 over steps 180-199 and
  at most 3.6 anywhere before step 200.
- Step 200 is the first update with lr 1.0 (its loss, computed before that update, is 0.0026,
  grad norm 0.049). Then the loss climbs at once and keeps climbing:
  step 201 0.0051, 202 0.33, 203 8.7, 204 20, 205 95, 207 344, 208 2.8e3, 210 1.1e4,
  212 2.0e6, 216 1.3e8, 218 5.0e10, 221 1.9e13 (then 3.6e12-6.8e12 at 222-224).
  Grad norm: 201 0.39, 202 5.1, 203 8.7, 205 33, 208 300, 210 760, 212 1.6e4, 217 2.5e5,
  218 2.8e6, 221 3.9e7.
- From step 225 to the end (320) the loss is NaN and every gradient is nonfinite (54 of 54
  tensors); the recorder logged a `nonfinite` error event at step 225.
- The cause is the x50 learning rate from step 200; nothing was wrong before it.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_divergence", "first_step": 201, "tolerance": 2},
        {"id": "gradient_explosion", "first_step": 202, "tolerance": 2},
        {"id": "nonfinite", "first_step": 225, "tolerance": 1},
    ],
    "forbidden": ["memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, SIZE, PATCH, CLASSES, DIM, DEPTH = 320, 64, 16, 4, 5, 64, 4
BASE_LR, JUMP_STEP, DECAY = 0.02, 200, 0.02


class StepDecay:
    """Meant to multiply the learning rate by `decay` (0.02) at every `every` steps. The bug:
    the factor is applied as a divisor, so the learning rate goes UP 50x at step 200."""

    def __init__(self, opt, every, decay):
        self.opt, self.every, self.decay = opt, every, decay
        self.base = [group["lr"] for group in opt.param_groups]
        self.t = 0

    def step(self):
        self.t += 1
        k = self.t // self.every
        for group, base in zip(self.opt.param_groups, self.base, strict=True):
            group["lr"] = base / self.decay ** k          # should be: base * self.decay ** k


def make_batch(n, g):
    """Five texture classes: oriented gratings at four angles and a checkerboard, random
    frequency, phase and contrast, plus pixel noise; three colour channels."""
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    angle = labels.float() * math.pi / 4
    freq = 0.6 + 0.4 * torch.rand(n, generator=g)
    phase = 2 * math.pi * torch.rand(n, generator=g)
    proj = torch.cos(angle)[:, None, None] * xx + torch.sin(angle)[:, None, None] * yy
    grating = torch.sin(freq[:, None, None] * proj + phase[:, None, None])
    f = freq[:, None, None]
    checker = torch.sin(f * xx + phase[:, None, None]) * torch.sin(f * yy)
    img = torch.where((labels == 4)[:, None, None], 2 * checker, grating)
    contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
    tint = torch.rand(n, 3, 1, 1, generator=g) + 0.5
    x = contrast * tint * img[:, None] + 0.8 * torch.randn(n, 3, SIZE, SIZE, generator=g)
    return x, labels


class MixerBlock(nn.Module):
    def __init__(self, tokens, dim, token_hidden=64, channel_hidden=128):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(),
                                       nn.Linear(token_hidden, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(),
                                         nn.Linear(channel_hidden, dim))

    def forward(self, x):                                 # B x tokens x dim
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self):
        super().__init__()
        tokens = (SIZE // PATCH) ** 2
        self.patch = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, DIM) for _ in range(DEPTH)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = MLPMixer()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    sched = StepDecay(opt, every=JUMP_STEP, decay=DECAY)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = make_batch(BATCH, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, acc=(logits.argmax(1) == y).float().mean())
            sched.step()
            if step % 20 == 0 or JUMP_STEP - 2 <= step <= JUMP_STEP + 12:
                print(f"step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.3g}",
                      flush=True)


if __name__ == "__main__":
    main()
