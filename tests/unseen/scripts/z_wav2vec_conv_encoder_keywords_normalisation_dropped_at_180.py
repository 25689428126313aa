"""Wav2Vec-style convolutional feature encoder (5 strided Conv1d layers 1-32-32-64-64-64,
kernels 10/8/4/4/4, strides 5/4/2/2/2, GELU, no normalisation layers) + a 2-layer context
MLP, mean-pooled, Linear -> 8 keyword classes. Data: synthetic 0.5 s clips at 4 kHz (2000
samples), each keyword a sequence of 3 tone bursts with class-specific pitches, random onset,
pitch jitter 8%, random gain, brown-ish noise; stored as int16 PCM (peak about 4000-16000);
10% of the labels are wrong (as in crowd-labelled keyword sets). The pipeline normalises each
clip (int16 / 32768, then zero mean, unit variance). CE loss,
Adam(1e-3), batch 24, 360 steps.

What changes at step 180: a BUG. A data-loader refactor drops the normalisation step, so from
step 180 the encoder is fed raw int16 sample values (batch std about 3500-4100 instead of 1).
The activations, the logits, the loss and the gradients jump by 2-3 orders of magnitude at
180. Adam then shrinks the logit scale within ~60 steps, so the loss comes back to its level
(over-confident on the mislabelled clips), but the gradient norm never does: with inputs
~4000x larger every first-layer weight gradient is larger, and the total gradient norm stays
8-10x above its pre-180 level for the rest of the run. An expert wants the gradient norm
jump at 180 (which does not go away) flagged.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows):
- loss: median 0.903 over steps 160-179, 364 over 180-199 (x403), 6.28 over 200-219, 1.02 over
  the last 20; values 1.005 at 179, 283 at 180, 1833 at 181. 40-step medians 2.05 1.41 1.15
  1.05 | 27.3 2.36 1.34 1.11 1.00: the loss recovers by about step 240.
- grad norm: median 2.29 over 160-179, 4856 over 180-199 (x2.1e3), 192 over 200-219, 19.3 over
  the last 20 (x8.4 the old level); 2.31 at 179, 4324 at 180, 1.29e4 at 181. 40-step medians
  0.354 2.16 2.64 1.92 | 369 49.2 20.5 18.0 19.1.
- batch accuracy: 0.771 over 160-179, 0.583 over 180-199, 0.292 over 200-219, 0.729 over the
  last 20.
- LR constant 1e-3. No NaN or inf. About 13 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 180, "tolerance": 1}]}

STEPS, BATCH, SR, LEN, CLASSES, SWITCH = 360, 24, 4000, 2000, 8, 180


class FeatureEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        spec = ((1, 32, 10, 5), (32, 32, 8, 4), (32, 64, 4, 2), (64, 64, 4, 2), (64, 64, 4, 2))
        self.convs = nn.ModuleList(nn.Conv1d(i, o, k, s) for i, o, k, s in spec)
        self.context = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.head = nn.Linear(64, CLASSES)

    def forward(self, wav):                        # wav: (B, LEN)
        h = wav.unsqueeze(1)
        for conv in self.convs:
            h = F.gelu(conv(h))
        h = h.transpose(1, 2)
        h = h + self.context(h)
        return self.head(h.mean(1))


def clips(g, pitches):
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    t = torch.arange(LEN) / SR
    wav = torch.zeros(BATCH, LEN)
    for b in range(BATCH):
        onset = int(torch.randint(0, 400, (1,), generator=g))
        jitter = 1 + 0.08 * torch.randn(3, generator=g)
        for k, f in enumerate((pitches[y[b]] * jitter).tolist()):
            s = onset + k * 500
            burst = torch.sin(2 * math.pi * f * t[:450]) * torch.hann_window(450)
            wav[b, s:s + 450] += burst[:max(0, min(450, LEN - s))]
        gain = 4000 + 12000 * float(torch.rand(1, generator=g))
        noise = torch.cumsum(torch.randn(LEN, generator=g), 0)
        noise = noise - noise.mean()
        wav[b] = gain * wav[b] + 0.08 * gain * noise / noise.std() + 200 * torch.randn(
            LEN, generator=g)
    flip = torch.rand(BATCH, generator=g) < 0.1                 # 10% mislabelled clips
    y = torch.where(flip, torch.randint(0, CLASSES, (BATCH,), generator=g), y)
    return wav.round().clamp(-32768, 32767).to(torch.int16), y


def normalise(pcm):
    x = pcm.float() / 32768.0
    return (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-5)


def grad_norm(model):
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()
                         if p.grad is not None))


def report(n_change, rows, names):
    med = statistics.median
    for j, name in enumerate(names):
        col = [r[j] for r in rows]
        b = med(col[n_change - 20:n_change])
        a = med(col[n_change:n_change + 20])
        print(f"[{name}] med {n_change - 20}-{n_change - 1}: {b:.4g}  {n_change}-{n_change + 19}: "
              f"{a:.4g} (x{a / b:.3g})  {n_change + 20}-{n_change + 39}: "
              f"{med(col[n_change + 20:n_change + 40]):.4g}  last20: {med(col[-20:]):.4g}  "
              f"at {n_change - 1},{n_change},{n_change + 1}: "
              + ", ".join(f"{v:.4g}" for v in col[n_change - 1:n_change + 2])
              + f"  step0: {col[0]:.4g}  nonfinite: {sum(not math.isfinite(v) for v in col)}")
        print(f"[{name}] 40-step medians: "
              + " ".join(f"{med(col[a:a + 40]):.4g}" for a in range(0, len(col), 40)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(29)
    pitches = 300 + 1200 * torch.rand(CLASSES, 3, generator=g)
    model = FeatureEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            pcm, y = clips(g, pitches)
            x = normalise(pcm) if step < SWITCH else pcm.float()    # the bug: raw int16
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            acc = (logits.argmax(1) == y).float().mean().item()
            rec.step(loss=loss, acc=acc)
            rows.append((loss.item(), gn, acc))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4g} acc {acc:.3f} gnorm {gn:.4g} "
                      f"input std {x.std().item():.4g}", flush=True)
    report(SWITCH, rows, ("loss", "gnorm", "acc"))


if __name__ == "__main__":
    main()
