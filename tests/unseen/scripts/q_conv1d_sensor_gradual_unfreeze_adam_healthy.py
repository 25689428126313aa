"""Healthy: ULMFiT-style gradual unfreezing of a (self-pretrained) 1-D conv encoder on
two-channel sensor signals. The encoder starts frozen under a fresh classification head; its
top block is unfrozen at step 100, the middle block at step 200, the bottom block at step 300,
so each block's gradient appears from nothing at that step. Nothing is wrong.

What it does: 128-sample, 2-channel signals (a waveform and its quarter-period shift, amplitude
0.5-1.5, Gaussian noise std 0.3). Before recording, the encoder (3 blocks of Conv1d(k=5) ->
GroupNorm -> GELU -> MaxPool(2); 32/48/64 channels; mean+max pooled to 128 features) is trained
for 150 unrecorded Adam steps on task A, "which waveform shape" (sine/square/saw/triangle;
held-out acc 0.93) -- this stands in for loading a pretrained checkpoint. The recorded run is
task B, "which of 5 frequency bands" (1-2, 2.5-3.5, 4-5, 5.5-6.5, 7-8 cycles per window, any
shape), with a fresh MLP head (128 -> 64 -> 5). Adam with two groups: head lr 2e-3, encoder lr
3e-4 (constant; the first param group is the head). Encoder parameters have
requires_grad=False (grad None, skipped by Adam) until their block is unfrozen:
block3 at step 100, block2 at step 200, block1 at step 300. Batch 32 fresh every step, 400 steps.

What is TRUE of the run (measured; printed at the end):
- Loss 1.657 at step 0; 25-step window means 1.529, 1.236, 1.002, 0.826 (head only, steps
  0-99), 0.587, 0.369, 0.232, 0.159 (block3 unfrozen), 0.112, 0.071, 0.055, 0.037 (block2 too),
  0.031, 0.021, 0.024, 0.016 (all). Window maxima fall from 1.85 to 0.04 (small wiggles only,
  e.g. 0.073 -> 0.077 across step 300). No jump at any unfreezing step: loss 0.783 / 0.742 /
  0.721 at steps 99 / 100 / 101, 0.103 / 0.091 / 0.144 at 199-201, 0.022 / 0.021 / 0.025 at
  299-301. Held-out accuracy (400 signals): 0.22 at step 0, 0.77 at step 99 (head only),
  0.93 at step 125, 0.985 at step 199, 0.998 at step 300 and 399.
- Gradient norms per block are exactly 0 (None) before the block is unfrozen, then: block3 1.33
  at step 100, 2.35 at step 101 (0.5-1.9 at the later printed steps); block2 0.84 at step 200;
  block1 0.17 at step 300 (0.12-0.19 at the later printed steps). Total gradient norm around the
  unfreezing steps: 2.53 (step 99) -> 1.91 (100) -> 2.89 (101); 0.63 (199) -> 1.35 (200) -> 1.97
  (201); 1.05 (299) -> 0.71 (300) -> 0.93 (301). 25-step window medians 1.45, 1.37, 2.02, 2.08,
  2.41, 2.50, 1.74, 1.81, 1.89, 1.67, 1.35, 0.83, 0.93, 0.67, 0.90, 0.73. Overall median 1.54,
  max 5.29 (step 213), min 0.067 (step 395). No NaN/Inf.
- LR constant: 2e-3 (head) and 3e-4 (encoder).
- Healthy: gradients appearing at the unfreezing steps are by design; the loss falls from 1.66
  to ~0.02 without a spike.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

LENGTH, BATCH, STEPS, PRETRAIN_STEPS = 128, 32, 400, 150
UNFREEZE = {100: "block3", 200: "block2", 300: "block1"}
HEAD_LR, BODY_LR = 2e-3, 3e-4
BANDS = [(1.0, 2.0), (2.5, 3.5), (4.0, 5.0), (5.5, 6.5), (7.0, 8.0)]


def waveform(kind, phase):
    if kind == 0:
        return torch.sin(phase)
    if kind == 1:
        return torch.sign(torch.sin(phase))
    if kind == 2:
        return 2 * ((phase / (2 * math.pi)) % 1.0) - 1
    return 2 * torch.abs(2 * ((phase / (2 * math.pi)) % 1.0) - 1) - 1


def signals(g, n, task):
    """Task A (pretraining): which of 4 waveform shapes, any frequency 1-8 cycles.
    Task B (fine-tuning): which of 5 frequency bands, any waveform shape."""
    t = torch.linspace(0, 1, LENGTH)
    x = torch.empty(n, 2, LENGTH)
    y = torch.empty(n, dtype=torch.long)
    for i in range(n):
        kind = int(torch.randint(0, 4, (1,), generator=g))
        if task == "A":
            freq = 1.0 + 7.0 * torch.rand(1, generator=g).item()
            y[i] = kind
        else:
            band = int(torch.randint(0, len(BANDS), (1,), generator=g))
            lo, hi = BANDS[band]
            freq = lo + (hi - lo) * torch.rand(1, generator=g).item()
            y[i] = band
        phase = 2 * math.pi * (freq * t + torch.rand(1, generator=g).item())
        amp = 0.5 + torch.rand(1, generator=g).item()
        x[i, 0] = amp * waveform(kind, phase)
        x[i, 1] = amp * waveform(kind, phase + math.pi / 2)
    return x + 0.3 * torch.randn(n, 2, LENGTH, generator=g), y


def block(cin, cout):
    return nn.Sequential(nn.Conv1d(cin, cout, 5, padding=2), nn.GroupNorm(4, cout), nn.GELU(),
                         nn.MaxPool1d(2))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = block(2, 32)
        self.block2 = block(32, 48)
        self.block3 = block(48, 64)

    def forward(self, x):
        h = self.block3(self.block2(self.block1(x)))
        return torch.cat([h.mean(-1), h.amax(-1)], 1)


class Classifier(nn.Module):
    def __init__(self, encoder, classes):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Sequential(nn.Linear(128, 64), nn.GELU(), nn.Linear(64, classes))

    def forward(self, x):
        return self.head(self.encoder(x))


def grad_norm(params):
    gs = [p.grad.detach().norm() for p in params if p.grad is not None]
    return torch.stack(gs).norm().item() if gs else 0.0


def pretrain(encoder, g):
    """Task A, not recorded: stands in for a pretrained checkpoint."""
    model = Classifier(encoder, 4)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(PRETRAIN_STEPS):
        x, y = signals(g, BATCH, "A")
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, y = signals(g, 400, "A")
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"pretraining (task A): last loss {loss.item():.3f}, held-out acc {acc:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    encoder = Encoder()
    pretrain(encoder, g)
    model = Classifier(encoder, len(BANDS))          # fresh head for task B
    for p in model.encoder.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([
        {"params": model.head.parameters(), "lr": HEAD_LR},
        {"params": model.encoder.parameters(), "lr": BODY_LR},
    ])
    vx, vy = signals(g, 400, "B")
    losses, total, blocks = [], [], {k: [] for k in ("block1", "block2", "block3")}
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step in UNFREEZE:
                for p in getattr(model.encoder, UNFREEZE[step]).parameters():
                    p.requires_grad_(True)
            x, y = signals(g, BATCH, "B")
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            total.append(grad_norm(model.parameters()))
            for k in blocks:
                blocks[k].append(grad_norm(getattr(model.encoder, k).parameters()))
            opt.step()
            acc = (logits.argmax(1) == y).float().mean()
            rec.step(loss=loss, acc=acc)
            losses.append(loss.item())
            if (step % 25 == 0 or step == STEPS - 1 or step in UNFREEZE or step + 1 in UNFREEZE
                    or step - 1 in UNFREEZE):
                model.eval()
                with torch.no_grad():
                    vacc = (model(vx).argmax(1) == vy).float().mean().item()
                model.train()
                print(f"step {step} loss {loss.item():.3f} gn {total[-1]:.4f} "
                      + " ".join(f"{k} {v[-1]:.4f}" for k, v in blocks.items())
                      + f" val_acc {vacc:.3f}", flush=True)
    w = STEPS // 16
    print("WINDOW_MEANS", [round(sum(losses[i:i + w]) / w, 3) for i in range(0, STEPS, w)])
    print("LOSS_WINDOW_MAX", [round(max(losses[i:i + w]), 3) for i in range(0, STEPS, w)])
    print("GN_WINDOW_MEDIANS", [round(torch.tensor(total[i:i + w]).median().item(), 4)
                                for i in range(0, STEPS, w)])
    print("GN_WINDOW_MAX", [round(max(total[i:i + w]), 3) for i in range(0, STEPS, w)])
    t = torch.tensor(total)
    print("GN median", round(t.median().item(), 4), "max", round(t.max().item(), 4),
          "at", int(t.argmax()), "min", round(t.min().item(), 4), "at", int(t.argmin()))


if __name__ == "__main__":
    main()
