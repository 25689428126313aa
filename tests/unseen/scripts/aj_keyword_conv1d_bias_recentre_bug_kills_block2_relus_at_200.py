"""A keyword-spotting 1-D CNN whose block2 ReLUs are all killed at step 200 by a buggy bias
"re-centring" routine: from then on block2 outputs exactly 0, every gradient upstream of it
is exactly 0, and the loss sits at chance (ln 8).

What it does: log-mel-like patches (20 bands x 48 frames) of 8 keywords, each 3
formant-like syllables at a random onset and tempo over coloured noise; fresh batches of 64.
Model: block1 Conv1d(20->48, k5)+ReLU, block2 Conv1d(48->64, k5)+ReLU, block3
Conv1d(64->64, k3, dilation 2)+ReLU, mean over time, linear head. SGD lr 0.05, momentum 0.9,
wd 1e-4. At step 200 (before that step's forward) a calibration routine meant to shift each
block2 channel's bias by 0.1 x its mean pre-activation instead subtracts 10 x the channel's
max |pre-activation| over 256 held-out clips, pushing every block2 pre-activation below 0.
400 steps. Debug preset (activation statistics every 25 steps). Seeded, deterministic.

What is TRUE of the run (measured):
- Steps 0-199 train normally: loss medians per 25 steps 2.078, 2.046, 1.520, 1.124, 0.813,
  0.668, 0.546, 0.422; held-out accuracy (1,000 clips) 0.310, 0.610, 0.803, 0.857 at
  steps 49-199; ReLU zero fraction block1/block2/block3 ~0.55/0.52/0.59 at step 199;
  gradient norm of block1.0.weight and block2.0.weight, 25-step medians 0.43-0.68 (100-199).
- From step 200 block2's ReLU output is 0 for every channel, position and sample (zero
  fraction 1.00 at every step 200-399); block1.0.* and block2.0.* gradients are exactly 0 at
  every step, and block3 sees an all-zero input (its weight gradient is 0 too; only its
  bias, and the head, still learn); block3 zero fraction rises to 0.88-0.95.
- Loss 2.432 at step 200 (0.265, 0.422 at 198-199), then medians 2.152, 2.089, 2.078,
  2.082, 2.083, 2.080, 2.081, 2.081 per 25 steps over 200-399: flat at chance, ln 8 = 2.079.
  Held-out accuracy 0.132, 0.107, 0.120, 0.120 at steps 249-399.
- No NaN/Inf; the run ends "completed".
- ~14 s on 2 busy CPU cores.
"""

import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {
            "id": "dead_activation",
            "first_step": 200,
            "tolerance": 1,
            "top": True,
            "subject": "block2",
        },
        {"id": "loss_plateau", "first_step": 205, "tolerance": 20},
    ],
    "forbidden": ["nonfinite", "gradient_explosion", "memory_leak"],
}

STEPS, BATCH, MELS, FRAMES, WORDS, BAD_STEP = 400, 64, 20, 48, 8, 200


def utterances(g, n):
    """Log-mel-like spectrogram patches (20 bands x 48 frames) of 8 'keywords': each keyword
    is a sequence of 3 formant-like syllables (band centre, duration) at a random onset and
    tempo, over coloured background noise."""
    y = torch.randint(0, WORDS, (n,), generator=g)
    table = torch.Generator().manual_seed(123)
    centres = 3 + 14 * torch.rand(WORDS, 3, generator=table)
    lengths = 5 + 6 * torch.rand(WORDS, 3, generator=table)
    band = torch.arange(MELS).float()[None, :, None]
    frame = torch.arange(FRAMES).float()[None, None, :]
    tempo = 0.8 + 0.4 * torch.rand(n, 1, 1, generator=g)
    t = 2 + 8 * torch.rand(n, 1, 1, generator=g)
    x = torch.zeros(n, MELS, FRAMES)
    for k in range(3):
        c = centres[y, k][:, None, None] + 0.8 * torch.randn(n, 1, 1, generator=g)
        ln = lengths[y, k][:, None, None] * tempo
        on = ((frame >= t) & (frame < t + ln)).float()
        x = x + on * torch.exp(-0.5 * ((band - c) / 1.5) ** 2)
        t = t + ln + 1
    noise = torch.randn(n, MELS, FRAMES, generator=g)
    noise = 0.5 * (noise + noise.roll(1, 2)) + 0.3 * torch.randn(n, MELS, 1, generator=g)
    return x + 0.5 * noise, y


class KeywordCNN(nn.Module):
    """Small keyword-spotting 1-D CNN over time (bands as channels)."""

    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv1d(MELS, 48, 5, padding=2), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv1d(48, 64, 5, padding=2, dilation=1), nn.ReLU())
        self.block3 = nn.Sequential(nn.Conv1d(64, 64, 3, padding=2, dilation=2), nn.ReLU())
        self.head = nn.Linear(64, WORDS)

    def forward(self, x):
        return self.head(self.block3(self.block2(self.block1(x))).mean(2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    val_x, val_y = utterances(torch.Generator().manual_seed(8), 1000)
    model = KeywordCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    log = []
    acts = {}
    for name in ("block1", "block2", "block3"):
        getattr(model, name).register_forward_hook(
            lambda m, i, o, name=name: acts.__setitem__(name, float((o == 0).float().mean()))
        )
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug") as rec:
        for step in range(STEPS):
            if step == BAD_STEP:
                # "re-centre" block2's pre-activations on held-out data: meant to shift each
                # channel's bias by 0.1 x its mean pre-activation, but takes the max |.|
                # over the batch and multiplies instead of dividing by 10
                with torch.no_grad():
                    pre = model.block2[0](model.block1(val_x[:256]))
                    model.block2[0].bias -= 10 * pre.abs().amax((0, 2))
            x, y = utterances(g, BATCH)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = {n: float(p.grad.norm()) for n, p in model.named_parameters()}
            opt.step()
            rec.step(loss=loss)
            log.append((loss.item(), gn, dict(acts)))
            if step % 50 == 49:
                with torch.no_grad():
                    out = model(val_x)
                print(
                    f"step {step}: val loss {F.cross_entropy(out, val_y):.3f} acc "
                    f"{(out.argmax(1) == val_y).float().mean():.3f}"
                )

    def med(v):
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 25):
        w = log[s : s + 25]
        print(
            f"{s:3d}-{s + 24}: loss med {med([r[0] for r in w]):.3f} [{min(r[0] for r in w):.3f},"
            f" {max(r[0] for r in w):.3f}] grad med block1.w "
            f"{med([r[1]['block1.0.weight'] for r in w]):.3g}"
            f" block2.w {med([r[1]['block2.0.weight'] for r in w]):.3g} head.w "
            f"{med([r[1]['head.weight'] for r in w]):.3g} zero-frac b1 {w[-1][2]['block1']:.2f} "
            f"b2 {w[-1][2]['block2']:.2f} b3 {w[-1][2]['block3']:.2f}"
        )
    for s in range(BAD_STEP - 2, BAD_STEP + 3):
        print(
            s,
            f"{log[s][0]:.3f}",
            {k: round(v, 3) for k, v in log[s][2].items()},
            f"{log[s][1]['block2.0.weight']:.3g}",
        )
    print(f"time {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
