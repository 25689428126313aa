"""Pathological: one corrupted batch. A dilated 1-D CNN classifies accelerometer-like sensor
windows; at step 233 one shard's batch arrives in raw 12-bit ADC counts instead of
normalised units (every input value x100 plus the 2048 mid-scale offset). The loss of that
batch is ~2 million times the usual; gradient clipping bounds the update, so the next step
is normal again. Everything else about the run is clean.

What it does: 5 activity classes, 3-channel windows of 64 samples: each class is a sum of
class-specific sinusoids (frequencies / phases per channel, random amplitude 0.7-1.3 and
random phase jitter) plus Gaussian noise (std 0.5), standardised to roughly unit scale.
Fresh windows every step, batch 32. Model: Conv1d(3-32, k5) - ReLU - Conv1d(32-32, k3,
dilation 2) - ReLU - Conv1d(32-32, k3, dilation 4) - ReLU - global average pool -
Linear(32-5); cross-entropy; SGD(lr 0.05, momentum 0.9, weight decay 1e-4),
clip_grad_norm_(1.0), constant LR; 420 steps. At BAD_STEP = 233 the batch's inputs become
2048 + 100 x (labels untouched). Held-out accuracy on 1,000 clean windows is printed every
30 steps and right around the bad step.

What is TRUE of the run (measured; printed at the end):
- Loss ~1.6 for the first 60 steps, then the model learns: 30-step window medians 1.610,
  1.593, 1.446, 0.628, 0.068, 0.017, 0.016, 0.013, 0.005, 0.003, 0.003, 0.005, 0.002,
  0.001. Held-out accuracy 0.178 (step 29), 0.418 (59), 0.89 (89), 0.97 (119), 0.998 (149),
  1.0 (232).
- Step 233: loss 38,570 (median of the 30 steps before: 0.019; step 232: 0.005). It is the
  only anomalous step: 234 -> 0.010, 235 -> 0.017, 236 -> 0.002, and held-out accuracy is
  0.997 / 0.996 / 0.999 / 1.0 at steps 233-236 and 1.0 at 419. The next-largest loss of the
  run is 1.65 (step 3, untrained). No NaN/Inf.
- Gradient norm before clipping: median 0.21; 176,949 at step 233 (0.15 at 232, 0.30 at
  234); clipped to 1.0.
- LR 0.05 throughout.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

BAD_STEP = 233

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 233, "tolerance": 1},
    ],
    "forbidden": ["nonfinite"],
}

STEPS, BATCH, CLASSES, CH, LEN = 420, 32, 5, 3, 64


def windows(n, gen, freqs, phases):
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    t = torch.arange(LEN, dtype=torch.float32) / LEN
    amp = 0.7 + 0.6 * torch.rand(n, 1, 1, generator=gen)
    jitter = 0.6 * torch.rand(n, 1, 1, generator=gen)
    f = freqs[y][:, :, None]
    ph = phases[y][:, :, None] + jitter
    x = amp * torch.sin(2 * math.pi * f * t + ph) + 0.5 * torch.randn(n, CH, LEN, generator=gen)
    return x / 0.85, y


def report(losses, gnorms, lrs, k=14):
    n = len(losses) // k
    med = [round(sorted(losses[i * n:(i + 1) * n])[n // 2], 3) for i in range(k)]
    print("WINDOW_MEDIANS (30 steps)", med)
    top = sorted(range(len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES (step, loss, next 3)",
          [(i, round(losses[i], 3), [round(v, 3) for v in losses[i + 1:i + 4]]) for i in top])
    g = sorted(gnorms)
    print("GNORM median", round(g[len(g) // 2], 3), "max", round(g[-1], 3),
          "at", gnorms.index(g[-1]), "nonfinite", sum(not math.isfinite(v) for v in losses))
    print("LR changes", [(i, lr) for i, lr in enumerate(lrs) if i == 0 or lrs[i - 1] != lr])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(6)
    freqs = torch.randint(1, 9, (CLASSES, CH), generator=gen).float()
    phases = 2 * math.pi * torch.rand(CLASSES, CH, generator=gen)
    xv, yv = windows(1000, gen, freqs, phases)
    model = nn.Sequential(
        nn.Conv1d(CH, 32, 5, padding=2), nn.ReLU(),
        nn.Conv1d(32, 32, 3, padding=2, dilation=2), nn.ReLU(),
        nn.Conv1d(32, 32, 3, padding=4, dilation=4), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    losses, gnorms, lrs = [], [], []

    def val_acc():
        with torch.no_grad():
            return round((model(xv).argmax(1) == yv).float().mean().item(), 3)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = windows(BATCH, gen, freqs, phases)
            if step == BAD_STEP:
                x = 2048.0 + 100.0 * x   # raw 12-bit ADC counts slipped through
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn.item())
            lrs.append(opt.param_groups[0]["lr"])
            if (step + 1) % 30 == 0 or BAD_STEP - 1 <= step <= BAD_STEP + 3:
                print(step, "val_acc", val_acc(), "loss", round(loss.item(), 3))
    report(losses, gnorms, lrs)
    b = BAD_STEP
    base = sorted(losses[b - 30:b])[15]
    print(f"median of 30 steps before {b}: {base:.3f}; steps {b - 2}..{b + 12}:",
          [round(v, 3) for v in losses[b - 2:b + 13]])
    back = next((j for j in range(b + 1, STEPS) if max(losses[j:j + 5]) < 2 * base + 0.1), None)
    print("back to pre-spike level (5 steps in a row < 2x median + 0.1) from step", back)
    print("gnorm around the bad step", [round(v, 2) for v in gnorms[b - 2:b + 5]])


if __name__ == "__main__":
    main()
