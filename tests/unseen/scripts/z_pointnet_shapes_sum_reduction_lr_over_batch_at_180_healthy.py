"""PointNet classifier (shared per-point MLP 3-64-64-128 as 1x1 Conv1d + BatchNorm + ReLU,
global max-pool, FC 128-64-6 with dropout 0.2) on synthetic point clouds of 6 shape classes
(sphere, cube surface, cylinder, cone, torus, two-blob dumbbell), 48 points each, random
rotation about z, random anisotropic scale 0.6-1.4 and 0.2 Gaussian jitter (classes overlap:
accuracy tops out near 0.88). SGD(momentum 0.9),
batch 32, 360 steps.

What changes at step 180: the loss switches from ``reduction="mean"`` to ``reduction="sum"``
(a refactor that makes the per-sample losses summable across accumulation steps) and, in the
same commit, the learning rate is divided by the batch size (0.02 -> 0.02 / 32 = 6.25e-4), so
lr * gradient is unchanged. The recorded loss and every gradient are 32x larger from step 180.
HEALTHY by design: the SGD update is the same as before (the momentum buffer carries the old
mean-scale gradients, 1/32 of the new ones, so the first few updates are a few % smaller),
and accuracy / the per-sample loss keep improving.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows):
- recorded loss: median 0.372 over steps 160-179, 10.0 over 180-199 (x26.9), 11.2 over 200-219,
  9.15 over the last 20 steps; values 0.458 at 179, 12.5 at 180, 8.95 at 181.
- grad norm: median 1.81 over 160-179, 48.8 over 180-199 (x26.9), 53.8 over 200-219, 46.5 over
  the last 20; 1.93 at 179, 48.6 at 180, 44.5 at 181 (40-step medians ~1.9 before, 47-57
  after: x~27 for the rest of the run, as the x32 reduction implies).
- per-sample (mean) CE: 0.372 over 160-179, 0.313 over 180-199, 0.349 over 200-219, 0.286 over
  the last 20; 40-step medians 0.961 0.578 0.451 0.404 | 0.332 0.374 0.336 0.365 0.313.
- batch accuracy: median 0.875 before and after; 0.891 over the last 20.
- LR 0.02 before, 6.25e-4 from step 180 (passed as ``lr=``). No NaN or inf. About 8 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, POINTS, CLASSES, SWITCH, LR = 360, 32, 48, 6, 180, 0.02


class PointNet(nn.Module):
    def __init__(self):
        super().__init__()
        layers, cin = [], 3
        for cout in (64, 64, 128):
            layers += [nn.Conv1d(cin, cout, 1), nn.BatchNorm1d(cout), nn.ReLU()]
            cin = cout
        self.point_mlp = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(128, 64), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Dropout(0.2), nn.Linear(64, CLASSES))

    def forward(self, pts):                      # pts: (B, N, 3)
        feat = self.point_mlp(pts.transpose(1, 2))
        return self.head(feat.max(dim=2).values)


def sample_shape(c, g):
    u = torch.rand(POINTS, generator=g)
    v = torch.rand(POINTS, generator=g)
    t = 2 * math.pi * u
    if c == 0:                                   # sphere
        p = torch.randn(POINTS, 3, generator=g)
        p = p / p.norm(dim=1, keepdim=True)
    elif c == 1:                                 # cube surface
        p = torch.rand(POINTS, 3, generator=g) * 2 - 1
        axis = torch.randint(0, 3, (POINTS,), generator=g)
        sign = torch.randint(0, 2, (POINTS,), generator=g).float() * 2 - 1
        p[torch.arange(POINTS), axis] = sign
    elif c == 2:                                 # cylinder
        p = torch.stack([torch.cos(t), torch.sin(t), v * 2 - 1], 1)
    elif c == 3:                                 # cone
        r = 1 - v
        p = torch.stack([r * torch.cos(t), r * torch.sin(t), v * 2 - 1], 1)
    elif c == 4:                                 # torus
        s = 2 * math.pi * v
        p = torch.stack([(0.7 + 0.3 * torch.cos(s)) * torch.cos(t),
                         (0.7 + 0.3 * torch.cos(s)) * torch.sin(t), 0.3 * torch.sin(s)], 1)
    else:                                        # dumbbell: two blobs
        p = 0.3 * torch.randn(POINTS, 3, generator=g)
        p[:, 0] += torch.where(u < 0.5, -0.7, 0.7)
    ang = float(torch.rand(1, generator=g)) * 2 * math.pi
    rot = torch.tensor([[math.cos(ang), -math.sin(ang), 0], [math.sin(ang), math.cos(ang), 0],
                        [0, 0, 1]])
    scale = 0.6 + 0.8 * torch.rand(3, generator=g)
    return (p @ rot.T) * scale + 0.2 * torch.randn(POINTS, 3, generator=g)


def batch(g):
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    return torch.stack([sample_shape(int(c), g) for c in y]), y


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
    g = torch.Generator().manual_seed(3)
    model = PointNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt,
                  hparams={"lr": LR, "batch_size": BATCH, "optimizer": "sgd"}) as rec:
        for step in range(STEPS):
            if step == SWITCH:
                for group in opt.param_groups:
                    group["lr"] = LR / BATCH
                rec.log_hparams({"reduction": "sum", "lr_after_switch": LR / BATCH})
            x, y = batch(g)
            logits = model(x)
            reduction = "sum" if step >= SWITCH else "mean"
            loss = F.cross_entropy(logits, y, reduction=reduction)
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            per_sample = loss.item() / (BATCH if reduction == "sum" else 1)
            acc = (logits.argmax(1) == y).float().mean().item()
            rec.step(loss=loss, lr=opt.param_groups[0]["lr"], acc=acc)
            rows.append((loss.item(), gn, per_sample, acc))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4f} per-sample {per_sample:.4f} "
                      f"acc {acc:.3f} gnorm {gn:.3f}", flush=True)
    report(SWITCH, rows, ("loss", "gnorm", "per_sample_ce", "acc"))


if __name__ == "__main__":
    main()
