"""ResNet-style CNN (stem conv 16 + BN, three residual blocks 16 -> 32 (stride 2) -> 32, each
two 3x3 conv + BatchNorm with a 1x1 projection shortcut where the shape changes, global
average pool, linear head) classifying synthetic 16x16 images into 6 classes of noisy
sinusoidal gratings: orientation 0 / 0.5 / 1.0 rad x spatial frequency 0.9 / 1.3, jittered
(sd 0.15 rad, 0.08), random phase, additive Gaussian noise sd 2.0 on a signal of amplitude 1.
Fresh batch of 48 every step, cross entropy. SGD (momentum 0.9, Nesterov, weight decay 5e-4),
no clipping, 400 steps. Schedule: OneCycleLR(max_lr=0.4, pct_start=0.3): lr 0.016 at step 0,
rising (cosine) to 0.4 at step 119, then annealing to ~4e-6 at step 399.

What happens: the textbook one-cycle shape. The loss falls fast while the lr is still small
(steps 0-50), then sits on a noisy high-lr plateau (~0.44) around the lr peak, and falls
again as the lr anneals (to ~0.29). The gradient norm is largest early (up to 2.1 in the
first 50 steps) and shrinks through the run. One noisy batch at 249-250 (loss 0.58, 0.93,
grad 1.13) during the high-lr phase, gone the next step. HEALTHY.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Loss 1.87 at step 0 (ln 6 = 1.79); 25-step medians 1.76 (0-24), 0.573 (25-49), 0.443
  (50-74), 0.44 +- 0.01 over 75-174 (lr 0.28-0.40), 0.387 (175-199), 0.353 (200-224), 0.346
  (275-299), 0.302 (325-349), 0.294 (375-399); last-20 median 0.282. Accuracy 0.31 (0-24) ->
  0.85 (125-174) -> 0.887 (375-399).
- Grad norm 25-step medians 1.07, 1.31, 0.90, 0.71, 0.59, 0.57, 0.54, 0.57, 0.41, 0.46,
  0.47, 0.44, 0.45, 0.38, 0.40, 0.39; max of the run 2.13 at step 40.
- Largest single-step ratio to the previous 20 steps' median: grad x2.41 and loss x2.46,
  both at step 250 (loss 0.273, 0.576, 0.927, 0.437, 0.292 at 248-252; grad 0.35, 0.53,
  1.13, 0.57, 0.27).
- No NaN/Inf. About 8 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [],
          "forbidden": ["gradient_explosion", "loss_divergence", "nonfinite"]}

STEPS, BATCH, SIZE, CLASSES = 400, 48, 16, 6
MAX_LR = 0.4


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Identity() if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout)))

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(h)) + self.skip(x))


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1))
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


def grating_batch(g):
    """Six classes of noisy sinusoidal gratings: (orientation, spatial frequency) pairs that
    differ little, random phase, additive noise sd 2.0 (signal amplitude 1)."""
    specs = torch.tensor([[0.0, 0.9], [0.0, 1.3], [0.5, 0.9], [0.5, 1.3], [1.0, 0.9],
                          [1.0, 1.3]])
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    theta = specs[y, 0] + 0.15 * torch.randn(BATCH, generator=g)
    freq = specs[y, 1] + 0.08 * torch.randn(BATCH, generator=g)
    phase = 2 * math.pi * torch.rand(BATCH, generator=g)
    r = torch.arange(SIZE, dtype=torch.float32)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    proj = (xx[None] * torch.cos(theta)[:, None, None] + yy[None] * torch.sin(theta)[:, None, None])
    img = torch.sin(freq[:, None, None] * proj + phase[:, None, None])
    img = img + 2.0 * torch.randn(BATCH, SIZE, SIZE, generator=g)
    return img[:, None], y


def facts(rows):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    acc = [r[2] for r in rows]
    lr = [r[3] for r in rows]
    print(f"[all] nonfinite {sum(not math.isfinite(v) for v in loss + gn)}; "
          f"loss step 0 {loss[0]:.4g}, last 20 median {med(loss[-20:]):.4g}; peak lr at step "
          f"{max(range(len(lr)), key=lr.__getitem__)}; max grad {max(gn):.4g} at "
          f"{max(range(len(gn)), key=gn.__getitem__)}")
    worst = max(range(20, len(gn)), key=lambda i: gn[i] / med(gn[i - 20:i]))
    print(f"[grad] largest ratio to previous-20 median: {gn[worst] / med(gn[worst - 20:worst]):.3g}"
          f" at {worst}")
    worstl = max(range(20, len(loss)), key=lambda i: loss[i] / med(loss[i - 20:i]))
    print(f"[loss] largest ratio to previous-20 median: "
          f"{loss[worstl] / med(loss[worstl - 20:worstl]):.3g} at {worstl}")
    for a in range(0, len(rows), 25):
        print(f"[win] {a}-{a + 24}: lr {lr[a]:.4g} loss {med(loss[a:a + 25]):.4g} "
              f"acc {statistics.mean(acc[a:a + 25]):.3f} grad {med(gn[a:a + 25]):.4g} "
              f"max grad {max(gn[a:a + 25]):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    model = TinyResNet()
    opt = torch.optim.SGD(model.parameters(), lr=MAX_LR / 25, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=MAX_LR, total_steps=STEPS,
                                                pct_start=0.3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = grating_batch(g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            acc = (logits.argmax(1) == y).float().mean().item()
            rec.step(loss=loss, acc=acc)
            rows.append((loss.item(), gn, acc, lr))
            if step % 50 == 0 or 246 <= step <= 254:
                print(f"step {step} lr {lr:.4f} loss {loss.item():.4f} grad_norm {gn:.4g}",
                      flush=True)
    facts(rows)


if __name__ == "__main__":
    main()
