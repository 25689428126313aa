"""An x-vector with an ArcFace head on a 2-D embedding: sqrt backward at cos = 1 -> NaN at step 4.

What it does: 8 synthetic speakers (a log-mel spectral envelope of three formant bumps, a
pitch ripple and a speaking rate each); utterances are 24 x 60 log-mel frames with phonetic
modulation, channel tilt, noise and mean normalisation, drawn fresh each step. Model: the
x-vector TDNN of Snyder et al. (2018) (five dilated Conv1d/ReLU/BatchNorm frame layers,
mean+std statistics pooling, two segment layers) down to a 2-D embedding, so the speakers
can be plotted on the unit circle, and an additive-angular-margin head (ArcFace, s = 10,
m = 0.3) written as the widely copied arcface-pytorch ``ArcMarginProduct``:
sin = sqrt(clamp(1 - cos^2, 0, 1)). SGD lr 0.05, momentum 0.9, wd 5e-4, batch 64, 400
steps. Debug preset (activation NaN tracing, anomaly mode after the first nonfinite, NaN
gradients zeroed before the update so the weights stay finite). Seeded; deterministic up
to the recorder's first anomaly window (see below).

The bug: whenever an embedding lies on a class weight's direction to float32 precision
(|cos| rounds to exactly 1.0, an angle under ~2.4e-4 rad; in 2-D that happens every few
steps), 1 - cos^2 is 0 and sqrt's backward there divides by zero: NaN where the entry's
upstream gradient is 0 (the non-target classes), inf for the target; every gradient of the
model is then NaN. The loss itself stays finite. (The fix: clamp cos to [-1 + 1e-7, 1 - 1e-7].)

What is TRUE of the run (measured):
- Steps 0-3 are finite (loss 11.5, 12.3, 7.4, 12.3; grad norm 280, 66, 56, 25: a large
  margin-softmax start). At step 4 one cosine is exactly 1.0 and all 27 parameters' gradients
  are NaN (loss 6.28, finite). The first nonfinite value anywhere is that backward, in
  module ``arc_margin`` (SqrtBackward0); the forward stays finite all run.
- It keeps happening to the end (NaN gradients in 6-14 steps of every 50-step window): 91
  of the 400 steps have an entry at |cos| == 1 (steps 4, 12, 18, 19, 21, 30, 34, 37, ...,
  380, 387, 395), 75 of them with NaN gradients recorded and 16 inside the recorder's
  anomaly windows (caught there as SqrtBackward0 errors, that step's gradients dropped).
  The debug preset opens those windows asynchronously, so from step ~75 the exact steps and
  counts vary a little between runs (91-99 steps seen); the first five (4, 12, 18, 19, 21)
  are the same in every run.
- Because the NaN gradients are zeroed, training limps on: loss 50-step medians 1.98, 1.13,
  0.82, 0.70, 0.70, 0.71, 0.65, 0.61; batch accuracy 0.70-0.84 at the end. Finite gradient
  norms have medians 0.44-1.17 after step 50 (max 3.20).
- Steps ~29-40 ms (max 155 ms); ~17-25 s in all on 2 CPU cores.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "nonfinite", "first_step": 4, "tolerance": 0, "top": True,
         "subject": "arc_margin"},
    ],
}

STEPS, BATCH, SPEAKERS, MELS, FRAMES, EMB = 400, 64, 8, 24, 60, 2


def make_speakers(g: torch.Generator) -> dict[str, torch.Tensor]:
    """Each speaker: a mean log-mel spectral envelope, a pitch (harmonic spacing) and a
    speaking-rate (how fast the envelope drifts)."""
    bins = torch.arange(MELS).float()
    env = torch.zeros(SPEAKERS, MELS)
    for k in range(3):                                   # three formant-like bumps
        centre = torch.rand(SPEAKERS, 1, generator=g) * MELS
        env += (1.5 + torch.rand(SPEAKERS, 1, generator=g)) * torch.exp(
            -(bins[None] - centre) ** 2 / (2 * (1.5 + 2 * k) ** 2))
    pitch = 2.0 + 2.0 * torch.rand(SPEAKERS, generator=g)
    rate = 0.05 + 0.15 * torch.rand(SPEAKERS, generator=g)
    return {"env": env, "pitch": pitch, "rate": rate}


def utterances(spk: dict[str, torch.Tensor], g: torch.Generator, n: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, MELS, FRAMES) log-mel features: the speaker's envelope + harmonic ripple at the
    speaker's pitch, a slow phonetic modulation, channel tilt and frame noise; CMN applied."""
    y = torch.randint(0, SPEAKERS, (n,), generator=g)
    bins = torch.arange(MELS).float()
    t = torch.arange(FRAMES).float()
    env = spk["env"][y][:, :, None]
    ripple = 0.6 * torch.cos(2 * math.pi * bins[None, :, None] / spk["pitch"][y][:, None, None])
    phase = 2 * math.pi * torch.rand(n, 1, 1, generator=g)
    phon = 0.8 * torch.sin(spk["rate"][y][:, None, None] * t[None, None] * 2 * math.pi
                           + bins[None, :, None] / 3 + phase)
    tilt = 0.05 * torch.randn(n, 1, 1, generator=g) * bins[None, :, None]
    x = env + ripple + phon + tilt + 0.7 * torch.randn(n, MELS, FRAMES, generator=g)
    return x - x.mean(2, keepdim=True), y


