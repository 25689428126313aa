"""A 1-D ResNet ECG beat classifier resumed at step 150 with the optimizer bound to a discarded
copy of the model: from step 150 nothing is updated and the loss is flat.

What it does: single-lead ECG beats (128 samples at 128 Hz) of 5 classes (normal, PVC, APC,
LBBB, RBBB) built from P/QRS/T Gaussian bumps, with heart-rate jitter, amplitude variation,
baseline wander and noise 0.3; fresh batches of 64. A 1-D ResNet (after Hannun et al. 2019,
scaled down: stem + three basic blocks 16-32-48, BatchNorm). SGD lr 0.005, momentum 0.9,
weight decay 1e-4, gradient clipping at 5; model.zero_grad() each step. 450 steps. The job
is preempted after step 149 (checkpoint: model, optimizer, data RNG) and relaunched: the
relaunch builds model and optimizer as usual, loads the optimizer state, then "resumes" the
model with the inference loader, which returns a NEW module. The optimizer still holds the
parameters of the module built first, which is never used again, so from step 150 no
parameter of the trained model is in the optimizer. Recorded as a restart: a second Recorder
with resume=True on the new model and the optimizer. Standard preset. Seeded, deterministic.

What is TRUE of the run (measured):
- Steps 0-149 train normally: loss medians per 50 steps 1.409, 1.084, 0.854; per 10 steps
  over 100-149: 0.907, 0.905, 0.870, 0.798, 0.809; parameter update norm per step ~0.02;
  held-out accuracy (1,000 beats) 0.480, 0.567, 0.624 (steps 49, 99, 149). The same run
  without the bug (measured with RESUME moved past the end) keeps improving: loss
  medians 0.712, 0.671, 0.585, 0.554, 0.519, 0.527 over 150-449.
- From step 150 the model's weights never change (update norm exactly 0 at every step) while
  its gradients are ordinary (total norm medians 1.62, 1.66, 1.72, 1.63, 1.60, 1.75 per 50
  steps over 150-449; range 0.77-3.54): the loss is flat from step 150, medians 0.775,
  0.777, 0.764, 0.775, 0.792, 0.773. Held-out accuracy 0.64-0.65 to the end (it moves a
  little from 0.624 only because BatchNorm running statistics still update).
- No NaN/Inf, no exception; the run ends "completed".
- ~17 s on 2 busy CPU cores.
"""

import argparse
import io
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "optimizer_coverage", "first_step": 150, "tolerance": 1, "top": True},
        {"id": "loss_plateau", "first_step": 150, "tolerance": 25},
    ],
    "forbidden": ["gradient_explosion", "vanishing_gradient", "nonfinite", "loss_divergence"],
}

STEPS, RESUME, BATCH, LENGTH, CLASSES = 450, 150, 64, 128, 5
LR, CLIP = 0.005, 5.0


