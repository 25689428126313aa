"""Mean Teacher semi-supervised learning on 3 interleaved spirals with 50 labels (healthy).

What it does: three interleaved 2-D spirals (one turn, radial noise 0.06) embedded linearly
in 16-D with noise 0.05; only 50 labelled points, fresh unlabelled points every step. Mean
Teacher (Tarvainen & Valpola 2017): student MLP 16-256-256-128-3 with BatchNorm and dropout
0.1; the teacher is an EMA of the student (decay min(1 - 1/(t+1), 0.99)) run in train mode
on an independently noised copy of the batch (input noise 0.08). Each batch: 25 labelled +
103 unlabelled. Loss = cross-entropy on the labelled part + w(t) x consistency (squared
distance between student and teacher class probabilities), with the standard sigmoid-shaped
ramp-up w(t) = 10 exp(-5 (1 - t/250)^2) over the first 250 steps, constant 10 after. Adam
lr 3e-3, 450 steps. The loss recorded is the total. Standard preset. Seeded, deterministic.

What is TRUE of the run (measured):
- Healthy: held-out accuracy (2,000 points, chance 0.33) of the teacher 0.723 (step 49),
  0.780 (99), 0.788 (149), 0.797 (199), 0.805 (249), 0.811 (299), 0.815 (349), 0.812 (449);
  the student's 0.72-0.83. Classification loss medians per 50 steps 0.520, 0.243, 0.230,
  0.195, 0.257, 0.234, 0.214, 0.213, 0.200; consistency 0.067, 0.093, 0.084, 0.069, 0.056,
  0.053, 0.049, 0.049, 0.046 (falls once it is weighted in).
- The recorded (total) loss RISES for 150 steps by design, as the consistency weight ramps
  up from 0.4 to 10: 50-step medians 0.547, 0.333 (steps 50-99, the minimum), 0.475, 0.652,
  0.782 (200-249), then falls slowly at constant weight: 0.765, 0.713, 0.709, 0.669.
- The gradient norm rises with it: 50-step medians 1.43, 1.21, 1.38, 1.77, 1.96, 1.79,
  1.71, 1.79, 1.55; range 0.40-3.84 (max in the first steps). No NaN/Inf.
- ~6 s on 2 busy CPU cores.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "forbidden": ["loss_divergence", "loss_spike", "loss_plateau", "gradient_explosion"],
}

STEPS, RAMP, N_LABELED, DIM, CLASSES = 450, 250, 50, 16, 3
LABELED_BATCH, UNLABELED_BATCH = 25, 103
LR, EMA, W_MAX = 3e-3, 0.99, 10.0


def spirals(g: torch.Generator, n: int, proj: torch.Tensor):
    """Three interleaved 2-D spirals (one turn), radial noise 0.06, embedded linearly into
    16-D with Gaussian noise 0.05 on every coordinate."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    t = torch.rand(n, generator=g)
    r = 0.2 + 0.8 * t + 0.06 * torch.randn(n, generator=g)
    a = 2 * math.pi * t + 2 * math.pi * y / CLASSES
    xy = torch.stack([r * torch.cos(a), r * torch.sin(a)], 1)
    return xy @ proj + 0.05 * torch.randn(n, DIM, generator=g), y


class Net(nn.Module):
    """MLP 16-256-256-128-3 with BatchNorm and dropout 0.1 (the stochasticity Mean Teacher's
    consistency term relies on, with input noise)."""

    def __init__(self) -> None:
        super().__init__()
        layers, d = [], DIM
        for h in (256, 256, 128):
            layers += [nn.Linear(d, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Dropout(0.1)]
            d = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def rampup(step: int) -> float:
    """Laine & Aila / Tarvainen & Valpola: exp(-5 (1 - t)^2) over the first RAMP steps."""
    t = min(step, RAMP) / RAMP
    return math.exp(-5 * (1 - t) ** 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    proj = torch.randn(2, DIM, generator=torch.Generator().manual_seed(5)) / math.sqrt(2)
    lab_x, lab_y = spirals(torch.Generator().manual_seed(6), N_LABELED, proj)
    val_x, val_y = spirals(torch.Generator().manual_seed(7), 2000, proj)
    data_g, noise_g = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)

    student, teacher = Net(), Net()
    teacher.load_state_dict(student.state_dict())
    teacher.requires_grad_(False)      # (runs in train mode: dropout noise, own BN statistics)
    opt = torch.optim.Adam(student.parameters(), lr=LR, betas=(0.9, 0.999))
    log = []

    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x + 0.08 * torch.randn(x.shape, generator=noise_g)

    def accuracy(m: nn.Module) -> float:
        m.eval()
        with torch.no_grad():
            acc = (m(val_x).argmax(1) == val_y).float().mean().item()
        m.train()
        return acc

    with Recorder(args.run_dir, model=student, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            li = torch.randint(0, N_LABELED, (LABELED_BATCH,), generator=data_g)
            ux, _ = spirals(data_g, UNLABELED_BATCH, proj)
            x = torch.cat([lab_x[li], ux])
            s_out = student(noisy(x))
            with torch.no_grad():
                t_out = teacher(noisy(x))
            class_loss = F.cross_entropy(s_out[:LABELED_BATCH], lab_y[li])
            # squared distance between the class probabilities, summed over classes
            cons_loss = (F.softmax(s_out, 1) - F.softmax(t_out, 1)).pow(2).sum(1).mean()
            w = W_MAX * rampup(step)
            loss = class_loss + w * cons_loss
            opt.zero_grad()
            loss.backward()
            raw = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                                for p in student.parameters()))
            opt.step()
            alpha = min(1 - 1 / (step + 1), EMA)
            with torch.no_grad():
                for pt, ps in zip(teacher.parameters(), student.parameters(), strict=True):
                    pt.mul_(alpha).add_(ps, alpha=1 - alpha)
            rec.step(loss=loss, class_loss=class_loss, consistency=cons_loss, cons_weight=w)
            log.append((step, loss.item(), raw, class_loss.item(), cons_loss.item(), w))
            if step % 50 == 49:
                print(f"step {step}: weight {w:.2f} val acc student {accuracy(student):.3f} "
                      f"teacher {accuracy(teacher):.3f}")
    for s in range(0, STEPS, 50):
        rows = log[s:s + 50]

        def med(j: int, rows: list = rows) -> float:
            return sorted(r[j] for r in rows)[len(rows) // 2]

        print(f"steps {s:3d}-{s + 49:3d}: w {rows[0][5]:.2f}->{rows[-1][5]:.2f} loss median "
              f"{med(1):.3f} [{min(r[1] for r in rows):.3f}, {max(r[1] for r in rows):.3f}]"
              f"  class {med(3):.3f} consistency {med(4):.4f}  grad norm median {med(2):.3f} "
              f"[{min(r[2] for r in rows):.3f}, {max(r[2] for r in rows):.3f}]")


if __name__ == "__main__":
    main()
