"""Pathological: a CNN regresses an object's position on a 0.5 m table from top-down camera
frames (targets in metres); from step 260 on the label pipeline serves a new shard written
in millimetres (x1000) with no conversion. SGD with momentum and gradient clipping (max norm
1.0) keeps the run finite, but from step 260 the (pre-clip) gradient norm is ~10^5-10^6x its
pre-bug level for the rest of the run and the loss is ~10^6-10^8x its pre-bug level.

What it does: fresh batch of 32 24x24 frames per step: a bright Gaussian disc (the object)
at a random position (x, y uniform in 0.05-0.45 m), a dimmer distractor disc, pixel noise
(sd 0.15). Model: Conv(1-16) - ReLU - Conv(16-32, s2) - ReLU - Conv(32-32, s2) - ReLU -
Linear(1152-64) - ReLU - Linear(64-2). MSE against the (x, y) target. SGD(lr 0.3, momentum
0.9), clip_grad_norm_(1.0), constant LR, 440 steps. From step 260 the targets are
multiplied by 1000. A held-out error (cm, reading the predictions as metres) is printed.

What is TRUE of the run (measured; printed at the end):
- Steps 0-259: the model first predicts the table centre (loss ~0.014, the variance of the
  targets; 25-step window medians 0.0173, 0.0146, 0.0148, 0.0135, 0.0144, 0.0141, 0.0143;
  held-out error ~15.5 cm), then localises the object from ~step 180: window medians 0.0078
  (175-199), 0.0015 (200-224), 0.00061 (225-249); held-out error 4.97 cm at step 200, 2.56
  cm at step 259; loss 0.00032 at step 259. Gradient norm (before clipping) median 0.025
  over 160-259, max 0.10.
- Step 260: loss 80,099 (the model still predicts metres: its error is now ~280 mm RMS);
  gradient norm 444. Then 635 (261), 2,069 (262), 7,473 (263); momentum overshoot (each
  step clipped to norm 1) takes the loss to its peak of 6.0e6 and the gradient norm to the
  run's maximum of 1.2e7 at step 268 (steps 266-271: loss 4.5e5-6.0e6).
- Steps 260-439: gradient norm median 10,293 (413,000x the pre-bug median), never below
  444; 25-step window medians 43,470 (275-299), 24,450, 8,177, 4,747, 5,634, 8,759, 7,047
  (425-439). Loss window medians 35,340 (275-299), 15,620, 2,725, 1,054, 910, 1,940, 1,350;
  minimum 398, last 557. The model slowly refits in millimetres (its squared error in
  consistent units ends 3-6x its pre-bug level: 320 mm^2 at step 259), so read as metres
  its predictions are now ~1000x off (held-out error 386 m at step 439).
- LR constant 0.3. No NaN/Inf.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 260, "tolerance": 1},
    ],
}

SIZE, TABLE_M, BATCH, STEPS, LR, CLIP, BUG_STEP, UNIT = 24, 0.5, 32, 440, 0.3, 1.0, 260, 1000.0


def frames(g, n):
    """24x24 top-down frames of a 0.5 m table: one bright disc (the object) at a random
    position, a dimmer distractor disc, background clutter and noise. Target: the object's
    centre in metres (x, y in 0.05-0.45)."""
    yy, xx = torch.meshgrid(torch.arange(SIZE, dtype=torch.float32),
                            torch.arange(SIZE, dtype=torch.float32), indexing="ij")
    pos = 0.05 + 0.4 * torch.rand(n, 2, generator=g)              # metres
    px = pos / TABLE_M * SIZE                                      # pixels
    dis = torch.rand(n, 2, generator=g) * SIZE
    r2 = (xx - px[:, 0, None, None]) ** 2 + (yy - px[:, 1, None, None]) ** 2
    d2 = (xx - dis[:, 0, None, None]) ** 2 + (yy - dis[:, 1, None, None]) ** 2
    img = torch.exp(-r2 / 4.0) + 0.4 * torch.exp(-d2 / 2.0) \
        + 0.15 * torch.randn(n, SIZE, SIZE, generator=g)
    return img.unsqueeze(1), pos


class KeypointNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32 * 6 * 6, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        return self.head(self.features(x))


def med(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(8)
    xv, pv = frames(g, 512)
    model = KeypointNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses, gnorms, errs = [], [], []

    def val_err_cm():
        """Mean distance (cm) between prediction and object, reading predictions in metres."""
        with torch.no_grad():
            return round(100 * (model(xv) - pv).norm(dim=1).mean().item(), 2)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, pos = frames(g, BATCH)
            if step >= BUG_STEP:
                pos = pos * UNIT    # new label shard written in millimetres
            loss = F.mse_loss(model(x), pos)
            opt.zero_grad()
            loss.backward()
            gn = nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn)
            if step % 25 == 0 or BUG_STEP - 1 <= step <= BUG_STEP + 3 or step == STEPS - 1:
                e = val_err_cm()
                errs.append((step, e))
                print(f"step {step} loss {loss.item():.5g} gn {gn:.5g} "
                      f"val err (m-read, cm) {e}", flush=True)
    w = 25
    print("loss 25-step window medians", [float(f"{med(losses[i:i + w]):.4g}")
                                          for i in range(0, STEPS, w)])
    print("gnorm 25-step window medians", [float(f"{med(gnorms[i:i + w]):.4g}")
                                           for i in range(0, STEPS, w)])
    pre, post = gnorms[160:BUG_STEP], gnorms[BUG_STEP:]
    print("gnorm pre-bug (160-259) median", round(med(pre), 4), "max", round(max(pre), 4),
          "| post-bug median", round(med(post), 1), "min", round(min(post), 1), "max",
          round(max(post), 1), "ratio of medians", round(med(post) / med(pre)))
    print(f"loss at {BUG_STEP - 1}", losses[BUG_STEP - 1], f"at {BUG_STEP}", losses[BUG_STEP],
          "min after", min(losses[BUG_STEP:]), "last", losses[-1], "gnorm max at",
          gnorms.index(max(gnorms)),
          "nonfinite", sum(not math.isfinite(v) for v in losses))


if __name__ == "__main__":
    main()
