"""Perceiver-style model (Jaegle et al. 2021, scaled down) classifying point sets: each input
is a set of 70 points with (x, y) in [-1, 1]^2 and a one-hot type (3 types); the class (4) is
the quadrant where an extra cluster of 6 type-0 points was placed among 64 uniform points.
Inputs: Linear over [x, y, type one-hot, Fourier features of (x, y) at 4 frequencies] -> 64.
16 learned latents (dim 64) cross-attend to the inputs (1 head, pre-LN, GELU MLP), then 2
latent self-attention blocks (4 heads); the cross-attention and the latent blocks are applied
a second time with shared weights (Perceiver's iterative attention); mean over latents,
LayerNorm, Linear 64 -> 4.

Data: 8,000 training and 800 held-out sets made once (seeded) in a TensorDataset, shuffled
DataLoader (batch 32, seeded) wrapped by rec.wrap_loader; 450 steps (1.8 epochs).

Loop: forward under torch.autocast("cpu", dtype=torch.bfloat16) (matmuls in bf16), loss in
float32 from the logits; AdamW (lr 5e-4, wd 0.01); StepLR (step_size 150, gamma 0.3:
lr 5e-4 -> 1.5e-4 at step 150 -> 4.5e-5 at step 300). Held-out accuracy printed every 150
steps (outside the recorded steps).

What is TRUE of the run (measured by this script with plain torch, printed below):
- Logits come out in bfloat16 (autocast active); loss and gradients float32.
- LR 5e-4 for steps 0-149, 1.5e-4 for 150-299, 4.5e-5 for 300-449.
- Loss (ln 4 = 1.386 at chance): 1.51 at step 0; 50-step window means 0.999, 0.510, 0.422,
  0.319, 0.269, 0.295, 0.271, 0.278, 0.238 (per-step range ~0.08-0.6 from step 150: the
  natural noise of batch 32 on a task with ~9% irreducible confusions); batch accuracy 0.57
  in the first window, 0.85 by 100-149, 0.90-0.92 at the end.
- Gradient norm 5.2 at step 0, window medians 4.4-6.9 throughout, max 23.6 (steps 100-149);
  no trend, no spike beyond the batch-to-batch spread. No NaN/Inf.
- Held-out accuracy 0.856 after step 149, 0.896 after 299, 0.910 after 449.
- Healthy: fast learning, then slow gains under the step decays; nothing to report.
- About 22 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, K, NPTS, EXTRA, DIM, LATENTS = 450, 32, 4, 64, 6, 64, 16


def point_sets(n, g):
    y = torch.randint(0, K, (n,), generator=g)
    xy = torch.rand(n, NPTS, 2, generator=g) * 2 - 1
    typ = torch.randint(0, 3, (n, NPTS), generator=g)
    sign = torch.stack([torch.where(y % 2 == 0, 1.0, -1.0), torch.where(y < 2, 1.0, -1.0)], 1)
    cl = (0.2 + 0.7 * torch.rand(n, EXTRA, 2, generator=g)) * sign[:, None, :]
    xy = torch.cat([xy, cl], 1)
    typ = torch.cat([typ, torch.zeros(n, EXTRA, dtype=torch.long)], 1)
    perm = torch.argsort(torch.rand(n, NPTS + EXTRA, generator=g), 1)
    xy = torch.gather(xy, 1, perm[..., None].expand(-1, -1, 2))
    typ = torch.gather(typ, 1, perm)
    freqs = torch.tensor([1.0, 2.0, 4.0, 8.0]) * math.pi
    ang = xy[..., None] * freqs                                   # (n, P, 2, 4)
    four = torch.cat([ang.sin(), ang.cos()], -1).flatten(2)       # (n, P, 16)
    feats = torch.cat([xy, F.one_hot(typ, 3).float(), four], -1)  # (n, P, 21)
    return feats, y


class Block(nn.Module):
    """Pre-LN attention block: queries attend to context (itself if context is None)."""

    def __init__(self, heads):
        super().__init__()
        self.lq, self.lkv, self.l2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, q, ctx=None):
        kv = self.lkv(q if ctx is None else ctx)
        q = q + self.attn(self.lq(q), kv, kv, need_weights=False)[0]
        return q + self.mlp(self.l2(q))


class Perceiver(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(21, DIM)
        self.latents = nn.Parameter(0.02 * torch.randn(LATENTS, DIM))
        self.cross = Block(1)
        self.latent_blocks = nn.ModuleList([Block(4), Block(4)])
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, K)

    def forward(self, x):
        ctx = self.inp(x)
        z = self.latents.expand(x.shape[0], -1, -1)
        for _ in range(2):                     # iterative attention, shared weights
            z = self.cross(z, ctx)
            for blk in self.latent_blocks:
                z = blk(z)
        return self.head(self.norm(z.mean(1)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(23)
    xtr, ytr = point_sets(8000, g)
    xva, yva = point_sets(800, g)
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(4))
    model = Perceiver()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=150, gamma=0.3)
    rows = []
    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        while step < STEPS:
            for x, y in rec.wrap_loader(loader):
                lr = opt.param_groups[0]["lr"]
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
                opt.zero_grad()
                loss.backward()
                gn = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in model.parameters())).item()
                opt.step()
                sched.step()
                rec.step(loss=loss, lr=lr)
                acc = (logits.argmax(1) == y).float().mean().item()
                rows.append((step, loss.item(), gn, lr, acc))
                if step % 25 == 0:
                    print(f"step {step} lr {lr:.2e} loss {loss.item():.4f} grad_norm {gn:.3g} "
                          f"logits dtype {logits.dtype}", flush=True)
                if (step + 1) % 150 == 0:
                    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                        va = (model(xva).argmax(1) == yva).float().mean().item()
                    print(f"[eval] after step {step}: held-out accuracy {va:.3f}", flush=True)
                step += 1
                if step >= STEPS:
                    break
    for a in range(0, STEPS, 50):
        part = rows[a:a + 50]
        print(f"[win] steps {a}-{a + 49}: lr {part[0][3]:.1e}; loss mean "
              f"{sum(r[1] for r in part) / 50:.4f} min {min(r[1] for r in part):.4f} max "
              f"{max(r[1] for r in part):.4f}; grad norm median "
              f"{sorted(r[2] for r in part)[25]:.3g}"
              f" max {max(r[2] for r in part):.3g}; batch acc {sum(r[4] for r in part) / 50:.3f}")
    print(f"[all] nonfinite losses {sum(not math.isfinite(r[1]) for r in rows)}; ln {K} = "
          f"{math.log(K):.4f}")


if __name__ == "__main__":
    main()
