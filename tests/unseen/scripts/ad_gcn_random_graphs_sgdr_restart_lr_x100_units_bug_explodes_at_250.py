"""Graph convolutional network (three dense GCN layers H' = relu(A_hat H W), 8 -> 32 -> 32 -> 1,
no normalisation layers) doing node regression on random graphs: every step a fresh batch of
16 Erdos-Renyi graphs (24 nodes, edge probability 0.15, self-loops, symmetric normalisation
D^-1/2 (A + I) D^-1/2), node features N(0, 1), target per node a two-hop smoothed nonlinear
function of the features, A_hat tanh(A_hat X W1) W2, plus noise sd 0.05. MSE. SGD (momentum
0.9), no clipping, 500 steps.

Schedule and the bug: SGDR-style cosine from 0.05 to 0.001 over steps 0-249, then a warm
restart at step 250. The restart is meant to go back to 0.05, but its value was read from a
config in the wrong units, x100: lr 5.0 at step 250, decaying by cosine from there. The first
cycle is a normal, healthy run. At lr 5.0 the update is far past the stability limit: the
gradient that the step-250 update produces (step 251) is x23 the one before, and from there
gradient and loss grow by one to several orders of magnitude per step until they overflow
at 255; every later step is NaN (the loop keeps running, as an unattended job would).

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Steps 0-249 (lr 0.05 -> 0.001): loss 0.60 at step 0; 25-step medians 0.588 (0-24), 0.118
  (25-49), 0.068, 0.062, 0.056, 0.058, 0.057, 0.060, 0.058, 0.061 (225-249). Grad norm
  25-step medians 0.37, 0.70, 0.24, 0.24, 0.27, 0.16, 0.14, 0.098, 0.081, 0.090; median
  0.0903 over 220-249; largest before the restart 2.06 (in 25-49).
- Step 250 (first step at lr 5.0; its gradient is still the old kind): loss 0.064, grad
  0.092.
- Growth: step 251 loss 0.683 / grad 2.12 (x23 the previous step); 252: 203 / 194 (x91);
  253: 1.6e4 / 1.29e4; 254: 1.0e21 / 5.6e18; 255: loss 1.5e24, grad norm inf (first
  nonfinite value); 256 onwards: loss and grad NaN, to the end (245 nonfinite steps).
- Onset: the gradient is above 3x the 220-249 median for good from step 251; the first step
  run at the bad lr is 250. About 3.5 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 251, "tolerance": 1},
                       {"id": "nonfinite", "first_step": 255, "tolerance": 1}]}

STEPS, GRAPHS, NODES, FEAT, HID = 500, 16, 24, 8, 32
CYCLE, LR_MAX, LR_MIN = 250, 0.05, 0.001
RESTART_LR = 5.0                          # meant: LR_MAX (0.05) again


class GCN(nn.Module):
    """Three graph-convolution layers H' = act(A_hat H W) on dense normalised adjacency."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(FEAT, HID)
        self.l2 = nn.Linear(HID, HID)
        self.l3 = nn.Linear(HID, 1)

    def forward(self, a, x):
        h = torch.relu(a @ self.l1(x))
        h = torch.relu(a @ self.l2(h))
        return (a @ self.l3(h)).squeeze(-1)


def graph_batch(w, g):
    """16 Erdos-Renyi graphs of 24 nodes (edge probability 0.15) with self-loops, symmetric
    normalisation D^-1/2 (A + I) D^-1/2. Node features N(0, 1); the target of each node is
    a two-hop smoothed nonlinear function of the features: A_hat tanh(A_hat X w1) w2, plus
    noise sd 0.05."""
    upper = torch.triu((torch.rand(GRAPHS, NODES, NODES, generator=g) < 0.15).float(), 1)
    adj = upper + upper.transpose(1, 2) + torch.eye(NODES)
    d = adj.sum(2).rsqrt()
    a = d[:, :, None] * adj * d[:, None, :]
    x = torch.randn(GRAPHS, NODES, FEAT, generator=g)
    y = (a @ torch.tanh(a @ x @ w[0]) @ w[1]).squeeze(-1)
    return a, x, y + 0.05 * torch.randn(GRAPHS, NODES, generator=g)


def lr_at(step):
    """Cosine from LR_MAX to LR_MIN over each 250-step cycle; the warm restart is meant to go
    back to LR_MAX, but the restart value was read from a config in the wrong units (x100)."""
    cycle, t = divmod(step, CYCLE)
    top = LR_MAX if cycle == 0 else RESTART_LR
    return LR_MIN + 0.5 * (top - LR_MIN) * (1 + math.cos(math.pi * t / CYCLE))


def facts(rows):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    bad = [i for i in range(len(rows)) if not (math.isfinite(loss[i]) and math.isfinite(gn[i]))]
    first_bad = bad[0] if bad else None
    end = first_bad if first_bad is not None else len(rows)
    base = med(gn[CYCLE - 30:CYCLE])
    print(f"[all] nonfinite steps {len(bad)}, first {first_bad}; loss step 0 {loss[0]:.4g}; "
          f"grad baseline median {base:.4g} over {CYCLE - 30}-{CYCLE - 1}")
    above = next((i for i in range(CYCLE, end) if all(v > 3 * base for v in gn[i:end])), None)
    print(f"[grad] above 3x the baseline for good (until nonfinite) from step {above}")
    for i in range(CYCLE - 3, min(end + 3, len(rows))):
        print(f"  step {i}: loss {loss[i]:.4g} grad {gn[i]:.4g} ratio-to-previous "
              f"{gn[i] / gn[i - 1] if gn[i - 1] else float('nan'):.3g}")
    for a in range(0, CYCLE, 25):
        print(f"[win] {a}-{a + 24}: loss {med(loss[a:a + 25]):.4g} grad {med(gn[a:a + 25]):.4g}"
              f" max grad {max(gn[a:a + 25]):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(13)
    w = (torch.randn(FEAT, 16, generator=g) / math.sqrt(FEAT),
         torch.randn(16, 1, generator=g) / 2)
    model = GCN()
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            a, x, y = graph_batch(w, g)
            loss = F.mse_loss(model(a, x), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 50 == 0:
                print(f"step {step} lr {lr:.4g} loss {loss.item():.4g} grad_norm {gn:.4g}",
                      flush=True)
    facts(rows)


if __name__ == "__main__":
    main()
