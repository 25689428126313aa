"""MLP-VAE on sensor frames; an all-zero frame at step 210 makes the encoder's x/|x| NaN.

What it does: 24-channel sensor frames on a noisy 4-d nonlinear manifold (tanh(z B) + 0.5
z_0 + noise), fresh batches of 64 every step, 300 steps. Model ``SensorVAE``: an
``encoder`` whose first module ``encoder.unit`` (class ``UnitDirection``) returns each
frame's direction x / ||x|| with no epsilon; the direction and log1p(||x||) feed
``encoder.fc`` (MLP 25-64-64, ReLU) and the ``encoder.mu`` / ``encoder.logvar`` heads (4-d
latent); reparameterised sample; ``decoder`` MLP 4-64-64-24. Loss = summed MSE per frame
+ KL to N(0, I). Adam lr 1e-3, constant. At step 210 the batch's frame 17 is all zeros
(the logger wrote an empty frame on reconnect); every other frame of the run is normal.
Recorded with the debug preset (per-step NaN probe of every module's output,
``anomaly_mode="after_nonfinite"``, ``zero_nonfinite_grads``), profiler off.

What is TRUE of the run (measured):
- Steps 0-209 are healthy: 25-step median loss 19.2 (steps 0-24) -> 14.2 (75-99) -> 10.4
  (175-199); gradient norm medians 2.6-8.9; steps 207-209: loss 10.9, 10.7, 10.6.
- Step 210: ``encoder.unit`` computes 0 / 0 for frame 17, so its output holds NaN while
  its input (the batch, zeros included) is finite: the first nonfinite value of the run,
  in the forward pass, in that module. Everything downstream (``encoder.fc.*``,
  ``encoder.mu``, ``encoder.logvar``, ``decoder.*``) and the loss are NaN at step 210, and
  all 14 parameter gradients hold NaN (the recorder's ``zero_nonfinite_grads`` zeroes them
  before the update, so the weights stay finite).
- Step 211 on: finite again (loss 10.8, 11.6, 10.6 at 211-213; medians 10.1-10.6 to the
  end, weights finite at the end). Exactly one nonfinite step in the run: 210.
- No explosion before it (the largest gradient norm before step 210 is 13.0). ~8 s on 2
  CPU cores.
- Ground truth: NaN first at step 210, produced in the forward of module
  ``encoder.unit`` (a division by a norm that is 0).
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "nonfinite", "first_step": 210, "tolerance": 1, "top": True,
         "subject": "encoder.unit"},
    ],
    "forbidden": ["gradient_explosion", "loss_divergence", "memory_leak",
                  "dataloader_bottleneck"],
}

DIM, LATENT, BATCH, STEPS, ZERO_AT = 24, 4, 64, 300, 210


class UnitDirection(nn.Module):
    """Direction of each frame, x / ||x||: no epsilon, a frame is never expected to be 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=1, keepdim=True)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unit = UnitDirection()
        self.fc = nn.Sequential(nn.Linear(DIM + 1, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.mu = nn.Linear(64, LATENT)
        self.logvar = nn.Linear(64, LATENT)

    def forward(self, x: torch.Tensor):
        magnitude = torch.log1p(x.norm(dim=1, keepdim=True))
        h = self.fc(torch.cat([self.unit(x), magnitude], 1))
        return self.mu(h), self.logvar(h)


class SensorVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.decoder = nn.Sequential(nn.Linear(LATENT, 64), nn.ReLU(), nn.Linear(64, 64),
                                     nn.ReLU(), nn.Linear(64, DIM))

    def forward(self, x: torch.Tensor):
        mu, logvar = self.encoder(x)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.decoder(z), mu, logvar


def frames(n: int, basis: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Frames on a noisy 4-dimensional nonlinear manifold of a 24-channel sensor array."""
    z = torch.randn(n, LATENT, generator=g)
    return torch.tanh(z @ basis) + 0.5 * z[:, :1] + 0.05 * torch.randn(n, DIM, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(LATENT, DIM, generator=g)

    model = SensorVAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug",
                  profile_start=0) as rec:
        for step in range(STEPS):
            x = frames(BATCH, basis, g)
            if step == ZERO_AT:
                x[17] = 0.0                    # the logger wrote an empty frame on reconnect
            recon, mu, logvar = model(x)
            rec_loss = nn.functional.mse_loss(recon, x, reduction="sum") / BATCH
            kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum() / BATCH
            loss = rec_loss + kl
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss, recon=rec_loss, kl=kl)
            losses.append(loss.item())
    finite = [v for v in losses if v == v]
    print(f"nonfinite losses at steps {[i for i, v in enumerate(losses) if v != v]}")
    for a in range(0, STEPS, 25):
        w = sorted(v for v in losses[a:a + 25] if v == v)
        print(f"steps {a:3d}-{a + 24:3d}: median loss {w[len(w) // 2]:.3f}")
    print(f"final weights finite: "
          f"{all(bool(p.isfinite().all()) for p in model.parameters())}, "
          f"last-25 median {sorted(finite[-25:])[12]:.3f}")


if __name__ == "__main__":
    main()
