"""Capsule network with dynamic routing (Sabour et al. 2017, scaled down) on 20x20 glyph
images of 6 classes (horizontal bar, vertical bar, diagonal, cross, hollow box, ring), each
randomly shifted by up to 3 pixels, stroke intensity 0.6-1.0, Gaussian noise 0.3. Conv 9x9
1->32 + ReLU, primary capsules (conv 5x5 stride 2 -> 8 types x 8-D on a 4x4 grid = 128
capsules, squash), 3 routing iterations to 6 class capsules of 16-D (squash); the class
logits are 8 x capsule length, trained with cross-entropy. Adam (lr 1e-3), batch 32, 400
steps, one epoch over a 12,800-record map-style Dataset read through a shuffled DataLoader
wrapped by rec.wrap_loader (every record is seen once).

The bug: the dataset class shuffles its records once at construction, and applies one
permutation to the images and a *different* one to the labels (`self.labels =
labels[torch.randperm(n)]` where it meant `labels[perm]`). Every image
therefore carries the label of some other, random image: the labels are independent of the
inputs, so nothing can be learned and the loss sits at chance, ln 6 = 1.7918, from the start.
(Measured once with the fix, ALIGNED_LABELS = True, same seeds: loss means per 50 steps 1.50,
0.61, 0.37, 0.24, 0.18, 0.14, 0.12, 0.098, batch accuracy 0.99 by the end — the model and the
optimizer are fine; only the labels are broken.)

What is TRUE of the run (measured by this script with plain torch, printed below):
- Labels equal to the image's true class for 16.67% of the records (= 1/6, chance).
- Loss 1.7915 at step 0 (ln 6 = 1.7918) and never leaves ln 6: means per 50-step window
  1.7933, 1.7926, 1.7919, 1.7912, 1.7918, 1.7918, 1.7918, 1.7918; per-step range
  1.752-1.867 over steps 0-49, 1.7885-1.7974 over 200-249, 1.7913-1.7922 over 350-399.
  Batch accuracy 0.15-0.18 per window (chance 0.167). All finite.
- Gradient norm 0.035 at step 0, window medians 0.077, 0.081, then 0.018, 0.028, 0.010,
  0.013, 0.012, 0.008 (the model learns to output the class prior and nothing else).
- Root cause: a chance-level loss plateau from step 0 to the end (labels independent of the
  inputs). No NaN, no spike, no explosion.
- About 15 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "loss_plateau", "first_step": 0, "tolerance": 20, "top": True}]}

N, STEPS, BATCH, K, SIZE = 12_800, 400, 32, 6, 20
ALIGNED_LABELS = False          # True = the fix (same permutation for images and labels)


def glyph(c, g):
    """One 20x20 glyph of class c, shifted by up to 3 px, with noise."""
    img = torch.zeros(SIZE, SIZE)
    a, b = 6, 14
    v = 0.6 + 0.4 * torch.rand(1, generator=g).item()
    if c == 0:
        img[9:11, a:b] = v
    elif c == 1:
        img[a:b, 9:11] = v
    elif c == 2:
        for i in range(a, b):
            img[i, i] = img[i, min(i + 1, SIZE - 1)] = v
    elif c == 3:
        img[9:11, a:b] = v
        img[a:b, 9:11] = v
    elif c == 4:
        img[a, a:b] = img[b - 1, a:b] = img[a:b, a] = img[a:b, b - 1] = v
    else:
        yy, xx = torch.meshgrid(torch.arange(SIZE.__float__()), torch.arange(SIZE.__float__()),
                                indexing="ij")
        r = ((yy - 9.5) ** 2 + (xx - 9.5) ** 2).sqrt()
        img[(r > 3.2) & (r < 4.6)] = v
    dy, dx = torch.randint(-3, 4, (2,), generator=g).tolist()
    img = torch.roll(img, (dy, dx), (0, 1))
    return img + 0.3 * torch.randn(SIZE, SIZE, generator=g)


class GlyphRecords(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        labels = torch.arange(n) % K
        images = torch.stack([glyph(int(c), g) for c in labels]).unsqueeze(1)
        perm = torch.randperm(n, generator=g)
        self.images, self.true_classes = images[perm], labels[perm]
        # BUG: a second, independent permutation for the labels
        self.labels = labels[perm] if ALIGNED_LABELS else labels[torch.randperm(n, generator=g)]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def squash(s, dim=-1):
    n2 = (s * s).sum(dim, keepdim=True)
    return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)


class CapsNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 32, 9)                        # 20 -> 12
        self.primary = nn.Conv2d(32, 8 * 8, 5, stride=2)       # 12 -> 4, 8 types x 8-D
        self.W = nn.Parameter(0.05 * torch.randn(1, 128, K, 16, 8))
        self.iters = 3

    def forward(self, x):
        b = x.shape[0]
        h = F.relu(self.conv(x))
        u = self.primary(h).view(b, 8, 8, 4, 4).permute(0, 1, 3, 4, 2).reshape(b, 128, 8)
        u = squash(u)
        u_hat = (self.W @ u[:, :, None, :, None]).squeeze(-1)  # (b, 128, K, 16)
        logits_r = torch.zeros(b, 128, K)
        for it in range(self.iters):
            c = logits_r.softmax(2)
            v = squash((c.unsqueeze(-1) * u_hat).sum(1))       # (b, K, 16)
            if it < self.iters - 1:
                logits_r = logits_r + (u_hat * v.unsqueeze(1)).sum(-1)
        return 8.0 * v.norm(dim=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = GlyphRecords(N, seed=11)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(5))
    model = CapsNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step, (x, y) in enumerate(rec.wrap_loader(loader)):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item()
            opt.step()
            rec.step(loss=loss)
            acc = (logits.argmax(1) == y).float().mean().item()
            rows.append((step, loss.item(), gn, acc))
            if step % 25 == 0 or step < 5:
                print(f"step {step} loss {loss.item():.4f} (ln {K} = {math.log(K):.4f}) "
                      f"grad_norm {gn:.4g} batch_acc {acc:.3f}", flush=True)
    for a in range(0, STEPS, 50):
        part = rows[a:a + 50]
        print(f"[win] steps {a}-{a + 49}: loss mean {sum(r[1] for r in part) / 50:.4f} "
              f"min {min(r[1] for r in part):.4f} max {max(r[1] for r in part):.4f}; grad norm "
              f"median {sorted(r[2] for r in part)[25]:.4g}; batch acc mean "
              f"{sum(r[3] for r in part) / 50:.3f}")
    print(f"[all] loss mean over steps 0-399 {sum(r[1] for r in rows) / len(rows):.4f}; "
          f"labels equal to the images' true classes: "
          f"{(ds.labels == ds.true_classes).float().mean().item():.4f} (1/{K} = {1 / K:.4f})")


if __name__ == "__main__":
    main()
