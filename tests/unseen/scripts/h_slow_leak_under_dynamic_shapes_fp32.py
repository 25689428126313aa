"""PointNet part segmenter, random batch size each step (fp32); keeps every logits from step 100.

What it does: per-point part segmentation of synthetic point clouds of desk lamps (256
points, 6 parts: base disc, switch, pole, arm, conical shade, bulb; random proportions,
rotation about z, scale and jitter). The batch size is drawn uniformly from 24..64 every
step, so every activation's shape changes from step to step (fp32 throughout, no autocast).
Model, written after PointNet's segmentation network without the T-nets: per-point shared
MLP 3 → 64 → 64 (Linear + BatchNorm + ReLU on the (B·256, C) matrix of points), global
feature 64 → 128 → 128 max-pooled over each cloud, concatenated back to every point,
MLP 192 → 64 → 64 → 6 logits per point. Adam(lr=1e-3), 300 steps.

The bug: from KEEP_FROM = 100 on, the loop keeps every step's logits
(``kept.append(logits.detach())``, "to compute per-part IoU at the end") in a list that is
never cleared: B×256×6 float32, 144-384 KiB a step depending on the batch size (≈264 KiB on
average), 52.0 MiB over the 200 steps. (Step 100's logits are alive anyway at the end of step
100; the first retained tensor shows from step 101.)

What is TRUE of the run (ground truth):
- Host memory is flat for steps 0-100 although shapes change every step, then leaks from
  step 100 to the end (memory_leak, first step 100): linear on average, in steps of varying
  size, with no plateau. Measured with the Recorder replaced by a stub (live heap = glibc
  mallinfo2 uordblks + hblkhd, RSS from /proc/self/statm, end of each step): the live heap is
  within 118.1-118.5 MiB over steps 0-100, then grows by 268 KiB a step on average to 170.2
  MiB at step 299. RSS varies within 446-516 MiB before the leak (the changing batch size)
  and climbs to 727 MiB at step 299. With the recorder: 129.5-130.3 MiB over steps 0-100
  except a transient recorder bump to ≈136 MiB around steps 51-60, then +269 KiB a step to
  182.1 MiB.
- Training is otherwise healthy: the loss falls from 1.94 to ≈0.25; no divergence, no NaN/Inf.
"""

import argparse
import itertools
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 100, "tolerance": 5},
    ],
    "forbidden": ["loss_divergence", "nonfinite"],
}

STEPS, POINTS, PARTS, MIN_BS, MAX_BS = 300, 256, 6, 24, 64
PART_POINTS = (48, 16, 48, 48, 64, 32)  # points per part, sum = POINTS
KEEP_FROM = 100


