"""Deep plain MLP at too high a learning rate: 8 linear layers (20 -> 128 x 7 -> 8) with GELU
between them, no normalisation and no residual path, He-initialised, output layer
zero-initialised. Regression on 8000 rows (targets 2 tanh(x @ W / 4) + noise), SGD lr 0.3
with momentum 0.9, batch 128, 300 steps, no clipping. (At lr 0.2 the same run trains fine:
loss 1.7 -> 0.04.)

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Steps 0-8: loss 1.74, 2.24, 1.65, 1.81, 1.72, 1.60, 1.62, 1.59, 1.44; grad norm 1.33, 6.30
  (step 1, the first momentum step on a zero output layer), 0.51, 1.42, 0.88, 0.61, 1.90,
  1.65, 0.98 (median of 1-5: 0.88).
- From step 9 the gradient grows, oscillating, with the loss: grad 5.2 (9), 3.0, 17.7, 3.9,
  40.5, 7.0, 52.8, 21.2 (10-16), 1159 (17), 2.2e12 (18); loss 1.88 (9), 3.4 (11), 7.1 (13),
  8.3 (15), 170 (17), 4.1e11 (18); NaN from step 19 to the end (281 nonfinite steps; the
  loop keeps going).
- Onset: step 9 (sharp; x6 the early median, above 3x it for good from 9).
- About 5 s alone (11 s with a second run beside it on the 2 cores).
"""

import argparse
import itertools
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 9, "tolerance": 3}]}

STEPS, BATCH, FEAT, WIDTH, OUT, DEPTH, LR = 300, 128, 20, 128, 8, 8, 0.3


def make_data(g, n=8000):
    w = torch.randn(FEAT, OUT, generator=g)
    x = torch.randn(n, FEAT, generator=g)
    return x, torch.tanh(x @ w / 4) * 2 + 0.1 * torch.randn(n, OUT, generator=g)


class PlainDeepMLP(nn.Module):
    """DEPTH linear layers with GELU between them: no normalisation, no residual path."""

    def __init__(self):
        super().__init__()
        dims = [FEAT] + [WIDTH] * (DEPTH - 1) + [OUT]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(dims))
        for lin in self.layers:
            nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
            nn.init.zeros_(lin.bias)
        nn.init.zeros_(self.layers[-1].weight)          # the output starts at zero

    def forward(self, x):
        for lin in self.layers[:-1]:
            x = F.gelu(lin(x))
        return self.layers[-1](x)


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
    xs, ys = make_data(g)
    model = PlainDeepMLP()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            idx = torch.randint(0, len(xs), (BATCH,), generator=g)
            loss = F.mse_loss(model(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step < 40 or step % 20 == 0:
                print(f"step {step} loss {loss.item():.4g} grad_norm {gn:.4g}", flush=True)
    growth_facts(rows, (1, 6))


if __name__ == "__main__":
    main()
