"""Binary MLP classifier, plain SGD; one flipped-and-scaled batch knocks it back to chance (ln 2).

What it does: a binary task on 16 tabular features (two Gaussian blobs at +-3 along a random
unit direction, plus unit noise; balanced labels), 300 steps of 64 rows read in order.
Model: MLP 16 -> 64 -> 64 -> 1 with ReLU, BCE-with-logits, SGD(lr=0.1), no momentum, no clipping.

At step BAD_STEP = 120 one batch comes from a mis-configured export: every feature is
sign-flipped, in raw shifted units and with its column order reversed:
x_bad = -300 * (x - 6) with the 16 columns flipped (almost all entries positive, mostly
0-3600); the labels are unchanged.

What is TRUE of the run (measured, two runs identical):
- ln C = ln 2 = 0.693.
- Steps 80-119: loss 0.006-0.036 (median 0.017; 0.0088 at step 119), grad norm ~0.065.
- Step 120 (the bad batch): loss 2156, grad norm 6140. Its update makes steps 121-122 blow
  up too (loss 1.2e5, 9.2e6; grad norm 7.7e3, 1.7e5).
- Steps 123-125: loss 0.67-0.75 (chance). 126-152: a brief partial relearn, loss 0.23-0.45.
  Step 153-154: a second blow-up (loss 13, 17097; grad norm 1135, 81000) - an after-effect
  of the weights inflated at step 120-122.
- Steps 155-299 (145 steps): loss at chance, median 0.693, 0.66-0.70 except isolated steps
  167 (0.87), 191 (1.09) and 232 (38.7); over the last 67 steps (233-299) strictly
  0.67-0.70, grad norm ~0.05. The model never recovers; the damage starts at step 120.
  No NaN/Inf; nothing else wrong.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 120, "tolerance": 1},
    ],
}

STEPS, BATCH, FEATURES = 300, 64, 16
BAD_STEP, SCALE, OFFSET = 120, -300.0, 6.0


def make_data(n, g):
    direction = torch.randn(FEATURES, generator=g)
    direction = direction / direction.norm()
    labels = torch.randint(0, 2, (n,), generator=g).float()
    x = torch.randn(n, FEATURES, generator=g) + 3.0 * (labels[:, None] - 0.5) * direction * 2
    return x, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    feats, labels = make_data(STEPS * BATCH, g)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = feats[step * BATCH:(step + 1) * BATCH]
            y = labels[step * BATCH:(step + 1) * BATCH]
            if step == BAD_STEP:  # sign and column order flipped, raw (shifted, x300) units
                x = SCALE * (x - OFFSET).flip(1)
            loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or BAD_STEP - 1 <= step <= BAD_STEP + 2:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
