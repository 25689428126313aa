"""10-class MLP, AdamW; loss weight x10 at step 140 puts the loss at ~ln 10 by coincidence.

What it does: 10 classes of 24-d feature vectors (a random Gaussian centre per class, spread
SPREAD = 1, plus unit noise; a small learning rate keeps the loss falling all run), 320 steps of
64 rows read in order. Model: MLP 24 -> 128 -> 64 -> 10 with SiLU; cross-entropy multiplied by
a loss weight; AdamW(lr=4e-4, weight_decay=0.01), no clipping.

The loss weight is 1.0 until step WEIGHT_STEP = 140 and 10.0 from then on (a config change
meant for a multi-task mix, applied to the only task). The recorded loss is the weighted one,
so it jumps x10 at step 140. The new level lands near ln 10 = 2.303 ONLY BY COINCIDENCE (the
unweighted cross-entropy happens to be ~0.26 at that step): the model is NOT at chance, it is
still learning, and the weighted loss keeps decreasing after the change.

What is TRUE of the run (measured, two runs identical):
- ln C = ln 10 = 2.303.
- Unweighted phase: loss 2.29 at step 0, window means 0.37 (120-129), 0.31 (130-139);
  0.30 at step 139; grad norm ~0.55.
- Step 140: weighted loss 2.60 (ce 0.26), i.e. ~ln 10 BY COINCIDENCE: the model is far
  from guessing (chance would be ce 2.3). Grad norm 4.7 (~x10, as the loss).
- The loss keeps falling after the rescale: window means 2.27 (140-149), 1.35 (150-159),
  0.98 (160-169), 0.77 (170-179), 0.57 (190-199), 0.38-0.48 (230-299), 0.33-0.37 (300-319);
  median 0.33 over 279-319 (ce ~0.033, 9x below its level at the change). The grad norm
  stays at ~2.5-3.5 (the x10 scale) with no growth.
- Nothing is wrong: the objective was rescaled; the new level is near ln C only by
  coincidence. Healthy run, no NaN.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_divergence", "gradient_explosion", "loss_spike"],
}

STEPS, BATCH, CLASSES, FEATURES = 320, 64, 10, 24
WEIGHT_STEP, NEW_WEIGHT, SPREAD = 140, 10.0, 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    centres = SPREAD * torch.randn(CLASSES, FEATURES, generator=g)
    labels = torch.randint(0, CLASSES, (STEPS * BATCH,), generator=g)
    feats = centres[labels] + torch.randn(STEPS * BATCH, FEATURES, generator=g)
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.SiLU(), nn.Linear(128, 64), nn.SiLU(),
                          nn.Linear(64, CLASSES))
    opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.01)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = feats[step * BATCH:(step + 1) * BATCH]
            y = labels[step * BATCH:(step + 1) * BATCH]
            weight = 1.0 if step < WEIGHT_STEP else NEW_WEIGHT
            ce = F.cross_entropy(model(x), y)
            loss = weight * ce
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, ce=ce)
            if step % 25 == 0 or WEIGHT_STEP - 1 <= step <= WEIGHT_STEP + 1:
                print(f"step {step} loss {loss.item():.4g} ce {ce.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
