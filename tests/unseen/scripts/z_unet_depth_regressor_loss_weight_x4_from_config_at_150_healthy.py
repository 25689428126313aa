"""Small U-Net monocular depth regressor (2 down / 2 up levels, 8-16-32 channels, skip
concatenations, GroupNorm) trained on synthetic 32x32 scenes: 1-3 axis-aligned slabs at
random depths (1-10 m) in front of a tilted background plane; the image is Lambertian-ish
shading (intensity 1/depth, a depth-dependent stripe texture and noise), the target is the
log-depth map. Loss: SmoothL1 on log depth. Adam(2e-3), batch 8, 320 steps.

What changes at step 150: the run follows a loss-weight schedule read from its config,
``{"loss_weights": {"depth": [[0, 1.0], [150, 4.0]]}}`` (the depth term is up-weighted once
the network has found the scene layout, as a multi-task config would do). From step 150 the
optimised (and recorded) loss is 4 x SmoothL1, so the loss and every gradient are 4x larger.
HEALTHY by design: Adam's update is invariant to a constant loss factor once its moment
estimates have caught up (until then its steps are somewhat larger), nothing else changes, and the
unweighted depth error keeps falling after step 150.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows):
- recorded loss: median 0.00476 over steps 130-149, 0.0196 over 150-169 (x4.11), 0.0192 over
  170-189, 0.0112 over the last 20 steps; values 0.00484 at 149, 0.0151 at 150, 0.0215 at 151.
- grad norm: median 0.0577 over 130-149, 0.460 over 150-169 (x7.96: x4 from the weight, and
  Adam's second moment, still at the old scale, makes the first ~100 steps after the change
  take larger steps), 0.333 over 170-189, 0.235 over the last 20; 0.0298 at 149, 0.461 at
  150, 0.459 at 151. 40-step medians: 0.693 0.155 0.068 0.069 | 0.364 0.191 0.173 0.224, so
  it stays about 3x its pre-150 level, as the x4 weight implies.
- the unweighted SmoothL1 (the run's own metric): 0.00476 over 130-149, 0.00489 over 150-169,
  0.00481 over 170-189, 0.00281 over the last 20 (0.345 at step 0); 40-step medians 0.0885
  0.0098 0.0054 0.0045 | 0.0048 0.0029 0.0023 0.0026: it holds for ~40 steps and then keeps
  improving.
- LR constant 2e-3. No NaN or inf. About 12 s on 2 busy cores.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, SIZE = 320, 8, 32
CONFIG = {"loss_weights": {"depth": [[0, 1.0], [150, 4.0]]}, "optim": {"lr": 2e-3}}


def weight_at(schedule, step):
    w = schedule[0][1]
    for start, value in schedule:
        if step >= start:
            w = value
    return w


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU())


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1, self.enc2, self.mid = block(3, 8), block(8, 16), block(16, 32)
        self.up2, self.dec2 = nn.ConvTranspose2d(32, 16, 2, stride=2), block(32, 16)
        self.up1, self.dec1 = nn.ConvTranspose2d(16, 8, 2, stride=2), block(16, 8)
        self.head = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.head(d1).squeeze(1) + 1.2          # log-depth, offset to the data mean


def scenes(g, n):
    yy, xx = torch.meshgrid(torch.linspace(0, 1, SIZE), torch.linspace(0, 1, SIZE), indexing="ij")
    depth = 6.0 + 3.0 * (torch.rand(n, 1, 1, generator=g) - 0.5) * yy \
        + 2.0 * (torch.rand(n, 1, 1, generator=g) - 0.5) * xx + 2.0
    depth = depth.clone()
    for i in range(n):
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            x0, y0 = torch.randint(0, SIZE - 8, (2,), generator=g).tolist()
            w, h = torch.randint(5, 16, (2,), generator=g).tolist()
            depth[i, y0:y0 + h, x0:x0 + w] = 1.0 + 8.0 * float(torch.rand(1, generator=g))
    shade = 2.0 / depth
    stripes = torch.sin(xx * 40.0 / depth) * 0.15
    rgb = torch.stack([shade, shade * 0.8 + stripes, 0.5 * shade - stripes], 1)
    rgb = rgb + 0.03 * torch.randn(rgb.shape, generator=g)
    return rgb, depth.log()


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
    g = torch.Generator().manual_seed(7)
    model = UNet()
    opt = torch.optim.Adam(model.parameters(), lr=CONFIG["optim"]["lr"])
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt, hparams=CONFIG) as rec:
        for step in range(STEPS):
            x, y = scenes(g, BATCH)
            depth_loss = F.smooth_l1_loss(model(x), y)
            w = weight_at(CONFIG["loss_weights"]["depth"], step)
            loss = w * depth_loss
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            rec.step(loss=loss, depth_smoothl1=depth_loss.detach(), loss_weight=w)
            rows.append((loss.item(), gn, depth_loss.item()))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4f} unweighted {depth_loss.item():.4f} "
                      f"gnorm {gn:.3f}", flush=True)
    report(150, rows, ("loss", "gnorm", "unweighted"))


if __name__ == "__main__":
    main()
