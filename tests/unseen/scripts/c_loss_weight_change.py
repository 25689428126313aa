"""VAE whose reconstruction term changes scale mid-run (mean -> sum over a small axis).

A small MLP VAE (latent 4) models 6 sensors x 4 readings generated from a 2-d latent
through a fixed nonlinear map plus noise. Loss = reconstruction + BETA * KL, Adam lr 2e-3,
400 steps of 64 samples. Until SWITCH = 200 the reconstruction error is the mean over all 24
values; from step 200 on (a refactor "to sum over sensors, as in the paper") it is summed over
the 6 sensors and averaged over the rest, i.e. the reconstruction term is 6x larger and the KL
weight relatively 6x smaller. Nothing else changes.

Measured: total loss falls from ~0.9 to ~0.26 by step 120 and stays there (recon ~0.12,
KL ~3) until step 199 (0.27); at step 200 it is 0.92, i.e. the objective jumps by ~3.4x in one
step because it was redefined; then it falls again (~0.58 at step 230, ~0.45 at step 399) as
the model, now with a relatively smaller KL weight, uses its latent more (recon per value
0.04 vs 0.12 before). The gradient norm goes from ~0.2 to ~1-2 at step 200 and stays on that
level with no growth; Adam's normalised updates absorb the change, training stays stable.
No NaN.

What is true of the run: the objective was rescaled at step 200 by the code; this is not a
divergence, not an explosion and not a loss spike (the loss does not come back down to its old
level because it is a different quantity). Training is otherwise healthy.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [],
    "forbidden": ["loss_divergence", "loss_spike", "gradient_explosion", "nonfinite"],
}

STEPS = 400
BATCH = 64
SWITCH = 200
BETA = 0.05
SENSORS, READINGS = 6, 4


class VAE(nn.Module):
    def __init__(self, d=SENSORS * READINGS, latent=4, hidden=64):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                                 nn.SiLU())
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec = nn.Sequential(nn.Linear(latent, hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                                 nn.SiLU(), nn.Linear(hidden, d))

    def forward(self, x):
        h = self.enc(x.flatten(1))
        mu, logvar = self.mu(h), self.logvar(h).clamp(-8, 8)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(z).view_as(x), mu, logvar


def make_data(n, gen):
    proj = torch.randn(2, 16, generator=gen)
    mix = torch.randn(16, SENSORS * READINGS, generator=gen) / 4
    z = torch.randn(n, 2, generator=gen)
    x = torch.tanh(z @ proj) @ mix + 0.05 * torch.randn(n, SENSORS * READINGS, generator=gen)
    x = (x - x.mean(0)) / x.std(0)
    return x.view(n, SENSORS, READINGS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    data = make_data(STEPS * BATCH, gen)
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step in range(STEPS):
            x = data[step * BATCH:(step + 1) * BATCH]
            xh, mu, logvar = model(x)
            err = (xh - x) ** 2
            # the change: mean over everything -> sum over the sensor axis (x6)
            recon = err.mean() if step < SWITCH else err.sum(1).mean()
            kl = (-0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1)).mean()
            loss = recon + BETA * kl
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, recon=recon, kl=kl)
            if step % 50 == 0 or step in (SWITCH - 1, SWITCH):
                print(f"step {step} loss {loss.item():.4g} recon {recon.item():.4g} "
                      f"kl {kl.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
