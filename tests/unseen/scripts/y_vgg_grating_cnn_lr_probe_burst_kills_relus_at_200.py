"""Small VGG-style CNN (conv3x3 1->16, ReLU, maxpool, conv3x3 16->32, ReLU, maxpool,
Linear 512->64, ReLU, Linear 64->4) classifying noisy oriented sine gratings (16x16, four
orientations, random frequency and phase, Gaussian pixel noise sigma 2.5, fresh batch of 32
a step). SGD momentum 0.9, lr 0.02, one parameter group per layer, gradients clipped to
total norm 1.0, 400 steps.

The bug: a per-layer learning-rate range test ("LR probe") used while tuning was left in the
loop. At the epoch boundary (step 200) it sets the `conv2` group's lr to the end of its
range, 60.0 (3000x the 0.02 base), for one optimizer step, then restores 0.02. That one huge
(clipped-gradient) update kills a third of conv2's channels at once and drives the rest to
huge activations; while the clipped updates bring the loss back down, the fc1 ReLUs die one
after another until none is left, and from then on no gradient reaches conv1, conv2 or fc1.
Dead units, not a large negative initial bias: the units die from the update.

What is TRUE of the run (measured by this script with plain torch: dead = a unit/channel
whose ReLU output is 0 for all 512 inputs of a fixed probe batch, after the step):
- Steps 0-199 train normally: loss 1.38 at step 0, ~1.37 until ~125, mean 0.78 over steps
  150-199 (0.41 at 199); probe accuracy 0.75 at 199 (chance 0.25). Dead before the burst:
  conv1 0/16 channels throughout, conv2 at most 1/32 (0.03), fc1 at most 0.36 (a transient
  around step 25, back to 0.06 by step 198). Total grad norm before clipping 0.36-9.
- Step 200 runs with lr 60 on conv2. After its update (the first forward to see it is step
  201): conv2 38% of channels dead (12/32, and they stay dead to the end), fc1 61% dead;
  probe accuracy 0.26. Step 201 loss 1331 (grad norm before clipping 2.7e3); the loss then
  falls under the clipped updates: 1096, 976, ..., 98 at 212, 11 at 214, 1.57 at 220.
- fc1 dies progressively: >= 90% dead at step 220, 100% dead (64/64) from step 227 to the end.
- From step 227 to 399 (173 steps) the gradients of conv1, conv2 and fc1 (weights and
  biases) are exactly 0 at every step; only head.bias learns (head grad norm <= 0.33). Loss
  mean over steps 250-399 1.3878 = ln 4 (1.3863); probe accuracy 0.244-0.260 (chance).
- The dead-unit onset spans step 201 (a third of conv2 and most of fc1 dead at once) to step
  227 (every fc1 unit dead, gradients gone); EXPECT accepts a date in 192..228. A loss spike
  at step 201 is part of the same event.
- About 15 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "dead_activation", "first_step": 210, "tolerance": 18}]}

STEPS, BATCH, K, BASE_LR = 400, 32, 4, 0.02
PROBE_STEP, PROBE_LAYER, PROBE_LR = 200, "conv2", 60.0
CLIP = 1.0


def gratings(n, g, grid):
    """Oriented sine gratings: class = orientation (0, 90, 45, 135 degrees)."""
    yy, xx = grid
    y = torch.randint(0, K, (n,), generator=g)
    ph = torch.rand(n, 1, 1, generator=g) * 2 * math.pi
    f = 0.6 + 0.4 * torch.rand(n, 1, 1, generator=g)
    pats = [torch.sin(f * xx + ph), torch.sin(f * yy + ph),
            torch.sin(f * (xx + yy) / math.sqrt(2) + ph),
            torch.sin(f * (xx - yy) / math.sqrt(2) + ph)]
    x = torch.stack(pats, 1)[torch.arange(n), y]
    return (x + 2.5 * torch.randn(n, 16, 16, generator=g)).unsqueeze(1), y


class VGGish(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.head = nn.Linear(64, K)

    def forward(self, x, keep=False):
        c1 = F.relu(self.conv1(x))
        c2 = F.relu(self.conv2(F.max_pool2d(c1, 2)))
        a = F.relu(self.fc1(F.max_pool2d(c2, 2).flatten(1)))
        if keep:   # per-channel / per-unit "ever active" over the batch (and positions)
            self.alive = [(c1 > 0).any(0).any(-1).any(-1), (c2 > 0).any(0).any(-1).any(-1),
                          (a > 0).any(0)]
        return self.head(a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    grid = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    model = VGGish()
    groups = [{"params": list(m.parameters()), "name": n} for n, m in model.named_children()]
    opt = torch.optim.SGD(groups, lr=BASE_LR, momentum=0.9)
    xp, yp = gratings(512, torch.Generator().manual_seed(77), grid)
    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            for grp in opt.param_groups:   # leftover LR probe: one step, one layer
                probe = step == PROBE_STEP and grp["name"] == PROBE_LAYER
                grp["lr"] = PROBE_LR if probe else BASE_LR
            x, y = gratings(BATCH, g, grid)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
            gn = {n: torch.sqrt(sum(p.grad.pow(2).sum() for p in m.parameters())).item()
                  for n, m in model.named_children()}
            opt.step()
            rec.step(loss=loss, lr=BASE_LR)
            with torch.no_grad():
                acc = (model(xp, keep=True).argmax(1) == yp).float().mean().item()
            dead = [1 - a.float().mean().item() for a in model.alive]
            trace.append((step, loss.item(), gn, dead, acc, total))
            if step % 25 == 0 or PROBE_STEP - 2 <= step <= PROBE_STEP + 22 or step in (230, 240):
                grads = " ".join(f"{n} {v:.2e}" for n, v in gn.items())
                print(f"step {step} loss {loss.item():.4g} probe_acc {acc:.3f} dead "
                      f"conv1/conv2/fc1 {dead[0]:.2f}/{dead[1]:.2f}/{dead[2]:.2f} grad {grads} "
                      f"(total before clip {total:.3g})", flush=True)
    pre = [t for t in trace if t[0] < PROBE_STEP]
    print(f"[pre] max dead conv1/conv2/fc1 over steps 0-{PROBE_STEP - 1}: "
          f"{max(t[3][0] for t in pre):.2f}/{max(t[3][1] for t in pre):.2f}/"
          f"{max(t[3][2] for t in pre):.2f}; loss mean 150-199 "
          f"{sum(t[1] for t in pre[150:]) / 50:.3f}; probe acc at 199 {pre[-1][4]:.3f}")
    zero = [t[0] for t in trace if all(t[2][n] == 0 for n in ("conv1", "conv2"))]
    first_zero_for_good = next(s for s in range(STEPS) if all(
        trace[u][2]["conv1"] == 0 and trace[u][2]["conv2"] == 0 for u in range(s, STEPS)))
    print(f"[zero] steps with conv1/conv2 gradients exactly 0: {len(zero)}, first {zero[:3]}; "
          f"zero for good from step {first_zero_for_good}")
    for thr in (0.5, 0.9, 1.0):
        for i in (1, 2):
            s = next((t[0] for t in trace if t[0] > PROBE_STEP and t[3][i] >= thr), None)
            print(f"[dead] {['conv1', 'conv2', 'fc1'][i]} first >= {thr:.0%} dead at step {s}")
    post = [t for t in trace if t[0] >= 250]
    print(f"[post] steps 250-399: loss mean {sum(t[1] for t in post) / len(post):.4f} "
          f"(ln 4 = {math.log(4):.4f}); head grad max {max(t[2]['head'] for t in post):.3g}; "
          f"probe acc {min(t[4] for t in post):.3f}..{max(t[4] for t in post):.3f}; fc1 dead "
          f"{min(t[3][2] for t in post):.2f}..{max(t[3][2] for t in post):.2f}, conv2 dead "
          f"{min(t[3][1] for t in post):.2f}..{max(t[3][1] for t in post):.2f}")


if __name__ == "__main__":
    main()