class XVector(nn.Module):
    """Snyder et al. (2018) x-vector: 5 TDNN layers, statistics pooling, two segment layers.
    The embedding is 2-D, so the speakers can be plotted on the unit circle."""

    def __init__(self) -> None:
        super().__init__()
        def tdnn(i: int, o: int, k: int, d: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv1d(i, o, k, dilation=d), nn.ReLU(), nn.BatchNorm1d(o))
        self.frames = nn.Sequential(tdnn(MELS, 64, 5, 1), tdnn(64, 64, 3, 2), tdnn(64, 64, 3, 3),
                                    tdnn(64, 64, 1, 1), tdnn(64, 128, 1, 1))
        self.segment = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.BatchNorm1d(64),
                                     nn.Linear(64, EMB))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.frames(x)
        stats = torch.cat([h.mean(2), h.std(2)], 1)
        return self.segment(stats)


class ArcMarginProduct(nn.Module):
    """Additive angular margin (Deng et al. 2019), written as in the widely copied
    arcface-pytorch ``ArcMarginProduct``: cos(theta + m) = cos cos_m - sin sin_m with
    sin = sqrt(clamp(1 - cos^2, 0, 1)), easy_margin False."""

    def __init__(self, in_features: int, out_features: int, s: float = 10.0,
                 m: float = 0.3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.xavier_uniform_(self.weight)
        self.s, self.m = s, m
        self.cos_m, self.sin_m = math.cos(m), math.sin(m)
        self.th, self.mm = math.cos(math.pi - m), math.sin(math.pi - m) * m
        self.last_cosine: torch.Tensor | None = None

    def forward(self, emb: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        cosine = F.linear(F.normalize(emb), F.normalize(self.weight))
        self.last_cosine = cosine.detach()
        sine = torch.sqrt((1.0 - torch.pow(cosine, 2)).clamp(0, 1))
        phi = cosine * self.cos_m - sine * self.sin_m
        phi = torch.where(cosine > self.th, phi, cosine - self.mm)
        one_hot = F.one_hot(label, cosine.shape[1]).float()
        return self.s * (one_hot * phi + (1.0 - one_hot) * cosine)


class SpeakerModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.xvector = XVector()
        self.arc_margin = ArcMarginProduct(EMB, SPEAKERS)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.arc_margin(self.xvector(x), y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    spk = make_speakers(torch.Generator().manual_seed(3))
    data_g = torch.Generator().manual_seed(1)

    model = SpeakerModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    losses, norms, first_bad = [], [], None
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug") as rec:
        for step in range(STEPS):
            x, y = utterances(spk, data_g, BATCH)
            logits = model(x, y)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            cos = model.arc_margin.last_cosine
            at_one = int((cos.abs() == 1.0).sum())
            bad = {n for n, p in model.named_parameters()
                   if p.grad is not None and not torch.isfinite(p.grad).all()}
            norms.append(math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                       for p in model.parameters() if p.grad is not None)))
            if bad and first_bad is None:
                first_bad = step
            if bad or at_one or step % 50 == 49:
                with torch.no_grad():
                    acc = (cos.argmax(1) == y).float().mean().item()
                print(f"step {step}: loss {loss.item():.4f}  acc {acc:.3f}  "
                      f"max |cos| {cos.abs().max().item():.9f}  entries == 1: {at_one}  "
                      f"params with nonfinite grad: {len(bad)}  grad norm {norms[-1]:.4g}")
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
    print("first step with a nonfinite gradient:", first_bad)
    for s in range(0, STEPS, 50):
        w = sorted(losses[s:s + 50])
        n = sorted(v for v in norms[s:s + 50] if math.isfinite(v))
        print(f"steps {s:3d}-{s + 49:3d}: loss median {w[25]:.4f} [{w[0]:.4f}, {w[-1]:.4f}]  "
              f"finite grad norms median {n[len(n) // 2]:.4f} max {n[-1]:.4f} "
              f"({50 - len(n)} nonfinite)")


if __name__ == "__main__":
    main()
