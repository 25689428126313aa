"""A RealNVP-style affine-coupling normalising flow fitted by maximum likelihood to a tight 4-D
ring mixture: the loss (NLL in nats) crosses zero and goes negative, and the gradient norm
grows ~13x as the density sharpens. Both are normal for density models.

What it does: 4-D data, 8 tight Gaussian clusters (std 0.06) on a radius-2 ring in dims 0-1,
dims 2-3 smooth functions of the cluster angle plus noise 0.06-0.08; fresh batches of 256.
The flow (Dinh et al. 2017) has 6 blocks of ActNorm + affine coupling (alternating 2+2 and
interleaved masks; conditioner MLP 4-64-64-8 with SiLU, zero-initialised last layer, log-scale
bounded by a learned scale x tanh); the first ActNorm is data-initialised. Loss = mean
negative log-likelihood under a standard-normal base; bits/dim is passed as a metric. Adam lr
2e-3, cosine to 1e-4 over 400 steps. Debug preset. Seeded, deterministic.

What is TRUE of the run (measured):
- Healthy. Loss medians per 50 steps: 4.170, 1.181, 0.190, -0.321, -0.596, -0.757, -0.861,
  -0.889; the training loss is first below 0 at step 127 and stays negative (a continuous
  density can exceed 1). Held-out NLL (4,000 points): 0.531, -0.550, -0.860, -0.963 at steps
  99, 199, 299, 399: it improves to the end.
- Gradient norm (total, before the step) grows as the fitted density sharpens: 50-step
  medians 1.60, 17.1, 21.2, 22.5, 20.9, 20.9, 21.5, 16.2; single-step maxima 40.8 (0-49),
  93.6 (50-99), 73.8, 59.5, then 26-41. No clipping, no NaN/Inf, no divergence.
- ~12 s on 2 busy CPU cores.
"""

import argparse
import math
import time

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "forbidden": ["gradient_explosion", "loss_divergence", "loss_spike", "nonfinite"],
}

STEPS, BATCH, DIM, LAYERS = 400, 256, 4, 6


def ring_mixture(g, n):
    """4-D data: 8 tight Gaussian clusters (std 0.06) on a ring in dims 0-1, dims 2-3 a
    curved function of the angle plus small noise."""
    k = torch.randint(0, 8, (n,), generator=g)
    ang = k.float() * 2 * math.pi / 8
    x0 = 2.0 * torch.cos(ang) + 0.06 * torch.randn(n, generator=g)
    x1 = 2.0 * torch.sin(ang) + 0.06 * torch.randn(n, generator=g)
    x2 = torch.sin(2 * ang) + 0.5 * x0 * 0.1 + 0.06 * torch.randn(n, generator=g)
    x3 = 0.5 * torch.cos(3 * ang) + 0.08 * torch.randn(n, generator=g)
    return torch.stack([x0, x1, x2, x3], 1)


class Coupling(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = nn.Sequential(
            nn.Linear(DIM, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 2 * DIM)
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.scale = nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        xm = x * self.mask
        s, t = self.net(xm).chunk(2, 1)
        s = self.scale * torch.tanh(s) * (1 - self.mask)
        t = t * (1 - self.mask)
        y = xm + (1 - self.mask) * (x * torch.exp(s) + t)
        return y, s.sum(1)


class ActNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(DIM))
        self.logs = nn.Parameter(torch.zeros(DIM))

    def forward(self, x):
        return (x + self.loc) * torch.exp(self.logs), self.logs.sum().expand(x.shape[0])


class Flow(nn.Module):
    def __init__(self):
        super().__init__()
        masks = [
            torch.tensor([1.0, 1.0, 0.0, 0.0]),
            torch.tensor([0.0, 0.0, 1.0, 1.0]),
            torch.tensor([1.0, 0.0, 1.0, 0.0]),
            torch.tensor([0.0, 1.0, 0.0, 1.0]),
        ]
        layers = []
        for i in range(LAYERS):
            layers += [ActNorm(), Coupling(masks[i % 4])]
        self.layers = nn.ModuleList(layers)

    def nll(self, x):
        logdet = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        logp = -0.5 * (x**2).sum(1) - 0.5 * DIM * math.log(2 * math.pi)
        return -(logp + logdet)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    val = ring_mixture(torch.Generator().manual_seed(7), 4000)
    model = Flow()
    with torch.no_grad():  # data-dependent ActNorm init on the first layer only
        x0 = ring_mixture(torch.Generator().manual_seed(3), 1024)
        model.layers[0].loc.copy_(-x0.mean(0))
        model.layers[0].logs.copy_(-x0.std(0).log())
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS, eta_min=1e-4)
    log = []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug") as rec:
        for step in range(STEPS):
            x = ring_mixture(g, BATCH)
            loss = model.nll(x).mean()
            opt.zero_grad()
            loss.backward()
            gn = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
            opt.step()
            sched.step()
            rec.step(loss=loss, bits_per_dim=loss.detach() / (DIM * math.log(2)))
            log.append((loss.item(), gn))
            if step % 100 == 99:
                with torch.no_grad():
                    print(f"step {step}: held-out nll {model.nll(val).mean().item():.3f}")

    def med(v):
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 50):
        w = log[s : s + 50]
        print(
            f"{s:3d}-{s + 49}: loss med {med([a for a, _ in w]):.3f} [{min(a for a, _ in w):.3f},"
            f" {max(a for a, _ in w):.3f}] gn med "
            f"{med([b for _, b in w]):.2f} max {max(b for _, b in w):.2f}"
        )
    print("first step loss<0:", next((i for i, (a, _) in enumerate(log) if a < 0), None))
    print(f"time {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