def _rand(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.rand(n, k, generator=g)


def lamps(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n point clouds of desk lamps with 6 labelled parts and random proportions: base disc,
    switch, pole, arm, conical shade, bulb. Random rotation about z, scale, jitter; points
    shuffled. Returns points (n, 3, P) centred per cloud, and part labels (n, P)."""
    per = PART_POINTS
    one = lambda lo, hi: torch.rand(n, 1, generator=g) * (hi - lo) + lo  # noqa: E731
    base_r, pole_h, arm_l, shade_r = one(0.5, 1.0), one(1.0, 2.0), one(0.5, 1.2), one(0.3, 0.6)
    parts = []
    u, a = _rand(n, per[0], g), _rand(n, per[0], g) * 2 * math.pi  # base: filled disc, z = 0
    parts.append(torch.stack([base_r * u.sqrt() * a.cos(), base_r * u.sqrt() * a.sin(),
                              0.02 * _rand(n, per[0], g)], 1))
    b = [_rand(n, per[1], g) for _ in range(3)]  # switch: small box on the base's rim
    parts.append(torch.stack([0.7 * base_r + 0.12 * b[0], 0.1 * b[1] - 0.05,
                              0.02 + 0.06 * b[2]], 1))
    u, a = _rand(n, per[2], g), _rand(n, per[2], g) * 2 * math.pi  # pole: thin cylinder
    parts.append(torch.stack([0.04 * a.cos(), 0.04 * a.sin(), u * pole_h], 1))
    u, a = _rand(n, per[3], g), _rand(n, per[3], g) * 2 * math.pi  # arm: sloping rod
    parts.append(torch.stack([u * arm_l, 0.03 * a.cos(),
                              pole_h + 0.3 * u * arm_l + 0.03 * a.sin()], 1))
    top = pole_h + 0.3 * arm_l
    u, a = _rand(n, per[4], g), _rand(n, per[4], g) * 2 * math.pi  # shade: cone, open below
    parts.append(torch.stack([arm_l + shade_r * u * a.cos(), shade_r * u * a.sin(),
                              top - 0.5 * shade_r * u], 1))
    v = torch.randn(n, 3, per[5], generator=g)  # bulb: small sphere under the shade
    v = 0.1 * v / v.norm(dim=1, keepdim=True)
    parts.append(v + torch.stack([arm_l, torch.zeros_like(arm_l), top - 0.35 * shade_r], 1))
    pts = torch.cat(parts, 2)  # (n, 3, P)
    lab = torch.cat([torch.full((n, k), i) for i, k in enumerate(per)], 1)
    th = torch.rand(n, generator=g) * 2 * math.pi
    rot = torch.zeros(n, 3, 3)
    rot[:, 0, 0], rot[:, 0, 1], rot[:, 1, 0], rot[:, 1, 1] = th.cos(), -th.sin(), th.sin(), th.cos()
    rot[:, 2, 2] = 1
    scale = torch.rand(n, 1, 1, generator=g) * 0.8 + 0.6
    pts = scale * (rot @ pts) + 0.02 * torch.randn(n, 3, POINTS, generator=g)
    perm = torch.argsort(torch.rand(n, POINTS, generator=g), 1)  # shuffle the points
    return (pts.gather(2, perm[:, None].expand(-1, 3, -1)) - pts.mean(2, keepdim=True),
            lab.gather(1, perm))


def mlp(*ch: int) -> nn.Sequential:
    """PointNet's shared MLP: the same Linear → BatchNorm → ReLU applied to every point
    (points are rows of a (B·P, C) matrix)."""
    layers = []
    for a, b in itertools.pairwise(ch):
        layers += [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
    return nn.Sequential(*layers)


class PointNetSeg(nn.Module):
    """PointNet segmentation network (Qi et al. 2017) without the input/feature transforms:
    per-point shared MLP → global max-pool → per-point MLP on [local, global] features."""

    def __init__(self) -> None:
        super().__init__()
        self.local = mlp(3, 64, 64)
        self.glob = mlp(64, 128, 128)
        self.seg = nn.Sequential(mlp(64 + 128, 64, 64), nn.Linear(64, PARTS))

    def forward(self, pts: torch.Tensor) -> torch.Tensor:
        b, _, p = pts.shape
        loc = self.local(pts.transpose(1, 2).reshape(b * p, 3))  # (B·P, 64)
        glob = self.glob(loc).view(b, p, -1).amax(1)  # (B, 128)
        glob = glob[:, None].expand(-1, p, -1).reshape(b * p, -1)
        return self.seg(torch.cat([loc, glob], 1))  # (B·P, PARTS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)

    model = PointNetSeg()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept = []  # the leak, from KEEP_FROM on: every step's logits
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            bs = int(torch.randint(MIN_BS, MAX_BS + 1, (1,), generator=g))
            pts, lab = lamps(bs, g)
            logits = model(pts)
            loss = nn.functional.cross_entropy(logits, lab.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= KEEP_FROM:
                kept.append(logits.detach())  # "to compute per-part IoU at the end"
            rec.step(loss=loss)
            losses.append(loss.item())
    held = sum(t.untyped_storage().nbytes() for t in kept)
    print(f"loss first {losses[0]:.3f} last-10 mean {sum(losses[-10:]) / 10:.4f}; "
          f"kept {len(kept)} logits tensors, {held / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
