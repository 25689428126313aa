"""A PointNet classifying 3-D shape point clouds; at step 230 one cloud in the batch arrives in
millimetres instead of metres (x1000). The single corrupted sample throws the run: a loss
and gradient spike at 230, a dozen chaotic steps, then the network is stuck at chance for
the rest of the run.

What it does: clouds of 64 points sampled from 5 surfaces (sphere, cube, cylinder, cone,
torus), random 3-D rotation, anisotropic scale 0.8-1.2, noise 0.05; fresh batches of 32.
PointNet (Qi et al. 2017) without T-nets or BatchNorm: shared per-point MLP 3-64-64-128
(1x1 Conv1d + ReLU), max pool, MLP 128-64-5. SGD lr 0.05, momentum 0.9, no clipping. At step
230 sample 7 of the batch is multiplied by 1000. 420 steps. Standard preset. Seeded,
deterministic.

What is TRUE of the run (measured):
- Steps 0-229 train normally: loss medians per 30 steps 1.609, 1.596, 1.524, 1.259, 1.124,
  1.035, 0.911; held-out accuracy (1,000 clouds) 0.349, 0.469, 0.743 at steps 69, 139, 209;
  gradient norm median 2.5 over 180-209 (max 6.2), loss 0.71-0.83 at steps 227-229.
- Step 230: loss 1035, gradient norm 1170. With momentum the step throws the weights
  (parameter norm 13.9 -> 358 by step 239 -> 5509 by the end) and steps 231-242 are chaotic:
  loss 1.9-3209 (45 at 232, 189 at 235, 3209 at 241), gradient norm up to 8381 (step 242).
  Held-out loss right after step 230: 8.59.
- From step 243 the run is dead at chance: per-step loss 1.53-1.66 around ln 5 = 1.609,
  30-step medians 1.613, 1.613, 1.614, 1.617, 1.608 to the end; gradient norm medians
  0.14-0.16; 84 % of the 128 point-feature channels output 0 for every held-out cloud (5 %
  before step 230); held-out accuracy 0.215, 0.186, 0.196 at steps 279, 349, 419.
- No NaN/Inf; the run ends "completed".
- ~14-17 s on 2 busy CPU cores.
"""

import argparse
import math
import time

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 230, "tolerance": 1, "top": True},
        {"id": "gradient_explosion", "first_step": 230, "tolerance": 1},
        {"id": "loss_plateau", "first_step": 243, "tolerance": 21},
    ],
    "forbidden": ["nonfinite", "memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, POINTS, CLASSES, BAD_STEP, BAD_INDEX, BAD_SCALE = 420, 32, 64, 5, 230, 7, 1000.0


def clouds(g, n):
    """n point clouds of 64 points: 0 sphere surface, 1 cube surface, 2 cylinder, 3 cone,
    4 torus; random 3-D rotation, anisotropic scale 0.8-1.2, noise 0.05 (metres)."""
    y = torch.randint(0, CLASSES, (n,), generator=g)
    u = torch.rand(n, POINTS, generator=g)
    v = torch.rand(n, POINTS, generator=g)
    th, ph = 2 * math.pi * u, torch.acos(2 * v - 1)
    sphere = torch.stack(
        [torch.sin(ph) * torch.cos(th), torch.sin(ph) * torch.sin(th), torch.cos(ph)], 2
    )
    face = torch.randint(0, 6, (n, POINTS), generator=g)
    cube = torch.rand(n, POINTS, 3, generator=g) * 2 - 1
    ax = face // 2
    cube = cube.scatter(2, ax[..., None], (face % 2 * 2 - 1).float()[..., None])
    cyl = torch.stack([torch.cos(th), torch.sin(th), 2 * v - 1], 2)
    cone = torch.stack([v * torch.cos(th), v * torch.sin(th), 1 - 2 * v], 2)
    tor = torch.stack(
        [
            (1 + 0.35 * torch.cos(2 * math.pi * v)) * torch.cos(th),
            (1 + 0.35 * torch.cos(2 * math.pi * v)) * torch.sin(th),
            0.35 * torch.sin(2 * math.pi * v),
        ],
        2,
    )
    allc = torch.stack([sphere, cube, cyl, cone, tor], 1)
    pts = allc[torch.arange(n), y]
    q, _ = torch.linalg.qr(torch.randn(n, 3, 3, generator=g))
    pts = pts @ q * (0.8 + 0.4 * torch.rand(n, 1, 3, generator=g))
    return pts + 0.05 * torch.randn(n, POINTS, 3, generator=g), y


class PointNet(nn.Module):
    """Qi et al. (2017) PointNet without the T-nets or BatchNorm: shared per-point MLP
    3-64-64-128, max pool, MLP 128-64-5."""

    def __init__(self):
        super().__init__()
        self.point_mlp = nn.Sequential(
            nn.Conv1d(3, 64, 1),
            nn.ReLU(),
            nn.Conv1d(64, 64, 1),
            nn.ReLU(),
            nn.Conv1d(64, 128, 1),
            nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, pts):
        return self.head(self.point_mlp(pts.transpose(1, 2)).max(2).values)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    val_x, val_y = clouds(torch.Generator().manual_seed(4), 1000)
    model = PointNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    log = []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = clouds(g, BATCH)
            if step == BAD_STEP:
                x[BAD_INDEX] = x[BAD_INDEX] * BAD_SCALE
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
            pn = math.sqrt(sum(float(p.detach().pow(2).sum()) for p in model.parameters()))
            opt.step()
            rec.step(loss=loss)
            with torch.no_grad():
                h = model.point_mlp(val_x[:200].transpose(1, 2))
            dead = float((h.max(2).values == 0).all(0).float().mean())
            log.append((loss.item(), gn, pn, dead))
            if step % 70 == 69 or step == BAD_STEP:
                with torch.no_grad():
                    out = model(val_x)
                print(
                    f"step {step}: val loss {F.cross_entropy(out, val_y):.3f} acc "
                    f"{(out.argmax(1) == val_y).float().mean():.3f}"
                )

    def med(v):
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 30):
        w = log[s : s + 30]
        print(
            f"{s:3d}-{s + 29}: loss med {med([r[0] for r in w]):.3f} [{min(r[0] for r in w):.3f}, "
            f"{max(r[0] for r in w):.3f}] gn med "
            f"{med([r[1] for r in w]):.3g} max {max(r[1] for r in w):.3g}"
            f" |w| {w[-1][2]:.1f} dead {w[-1][3]:.2f}"
        )
    for s in list(range(BAD_STEP - 3, BAD_STEP + 8)) + [
        i for i in range(BAD_STEP + 8, STEPS) if log[i][0] > 2
    ]:
        print(
            f"step {s}: loss {log[s][0]:.4g} gn {log[s][1]:.4g} "
            f"|w| {log[s][2]:.4g} dead {log[s][3]:.2f}"
        )
    print(f"time {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
