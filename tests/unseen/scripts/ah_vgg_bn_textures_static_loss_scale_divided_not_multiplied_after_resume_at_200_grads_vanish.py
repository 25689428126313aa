"""A BN VGG whose resumed loss-scaling helper divides by the scale from step 200: grads ~1e-6.

What it does: 20 classes of 32x32 RGB texture patches (two gratings per class with
orientation, frequency and tint; random phase, +-12 degree jitter, contrast, brightness,
Gaussian noise 2.5), generated per batch. Model: a VGG-style net with BatchNorm (six 3x3
convs, 16-128 channels, five max-pools, linear classifier). SGD lr 0.01, momentum 0.9,
weight decay 5e-4, batch 64, 400 steps. The script keeps the static loss scaling (1024) of
its fp16 ancestor: backward on the scaled loss, then every gradient divided by 1024 before
the step. Steps 0-199 multiply the loss by the scale; the job was preempted and resumed at
step 200 with a refactored helper that divides it (``loss / scale``), so from step 200 every
gradient is 1/1024^2 (~1e-6) of the true one. The recorded loss is the true, unscaled one.
Held-out accuracy (500 patches) of snapshots is measured after the recorded run. Standard
preset. Seeded, deterministic.

What is TRUE of the run (measured):
- Steps 0-199 learn normally: loss 50-step medians 2.961, 1.410, 0.862, 0.614 (still
  falling); gradient norm medians 3.93, 3.54, 3.42, 3.17 (2.68 at step 199); held-out
  accuracy 0.220, 0.570, 0.780, 0.786 after steps 49, 99, 149, 199. (The same run without
  the bug goes on to losses 0.47, 0.48, 0.36, 0.34 and accuracy 0.884 by step 399.)
- From step 200 exactly the gradient norm is ~1e-6 of that: 3.4e-6 at 200, medians
  5.5e-6 - 6.4e-6 per 50 steps, never above 8.8e-6 (2.68 -> 3.4e-6 from step 199 to 200).
- For ~30 steps the momentum buffer keeps moving the weights along its last, now
  uncorrected, direction (update norm 0.068 at 200, 0.024 at 210, 0.003 at 230, against
  ~0.07 per step before); that coasting costs accuracy: the loss climbs from ~0.5 to ~1.3
  (step 210 0.855, 215 1.29, 225 1.62; held-out accuracy 0.530 at 210). Then training is
  frozen (update norm 0.0012 a step, weight decay only): loss medians 1.210 (200-249),
  1.482, 1.413, 1.367; accuracy 0.546-0.568 to the end.
- No NaN/Inf. Steps ~54 ms (max 142 ms); ~28 s in all on 2 CPU cores.
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
        {"id": "vanishing_gradient", "first_step": 200, "tolerance": 1},
    ],
}

STEPS, BATCH, SIDE, CLASSES, RESUME, LOSS_SCALE, NOISE = 400, 64, 32, 20, 200, 1024.0, 2.5


def make_classes(g: torch.Generator) -> dict[str, torch.Tensor]:
    """Twenty texture classes: a grating orientation, a spatial frequency, a second weaker
    grating and an RGB tint each (several classes share an orientation or a frequency)."""
    return {"theta": torch.rand(CLASSES, generator=g) * math.pi,
            "freq": 0.15 + 0.35 * torch.rand(CLASSES, generator=g),
            "theta2": torch.rand(CLASSES, generator=g) * math.pi,
            "freq2": 0.1 + 0.4 * torch.rand(CLASSES, generator=g),
            "tint": 0.5 + 0.5 * torch.rand(CLASSES, 3, generator=g)}


def textures(cls: dict[str, torch.Tensor], g: torch.Generator, n: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-sized RGB texture patches: two gratings with random phases, orientation jitter
    +-12 degrees, random contrast and brightness, Gaussian noise; standardised per channel."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    ys, xs = torch.meshgrid(torch.arange(SIDE).float(), torch.arange(SIDE).float(),
                            indexing="ij")
    th = cls["theta"][y] + (torch.rand(n, generator=g) - 0.5) * 0.42
    th2 = cls["theta2"][y] + (torch.rand(n, generator=g) - 0.5) * 0.42
    ph, ph2 = 2 * math.pi * torch.rand(2, n, generator=g)
    u = xs[None] * th.cos()[:, None, None] + ys[None] * th.sin()[:, None, None]
    u2 = xs[None] * th2.cos()[:, None, None] + ys[None] * th2.sin()[:, None, None]
    pattern = (torch.sin(cls["freq"][y][:, None, None] * u + ph[:, None, None])
               + 0.5 * torch.sin(cls["freq2"][y][:, None, None] * u2 + ph2[:, None, None]))
    contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
    img = contrast * pattern[:, None] * cls["tint"][y][:, :, None, None]
    img = img + 0.3 * torch.randn(n, 1, 1, 1, generator=g)
    img = img + NOISE * torch.randn(n, 3, SIDE, SIDE, generator=g)
    return (img - img.mean((0, 2, 3), keepdim=True)) / img.std((0, 2, 3), keepdim=True), y


class VGG(nn.Module):
    """A VGG-style net with BatchNorm (Simonyan & Zisserman 2015): six 3x3 conv layers,
    channels 16-128, five max-pools, for 32x32 inputs."""

    cfg = (16, "M", 32, "M", 64, 64, "M", 128, "M", 128, "M")

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in self.cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, int(v), 3, padding=1, bias=False),
                           nn.BatchNorm2d(int(v)), nn.ReLU(inplace=True)]
                c = int(v)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(128, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def scale_loss(loss: torch.Tensor, step: int) -> torch.Tensor:
    """Static loss scaling carried over from the fp16 (apex-era) version of this script.
    Up to the preemption the script multiplied; the refactored helper the job was resumed
    with at step 200 divides (``loss / scale``), while the unscaling below still divides the
    gradients by the scale."""
    return loss * LOSS_SCALE if step < RESUME else loss / LOSS_SCALE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cls = make_classes(torch.Generator().manual_seed(3))
    data_g = torch.Generator().manual_seed(1)
    val_x, val_y = textures(cls, torch.Generator().manual_seed(7), 500)

    model = VGG()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    log, snapshots = [], {}
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = textures(cls, data_g, BATCH)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            scale_loss(loss, step).backward()
            for p in model.parameters():                      # unscale
                p.grad.div_(LOSS_SCALE)
            gn = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                               for p in model.parameters()))
            w_before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            upd = math.sqrt(sum(float((p.detach() - w).double().pow(2).sum())
                                for p, w in zip(model.parameters(), w_before, strict=True)))
            rec.step(loss=loss)                               # the true, unscaled loss
            log.append((step, loss.item(), gn, upd))
            if step % 50 == 49 or step in (RESUME - 1, RESUME + 10, RESUME + 30):
                snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
    probe = VGG()                                             # scored after the run
    probe.eval()
    for step, state in snapshots.items():
        probe.load_state_dict(state)
        with torch.no_grad():
            acc = (probe(val_x).argmax(1) == val_y).float().mean().item()
        print(f"after step {step}: val acc {acc:.3f}")
    for s in [*range(RESUME - 3, RESUME + 4), *range(RESUME + 5, RESUME + 41, 5)]:
        print(f"step {s}: loss {log[s][1]:.4f} grad norm {log[s][2]:.4g} "
              f"update norm {log[s][3]:.4g}")
    for s in range(0, STEPS, 50):
        w = log[s:s + 50]
        def med(j: int, w: list = w) -> float:
            return sorted(r[j] for r in w)[len(w) // 2]

        print(f"steps {s:3d}-{s + 49:3d}: loss median {med(1):.4f} [{min(r[1] for r in w):.4f},"
              f" {max(r[1] for r in w):.4f}]  grad norm median {med(2):.4g} "
              f"[{min(r[2] for r in w):.4g}, {max(r[2] for r in w):.4g}]  update norm median "
              f"{med(3):.4g}")


if __name__ == "__main__":
    main()
