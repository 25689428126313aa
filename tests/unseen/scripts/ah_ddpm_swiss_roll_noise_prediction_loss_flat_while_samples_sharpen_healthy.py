"""A 2-D DDPM on the swiss roll: the loss flattens early while the samples keep improving.

What it does: the data is sklearn's 2-D swiss roll (scaled by 1/5, noise 0.05), drawn fresh
each step. The denoiser eps_theta(x_t, t) is a residual MLP (width 128, 3 pre-LayerNorm SiLU
blocks, sinusoidal time embedding), trained with the simple DDPM objective of Ho et al. (2020):
MSE between the true and predicted noise at a uniformly drawn timestep out of T = 100 (linear
betas rescaled for T = 100: 1e-3 to 0.2). Batch 256, Adam lr 1e-3 constant, 500 steps.
Every 50 steps the weights are snapshotted; after the recorded run each snapshot draws 2,000
samples by ancestral sampling and is scored against 2,000 held-out data points (median
nearest-neighbour distance sample->data, a precision proxy, and data->sample, recall).
Standard preset. Seeded, deterministic (two runs gave identical figures).

What is TRUE of the run (measured):
- The per-batch loss drops in the first ~50 steps and then is nearly flat and noisy (each
  batch mixes easy high-noise and hard low-noise timesteps): 50-step medians 0.400, 0.327,
  0.321, 0.311, 0.320, 0.299, 0.311, 0.294, 0.298, 0.308; within a window single steps span
  0.23-0.45 (largest after step 50: 0.453). The first step's loss is 0.95.
- Meanwhile the samples keep getting better, which the loss barely shows: sample->data
  median NN distance 0.307 after step 49, 0.297 (99), 0.273 (149), 0.252 (199), 0.216 (249),
  0.180 (299), 0.163 (349), 0.154 (399), 0.147 (449), 0.169 (499); data->sample 0.058 ->
  0.040-0.044.
- Gradient norms are steady: 50-step medians 0.40-0.66, max 3.55 at step 0, at most 1.43
  after step 50. No NaN/Inf. Steps ~10 ms (max 50 ms); ~20 s in all on 2 CPU cores.
- Healthy: a flat, noisy diffusion loss is what the objective looks like once the easy part
  is learned; the model is still improving. Nothing stalls, diverges or explodes.
"""

import argparse
import copy
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_plateau", "loss_spike", "loss_divergence", "gradient_explosion",
                  "vanishing_gradient", "step_time_outlier"],
}

STEPS, BATCH, T, WIDTH = 500, 256, 100, 128


def linear_schedule(t_steps: int) -> torch.Tensor:
    """Ho et al.'s linear betas (1e-4 to 0.02 over 1,000 steps), rescaled for a shorter chain
    as improved-diffusion's ``get_named_beta_schedule("linear", T)`` does."""
    scale = 1000 / t_steps
    return torch.linspace(scale * 1e-4, scale * 0.02, t_steps)


BETAS = linear_schedule(T)
ALPHAS = 1 - BETAS
ABAR = torch.cumprod(ALPHAS, 0)


def swiss_roll(n: int, g: torch.Generator) -> torch.Tensor:
    """sklearn's 2-D swiss roll (t in [1.5 pi, 4.5 pi]), scaled by 1/5, noise 0.05."""
    t = 1.5 * math.pi * (1 + 2 * torch.rand(n, generator=g))
    x = torch.stack([t * t.cos(), t * t.sin()], 1) / 5
    return x + 0.05 * torch.randn(n, 2, generator=g)


class SinusoidalEmbedding(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.register_buffer("freqs", torch.exp(-math.log(1000) * torch.arange(dim // 2)
                                                / (dim // 2)))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        a = t[:, None].float() * self.freqs[None]
        return torch.cat([a.sin(), a.cos()], 1)


class ResidualMLPDenoiser(nn.Module):
    """eps_theta(x_t, t): a residual SiLU MLP with an additive sinusoidal time embedding."""

    def __init__(self, width: int = WIDTH, blocks: int = 3) -> None:
        super().__init__()
        self.time = nn.Sequential(SinusoidalEmbedding(64), nn.Linear(64, width), nn.SiLU(),
                                  nn.Linear(width, width))
        self.inp = nn.Linear(2, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width),
                                                  nn.SiLU(), nn.Linear(width, width))
                                    for _ in range(blocks))
        self.out = nn.Sequential(nn.LayerNorm(width), nn.SiLU(), nn.Linear(width, 2))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) + self.time(t)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


@torch.no_grad()
def sample(model: nn.Module, n: int = 2000) -> torch.Tensor:
    """Ancestral DDPM sampling (Ho et al. 2020, algorithm 2), sigma_t^2 = beta_t."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 2, generator=g)
    for t in reversed(range(T)):
        eps = model(x, torch.full((n,), t))
        x = (x - BETAS[t] / torch.sqrt(1 - ABAR[t]) * eps) / torch.sqrt(ALPHAS[t])
        if t > 0:
            x = x + torch.sqrt(BETAS[t]) * torch.randn(n, 2, generator=g)
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data_g = torch.Generator().manual_seed(1)
    reference = swiss_roll(2000, torch.Generator().manual_seed(9))

    model = ResidualMLPDenoiser()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, norms, snapshots = [], [], {}
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x0 = swiss_roll(BATCH, data_g)
            t = torch.randint(0, T, (BATCH,), generator=data_g)
            eps = torch.randn(BATCH, 2, generator=data_g)
            xt = ABAR[t].sqrt()[:, None] * x0 + (1 - ABAR[t]).sqrt()[:, None] * eps
            loss = nn.functional.mse_loss(model(xt, t), eps)
            opt.zero_grad()
            loss.backward()
            norms.append(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item())
            opt.step()
            rec.step(loss=loss)
            if step % 50 == 49:               # snapshot; samples are drawn after the run
                snapshots[step] = copy.deepcopy(model.state_dict())
            losses.append(loss.item())
    probe = ResidualMLPDenoiser()
    for step, state in snapshots.items():
        probe.load_state_dict(state)
        xs = sample(probe)
        # precision-like: median distance of a sample to the nearest data point;
        # recall-like: median distance of a data point to the nearest sample
        prec = torch.cdist(xs, reference).min(1).values.median().item()
        recall = torch.cdist(reference, xs).min(1).values.median().item()
        print(f"after step {step}: sample->data NN median {prec:.3f}  data->sample {recall:.3f}")
    for s in range(0, STEPS, 50):
        w, n = sorted(losses[s:s + 50]), sorted(norms[s:s + 50])
        print(f"steps {s:3d}-{s + 49:3d}: loss median {w[25]:.3f} [{w[0]:.3f}, {w[-1]:.3f}]  "
              f"grad norm median {n[25]:.3f} max {n[-1]:.3f}")


if __name__ == "__main__":
    main()
