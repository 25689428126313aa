"""Conformer-lite keyword classifier on synthetic log-mel spectrograms, Adam + Noam
(inverse-square-root) warm-up schedule. HEALTHY.

What it does: 48-frame x 32-bin "log-mel" inputs; each of 8 classes is a frequency track
(4 start bins x rising/falling slope, odd classes with a harmonic) at a random onset, length and
loudness (0.3-0.7) over unit-scale coloured noise - a noisy task that takes the whole run to
learn. Model: 2-D conv subsampling (x2), linear projection to d=64, learned positions, two
Conformer blocks (half-step FFN, MHSA with 4 heads, conv module: pointwise -> GLU -> depthwise
k=15 (no bias, BatchNorm follows) -> BatchNorm -> SiLU -> pointwise, half-step FFN, LayerNorm),
mean pooling, linear head. Dropout 0.1. Cross-entropy with label smoothing 0.1.
Adam(betas 0.9/0.98, eps 1e-9), Noam schedule lr = 0.25 * d^-0.5 * min(s^-0.5, s * 60^-1.5):
linear warm-up to 4.0e-3 at step 59, then inverse-square-root decay to 1.6e-3 at step 359.
360 steps of batch 24, fresh samples every step. (The LR scheduler is stepped before rec.step,
so the recorded lr is the next step's.) nn.MultiheadAttention calls its out_proj weights
functionally, so that submodule is never "called" although its parameters get gradients.

What is TRUE of the run (measured):
- ln 8 = 2.079. Loss 2.158 at step 0 (mean 2.137 over steps 0-9), mean 1.44 over steps 40-79,
  1.13 over 120-159, 0.97 over 200-239, 0.88 over the last 40 steps (per-batch range there
  0.57-1.21; the smoothed-label floor is ~0.47). Train accuracy over the last 40 steps 0.81;
  held-out accuracy 0.80 (chance 0.125). The loss falls throughout.
- Grad norm median 3.7 over steps 0-39 (max 6.0, during warm-up), 2.5 over 40-79, 1.9 over
  80-119, then 1.3-1.5 per 40-step window to the end (max 2.4); no NaN/Inf.
- Step time median ~64 ms (p99 108 ms).
- Nothing is wrong: a healthy run.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
}

STEPS, BATCH, FRAMES, MELS, CLASSES = 360, 24, 48, 32, 8
D_MODEL, HEADS, WARMUP, NOAM_FACTOR = 64, 4, 60, 0.25


def make_batch(n, g):
    """Each class is a frequency track (start bin, slope, harmonic or not) at a random time
    offset and loudness, on a coloured-noise background."""
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    start = 4.0 + 3.0 * (labels % 4).float()
    slope = torch.where(labels < 4, torch.tensor(0.25), torch.tensor(-0.15))
    t = torch.arange(FRAMES).float()
    f = torch.arange(MELS).float()
    onset = torch.randint(0, FRAMES // 3, (n,), generator=g).float()
    length = FRAMES // 2 + torch.randint(0, FRAMES // 4, (n,), generator=g).float()
    centre = start[:, None] + 6 + slope[:, None] * (t[None] - onset[:, None])     # n x T
    active = ((t[None] >= onset[:, None]) & (t[None] < onset[:, None] + length[:, None])).float()
    track = torch.exp(-(f[None, None] - centre[:, :, None]) ** 2 / 2.0)             # n x T x F
    harmonic = torch.exp(-(f[None, None] - 1.8 * centre[:, :, None]) ** 2 / 2.0)
    track = track + 0.6 * harmonic * (labels % 2 == 1).float()[:, None, None]
    loud = 0.3 + 0.4 * torch.rand(n, 1, 1, generator=g)
    noise = torch.randn(n, FRAMES, MELS, generator=g)
    noise = 0.5 * (noise + noise.roll(1, 2) + noise.roll(1, 1)) / 3 ** 0.5
    spec = loud * track * active[:, :, None] + 1.0 * noise
    return spec, labels


class FeedForward(nn.Module):
    def __init__(self, d, mult=4, p=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, mult * d), nn.SiLU(), nn.Dropout(p),
                                 nn.Linear(mult * d, d), nn.Dropout(p))

    def forward(self, x):
        return self.net(x)


class ConvModule(nn.Module):
    def __init__(self, d, kernel=15, p=0.1):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.dw = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d, bias=False)  # BN follows
        self.bn = nn.BatchNorm1d(d)
        self.pw2 = nn.Conv1d(d, d, 1)
        self.drop = nn.Dropout(p)

    def forward(self, x):                       # x: B x T x D
        y = self.norm(x).transpose(1, 2)
        y = F.glu(self.pw1(y), dim=1)
        y = F.silu(self.bn(self.dw(y)))
        return self.drop(self.pw2(y).transpose(1, 2))


class ConformerBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ff1 = FeedForward(d)
        self.attn_norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.conv = ConvModule(d)
        self.ff2 = FeedForward(d)
        self.out_norm = nn.LayerNorm(d)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.out_norm(x)


class Conformer(nn.Module):
    def __init__(self):
        super().__init__()
        # 2-D conv subsampling (x2 in time and frequency), then a linear projection
        self.subsample = nn.Sequential(nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.SiLU(),
                                       nn.Conv2d(16, 16, 3, padding=1), nn.SiLU())
        self.proj = nn.Linear(16 * (MELS // 2), D_MODEL)
        self.pos = nn.Parameter(torch.randn(1, FRAMES // 2, D_MODEL) * 0.02)
        self.blocks = nn.ModuleList([ConformerBlock(D_MODEL, HEADS) for _ in range(2)])
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, spec):                    # B x T x F
        x = self.subsample(spec[:, None])       # B x 16 x T/2 x F/2
        b, c, t, f = x.shape
        x = self.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f)) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(x.mean(1))


def noam(step):
    s = step + 1
    return NOAM_FACTOR * D_MODEL ** -0.5 * min(s ** -0.5, s * WARMUP ** -1.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    val_x, val_y = make_batch(512, g)
    model = Conformer()
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, noam)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = make_batch(BATCH, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y, label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc)
            if step % 40 == 0 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} acc {acc.item():.2f} "
                      f"lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    model.eval()
    with torch.no_grad():
        val_acc = (model(val_x).argmax(1) == val_y).float().mean().item()
    print(f"val acc {val_acc:.3f} (chance {1 / CLASSES:.3f}); ln C = {math.log(CLASSES):.3f}")


if __name__ == "__main__":
    main()
