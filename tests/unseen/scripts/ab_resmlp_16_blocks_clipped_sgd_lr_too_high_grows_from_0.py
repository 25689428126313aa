"""Deep residual MLP at too high a learning rate, with clipping hiding it: stem 20 -> 64, 16
blocks x + fc2(gelu(fc1(x))) without normalisation or branch scaling, head 64 -> 8.
Regression on 8000 rows (targets 2 tanh(x @ W / 4) + noise), SGD lr 1.3 with momentum 0.9,
batch 128, 400 steps, clip_grad_norm_(max_norm=1.0) every step. (At lr 0.5 the same loop
trains: loss 2.0 -> 0.016.)

Mechanism: every update is clipped to norm 1 x lr, so the weights cannot jump in one step;
but each step still moves them along directions that make the residual stream larger, the
16 unnormalised blocks multiply that growth, and the pre-clip gradient grows steadily,
geometrically, from the first steps. Clipping only slows the blow-up.

What is TRUE of the run (plain torch, recorder on; grad norm = the pre-clip total L2 norm that
clip_grad_norm_ returns; identical in two runs):
- Grad norm 2.17 (step 0), 3.16, 11.2, 17.9, 28.9 (1-4), then noisy but rising: 20-step
  medians 25.6 (0-19), 652 (20-39), 2.0e4 (40-59), 6.7e5 (60-79), 2.9e7 (80-99), 2.6e12
  (100-119), 3.0e8 (120-139), 1.8e9 (140-155); inf from step 156 to the end (the float32
  norm overflows; clipping then scales every update to zero and the model freezes).
- Loss 2.03 at step 0; 20-step medians 5.0, 43, 1356, 6.3e4, 1.1e6, 9.8e10, 1.1e7, 4.3e9,
  then ~1e25 (finite) from 156 to the end. It never improves on step 1's 1.21.
- Onset: step 0-2 - the growth starts with the first updates and is steady (in log scale)
  for ~150 steps.
- About 7 s alone (14 s with a second run beside it on the 2 cores).
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 0, "tolerance": 20}]}

STEPS, BATCH, FEAT, WIDTH, OUT, BLOCKS, LR, CLIP = 400, 128, 20, 64, 8, 16, 1.3, 1.0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class DeepResMLP(nn.Module):
    """16 residual blocks, no normalisation, no scaling of the residual branches."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEAT, WIDTH)
        self.blocks = nn.Sequential(*[Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def growth_facts(rows, base_steps):
    """Print the facts of the growth: rows are (loss, grad_norm) per step; base_steps the
    steps whose median is the baseline."""
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    base = med(gn[base_steps[0]:base_steps[1]])
    bad = [i for i in range(len(gn)) if not (math.isfinite(gn[i]) and math.isfinite(loss[i]))]
    first_bad = bad[0] if bad else None
    end = first_bad if first_bad is not None else len(gn)
    stay3 = next((i for i in range(base_steps[1], end)
                  if all(g > 3 * base for g in gn[i:end])), None)
    print(f"[grad] baseline median {base:.4g} over steps {base_steps[0]}-{base_steps[1] - 1}; "
          f"above 3x the baseline for good from step {stay3}; first nonfinite step {first_bad}"
          f" ({len(bad)} nonfinite steps)")
    for a in range(0, len(rows), 20):
        fl = [v for v in loss[a:a + 20] if math.isfinite(v)]
        fg = [v for v in gn[a:a + 20] if math.isfinite(v)]
        if not fl:
            print(f"[win] {a}-{a + 19}: all nonfinite")
            continue
        print(f"[win] {a}-{a + 19}: loss median {med(fl):.4g} grad median "
              f"{med(fg) if fg else float('nan'):.4g} max {max(fg) if fg else float('nan'):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    teacher = torch.randn(FEAT, OUT, generator=g)
    xs = torch.randn(8000, FEAT, generator=g)
    ys = torch.tanh(xs @ teacher / 4) * 2 + 0.1 * torch.randn(8000, OUT, generator=g)
    model = DeepResMLP()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            idx = torch.randint(0, len(xs), (BATCH,), generator=g)
            loss = F.mse_loss(model(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            # clipping keeps every update small, so the blow-up takes ~150 steps
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step < 20 or step % 10 == 0:
                print(f"step {step} loss {loss.item():.4g} grad_norm {gn:.4g}", flush=True)
    growth_facts(rows, (0, 3))


if __name__ == "__main__":
    main()
