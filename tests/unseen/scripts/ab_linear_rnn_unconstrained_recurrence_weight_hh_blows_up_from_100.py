"""Linear recurrent network with an unconstrained transition matrix: h_t = W_hh h_{t-1} + W_ih
x_t over 40 steps (hidden 16), y = readout(h_40). W_hh starts at 0.5 I + noise (spectral
radius 0.67) and is a plain nn.Parameter - no stable (e.g. exp(-exp(nu))) eigenvalue
parametrisation, no gradient clipping. Task: two noisy input channels, target = their
discounted sums (decay 0.97), the second subtracted. Plain SGD lr 5e-4, batch 64, up to 400
steps; the loop stops at the first nonfinite loss.

Mechanism: fitting a long-memory target pushes the recurrence's spectral radius up; the
gradient through 40 steps scales like rho^40, and the curvature with it, so as rho climbs the
fixed learning rate becomes too large: each update pushes rho further, the weight_hh gradient
grows geometrically, rho crosses 1 and the hidden state (and the loss) blow up.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Steps 0-59: grad norm median 5.7 (20-59), weight_hh's gradient 2-4.5 of it; loss ~14-25
  (median 17-20, not improving); spectral radius 0.66.
- Growth: 20-step grad medians 7.4 (60-79), 8.7 (80-99), 13.9 (100-119), 34 (120-127);
  spectral radius 0.675 (80), 0.717 (100), 0.855 (120), 0.954 (125), 1.075 (127), 8.6 (128).
  The rise is gradual from ~80-100 (x1.5 by 90, x2 by ~105, x3 for good from 117) and then
  geometric: 27 (120), 34 (122), 67 (125), 80 (126), 154 (127), 2.0e4 (128). weight_hh's
  gradient is most of the total throughout the rise (11/14 at 110, 151/154 at 127).
- Loss: stays ~14-24 until 122, dips to 8-17 at 123-127, then 275 at 128 and inf at 129
  (grad NaN); the loop stops there: 130 steps recorded.
- The growth starts at ~100 (gradual: the smoothed log norm leaves its 0-80 band between
  ~85 and ~110) and is led by weight_hh.
- About 5 s alone (11 s with a second run beside it on the 2 cores).
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 100, "tolerance": 15,
                        "subject": "weight_hh"}]}

STEPS, BATCH, LENGTH, HIDDEN, LR, DECAY = 400, 64, 40, 16, 5e-4, 0.97


class LinearRNN(nn.Module):
    """h_t = W_hh h_{t-1} + W_ih x_t, y = readout(h_T): a linear recurrent layer with its
    transition matrix left unconstrained (no eigenvalue parametrisation, no clipping)."""

    def __init__(self):
        super().__init__()
        self.weight_ih = nn.Parameter(torch.randn(HIDDEN, 2) * 0.3)
        self.weight_hh = nn.Parameter(torch.eye(HIDDEN) * 0.5 + torch.randn(HIDDEN, HIDDEN) * 0.05)
        self.readout = nn.Linear(HIDDEN, 1)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], HIDDEN)
        for t in range(x.shape[1]):
            h = h @ self.weight_hh.T + x[:, t] @ self.weight_ih.T
        return self.readout(h)


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
    g = torch.Generator().manual_seed(2)
    model = LinearRNN()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    w = DECAY ** torch.arange(LENGTH - 1, -1, -1).float()
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            # two input channels; target: their discounted sums, the second one subtracted
            x = torch.randn(BATCH, LENGTH, 2, generator=g)
            y = ((x[:, :, 0] - 0.5 * x[:, :, 1]) * w).sum(1, keepdim=True)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            g_hh = float(model.weight_hh.grad.norm())
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 20 == 0 or step >= 90:
                with torch.no_grad():
                    rho = (float(torch.linalg.eigvals(model.weight_hh).abs().max())
                           if torch.isfinite(model.weight_hh).all() else math.nan)
                print(f"step {step} loss {loss.item():.4g} grad_norm {gn:.4g} "
                      f"weight_hh_grad {g_hh:.4g} spectral_radius {rho:.4f}", flush=True)
            if not math.isfinite(loss.item()):
                print(f"loss is {loss.item()} at step {step}: stopping", flush=True)
                break
    growth_facts(rows, (20, 60))


if __name__ == "__main__":
    main()