def beats(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 1, 128) single-lead beats at 128 Hz, R peak near the centre: 0 normal, 1 PVC
    (wide, tall QRS, no P, inverted T), 2 APC (early, flattened P), 3 LBBB (wide notched
    QRS), 4 RBBB (rSR'). Heart-rate jitter, amplitude variation, baseline wander and
    Gaussian noise 0.3."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    t = torch.arange(LENGTH).float()[None]
    c = 64 + 3 * torch.randn(n, 1, generator=g)
    amp = 1 + 0.15 * torch.randn(n, 1, generator=g)

    def bump(mu, width, height):
        return height * torch.exp(-0.5 * ((t - mu) / width) ** 2)

    yc = y[:, None]
    p_on = (yc != 1).float() * torch.where(yc == 2, 0.07, 0.15)
    p_pos = c - torch.where(yc == 2, 14.0, 20.0)
    qrs_w = torch.where((yc == 1) | (yc == 3), 4.5, 1.8)
    qrs_h = torch.where(yc == 1, 1.6, 1.0)
    x = bump(p_pos, 3.0, p_on)
    x = x + bump(c, qrs_w, qrs_h) - bump(c + 2.5 * qrs_w, qrs_w, 0.25)
    x = x + (yc == 3).float() * -bump(c, 1.2, 0.35)                 # LBBB notch
    x = x + (yc == 4).float() * bump(c + 6, 1.6, 0.6)               # RBBB R'
    t_h = torch.where(yc == 1, -0.35, 0.3)
    x = x + bump(c + 28, 6.0, t_h)
    wander = 0.2 * torch.sin(2 * math.pi * (t / LENGTH * 0.7 + torch.rand(n, 1, generator=g)))
    x = amp * x + wander + 0.3 * torch.randn(n, LENGTH, generator=g)
    return x[:, None], y


class Block1d(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(cin, cout, 7, stride, 3, bias=False)
        self.b1 = nn.BatchNorm1d(cout)
        self.c2 = nn.Conv1d(cout, cout, 7, 1, 3, bias=False)
        self.b2 = nn.BatchNorm1d(cout)
        self.short = (nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv1d(cin, cout, 1, stride, bias=False), nn.BatchNorm1d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.short(x))


class EcgResNet(nn.Module):
    """Hannun et al. (2019)-style 1-D ResNet, scaled down."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(1, 16, 7, 1, 3, bias=False), nn.BatchNorm1d(16),
                                  nn.ReLU())
        self.blocks = nn.Sequential(Block1d(16, 16, 1), Block1d(16, 32, 2), Block1d(32, 48, 2))
        self.fc = nn.Linear(48, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(2))


def build(lr: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = EcgResNet()
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)


def load_model(blob: bytes) -> nn.Module:
    """Rebuilds the network from a checkpoint (the inference loader, reused by the
    relaunch)."""
    model = EcgResNet()
    model.load_state_dict(torch.load(io.BytesIO(blob))["model"])
    return model


def train(model, opt, data_g, steps, rec, log, val) -> None:
    for step in steps:
        x, y = beats(data_g, BATCH)
        loss = F.cross_entropy(model(x), y)
        model.zero_grad()
        loss.backward()
        raw = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        rec.step(loss=loss)
        with torch.no_grad():
            upd = math.sqrt(sum(float((p - b).double().pow(2).sum())
                                for p, b in zip(model.parameters(), before, strict=True)))
        log.append((step, loss.item(), raw, upd))
        if step % 50 == 49:
            model.eval()
            with torch.no_grad():
                out = model(val[0])
            model.train()
            print(f"step {step}: val loss {F.cross_entropy(out, val[1]).item():.3f} acc "
                  f"{(out.argmax(1) == val[1]).float().mean().item():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data_g = torch.Generator().manual_seed(1)
    val = beats(torch.Generator().manual_seed(9), 1000)
    log = []

    model, opt = build(LR)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        train(model, opt, data_g, range(RESUME), rec, log, val)
    blob = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": RESUME,
                "data_rng": data_g.get_state()}, blob)
    del model, opt                                      # preempted after step 149

    # The relaunch: build model and optimizer as usual, then "resume" by loading the model
    # with the inference loader, which returns a NEW module. The optimizer still holds the
    # parameters of the module built first, which is no longer used.
    ckpt = torch.load(io.BytesIO(blob.getvalue()))
    model, opt = build(LR)
    opt.load_state_dict(ckpt["optimizer"])
    model = load_model(blob.getvalue())
    data_g.set_state(ckpt["data_rng"])
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  resume=True) as rec:
        train(model, opt, data_g, range(RESUME, STEPS), rec, log, val)

    def med(v: list) -> float:
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 50):
        w = log[s:s + 50]
        print(f"steps {s:3d}-{s + 49:3d}: loss median {med([r[1] for r in w]):.3f} "
              f"[{min(r[1] for r in w):.3f}, {max(r[1] for r in w):.3f}]  grad norm median "
              f"{med([r[2] for r in w]):.3f} [{min(r[2] for r in w):.3f}, "
              f"{max(r[2] for r in w):.3f}]  update norm median {med([r[3] for r in w]):.3g}")
    for a in range(100, 200, 10):
        w = log[a:a + 10]
        print(f"steps {a}-{a + 9}: loss median {med([r[1] for r in w]):.3f} update norm median "
              f"{med([r[3] for r in w]):.3g}")


if __name__ == "__main__":
    main()
