"""Healthy: small CNN on 14x14 synthetic glyphs with 15% of the training labels wrong,
batch size 6, SGD + momentum with a step LR decay.

What it does: four glyph classes (horizontal bar, vertical bar, diagonal, hollow square) drawn
at a random position and thickness on a 14x14 canvas with Gaussian pixel noise (std 0.25).
A fixed pool of 3,600 training images; 15% of them carry a wrong label (uniform over the
other three classes), fixed per image, as in a crowd-labelled set. 600 steps of batch 6 drawn
from a shuffled pass over the pool (exactly one epoch: no image is seen twice, so the noisy
labels cannot be memorised). Conv(1-16, 3)-ReLU-MaxPool-Conv(16-32, 3)-ReLU-MaxPool-Linear
(128-4); cross-entropy; SGD(lr 0.02, momentum 0.9); StepLR x0.3 at step 420. Once the net
is confident, a batch of 6 with two to four wrong labels costs 2-3 nats while a clean batch
costs ~0.2: the per-batch loss has a heavy right tail from the labels alone. Clean-label
accuracy on 1,000 held-out glyphs is printed every 100 steps.

What is TRUE of the run (measured; printed at the end):
- Per-batch cross-entropy, 60-step window medians: 1.352, 0.983, 0.821, 0.633, 0.724,
  0.691, 0.532, 0.528, 0.566, 0.598 (the median falls 56%; the floor is set by the 15% wrong
  labels); window means 1.346 -> 0.628.
- Clean held-out accuracy: 0.869 (step 99), 0.958 (199), 0.933 (299), 0.986 (399), 0.989
  (499), 0.994 (599).
- The spread is the labels: from step 250 on, batches with no wrong label have median loss
  0.228 (134 batches), one wrong label 0.724 (144), two 1.145 (55). The largest losses after
  step 50 are step 289 (3.22; 4 of its 6 labels wrong), 184 (2.44; 2 wrong), 446 (2.30; 3),
  207 (2.25; 2), 292 (2.13; 3), 461 (2.11; 3); the next batch is ordinary each time
  (289 -> 0.34, 184 -> 0.19, 446 -> 0.80). Max of the whole run 3.22. No NaN/Inf.
- Gradient norm: median 1.33, max 5.82 (step 289, the 4-wrong-labels batch).
- LR 0.02 for steps 0-419, 0.006 from step 420.
- Healthy: single-batch jumps of 2-5x the median come from mislabelled images in a batch
  of 6; clean accuracy rises from 0.87 to 0.99 (one dip, 0.958 -> 0.933 at step 299).
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, SIZE, CLASSES, NOISE = 600, 6, 14, 4, 0.15


def glyphs(n, gen):
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    img = torch.zeros(n, SIZE, SIZE)
    r = torch.arange(SIZE)
    for i in range(n):
        t = int(torch.randint(1, 3, (1,), generator=gen))
        a, b = (int(v) for v in torch.randint(2, SIZE - 4, (2,), generator=gen))
        c = int(y[i])
        if c == 0:
            img[i, a:a + t, 1:SIZE - 1] = 1
        elif c == 1:
            img[i, 1:SIZE - 1, b:b + t] = 1
        elif c == 2:
            d = (r[:, None] - r[None, :] - (a - b)).abs() < t
            img[i][d] = 1
        else:
            s = 6
            a, b = min(a, SIZE - s - 1), min(b, SIZE - s - 1)
            img[i, a:a + s, b:b + s] = 1
            img[i, a + t:a + s - t, b + t:b + s - t] = 0
    img = img + 0.25 * torch.randn(n, SIZE, SIZE, generator=gen)
    return img.unsqueeze(1), y


def report(losses, gnorms, lrs, k=10):
    n = len(losses) // k
    med = [round(sorted(losses[i * n:(i + 1) * n])[n // 2], 3) for i in range(k)]
    mean = [round(sum(losses[i * n:(i + 1) * n]) / n, 3) for i in range(k)]
    print("WINDOW_MEDIANS", med)
    print("WINDOW_MEANS", mean)
    mx = [max(range(i * n, (i + 1) * n), key=lambda j: losses[j]) for i in range(k)]
    print("WINDOW_MAX (step, loss)", [(j, round(losses[j], 2)) for j in mx])
    top = sorted(range(len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES (step, loss, next 3)",
          [(i, round(losses[i], 2), [round(v, 2) for v in losses[i + 1:i + 4]]) for i in top])
    late = sorted(range(50, len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES from step 50",
          [(i, round(losses[i], 2), [round(v, 2) for v in losses[i + 1:i + 4]]) for i in late])
    g = sorted(gnorms)
    print("GNORM median", round(g[len(g) // 2], 3), "max", round(g[-1], 3),
          "at", gnorms.index(g[-1]), "nonfinite", sum(not math.isfinite(v) for v in losses))
    print("LR changes", [(i, lr) for i, lr in enumerate(lrs) if i == 0 or lrs[i - 1] != lr])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5)
    x_pool, y_clean = glyphs(STEPS * BATCH, gen)
    flip = torch.rand(len(y_clean), generator=gen) < NOISE
    shift = torch.randint(1, CLASSES, (len(y_clean),), generator=gen)
    y_pool = torch.where(flip, (y_clean + shift) % CLASSES, y_clean)
    xv, yv = glyphs(1000, gen)
    order = torch.randperm(len(y_pool), generator=gen)
    model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 2 * 2, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=420, gamma=0.3)
    losses, gnorms, lrs, nflip = [], [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            idx = order[step * BATCH:(step + 1) * BATCH]
            loss = nn.functional.cross_entropy(model(x_pool[idx]), y_pool[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in model.parameters()]))
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn.item())
            lrs.append(opt.param_groups[0]["lr"])
            nflip.append(int(flip[idx].sum()))
            sched.step()
            if (step + 1) % 100 == 0:
                with torch.no_grad():
                    acc = (model(xv).argmax(1) == yv).float().mean().item()
                print(step, "clean_val_acc", round(acc, 3))
    report(losses, gnorms, lrs)
    top = sorted(range(50, STEPS), key=lambda i: -losses[i])[:6]
    print("top-loss steps from 50: wrong labels in the batch", [(i, nflip[i]) for i in top])
    late = range(250, STEPS)
    for k in range(3):
        v = sorted(losses[i] for i in late if nflip[i] == k)
        if v:
            print(f"steps 250+ with {k} wrong labels: n={len(v)} median {v[len(v) // 2]:.3f}")


if __name__ == "__main__":
    main()
