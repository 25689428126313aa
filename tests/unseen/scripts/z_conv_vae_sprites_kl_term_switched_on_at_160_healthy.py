"""Convolutional VAE on synthetic 16x16 sprites (a filled ellipse and a bar at random
positions, sizes and orientations, intensities in [0, 1]). Encoder Conv(1-16-32, stride 2)
-> Linear to mu / logvar (8 latents); decoder Linear -> ConvTranspose(32-16-1) -> sigmoid.
Reconstruction: per-image summed BCE, averaged over the batch. Adam(1e-3), batch 32, 380
steps.

What changes at step 160: the KL term is switched on. The first 160 steps train the
autoencoder alone (beta = 0, "free" latents, a common trick so the decoder learns to use the
code before the prior is imposed); from step 160 the objective is the ELBO with beta = 0.5:
recon + 0.5 * KL(q(z|x) || N(0, I)). The KL of the unregularised posterior is large at that
moment, so the total loss rises at 160; the KL then falls quickly and the total loss trains
down. HEALTHY by design: the reconstruction term keeps (after a short bump) improving, the
ELBO loss falls after the switch, no NaN.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows):
- recorded loss (recon + beta*KL): median 82.6 over steps 140-159, 97.3 over 160-179 (x1.18),
  84.8 over 180-199, 58.9 over the last 20; values 85.6 at 159, 116.0 at 160 (x1.36), 117.5
  at 161. 40-step medians 130.7 92.7 84.0 82.7 | 90.8 75.1 67.6 63.8 61.5 58.9.
- grad norm: median 21.7 over 140-159, 60.9 over 160-179 (x2.81), 23.6 over 180-199, 15.9
  over the last 20; 27.3 at 159, 174.4 at 160, 150.7 at 161 (a spike of ~20 steps).
- KL: 67.4 (unregularised, beta 0) over 140-159, 14.2 over 160-179, 8.3 over 180-199, ~11 to
  the end.
- reconstruction: 82.6 over 140-159, 86.7 over 160-179, 80.5 over 180-199, 53.4 over the last
  20 (40-step medians 84.0 82.7 | 84.0 69.5 62.1 58.3 56.0 53.4).
- LR constant 1e-3. No NaN or inf. About 10 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, SIZE, LATENT, SWITCH, BETA = 380, 32, 16, 8, 160, 0.5


class ConvVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 16, 4, 2, 1), nn.ReLU(),
                                 nn.Conv2d(16, 32, 4, 2, 1), nn.ReLU(), nn.Flatten())
        self.mu = nn.Linear(32 * 4 * 4, LATENT)
        self.logvar = nn.Linear(32 * 4 * 4, LATENT)
        self.dec_in = nn.Linear(LATENT, 32 * 4 * 4)
        self.dec = nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(32, 16, 4, 2, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(16, 1, 4, 2, 1))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h).clamp(-12, 8)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        logits = self.dec(self.dec_in(z).view(-1, 32, 4, 4))
        return logits, mu, logvar


def sprites(g, n):
    yy, xx = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    img = torch.zeros(n, 1, SIZE, SIZE)
    for i in range(n):
        cx, cy = (3 + 10 * torch.rand(2, generator=g)).tolist()
        a, b = (1.5 + 3 * torch.rand(2, generator=g)).tolist()
        ell = ((xx - cx) / a) ** 2 + ((yy - cy) / b) ** 2 <= 1
        ang = float(torch.rand(1, generator=g)) * math.pi
        bx, by = (3 + 10 * torch.rand(2, generator=g)).tolist()
        d = (xx - bx) * math.sin(ang) - (yy - by) * math.cos(ang)
        along = (xx - bx) * math.cos(ang) + (yy - by) * math.sin(ang)
        bar = (d.abs() < 0.8) & (along.abs() < 4)
        img[i, 0] = torch.maximum(ell.float() * (0.5 + 0.5 * float(torch.rand(1, generator=g))),
                                  bar.float())
    return img


def grad_norm(model):
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()
                         if p.grad is not None))


def report(n_change, rows, names):
    med = statistics.median
    for j, name in enumerate(names):
        col = [r[j] for r in rows]
        b = med(col[n_change - 20:n_change])
        a = med(col[n_change:n_change + 20])
        print(f"[{name}] med {n_change - 20}-{n_change - 1}: {b:.4g}  {n_change}-{n_change + 19}: "
              f"{a:.4g} (x{a / b:.3g})  {n_change + 20}-{n_change + 39}: "
              f"{med(col[n_change + 20:n_change + 40]):.4g}  last20: {med(col[-20:]):.4g}  "
              f"at {n_change - 1},{n_change},{n_change + 1}: "
              + ", ".join(f"{v:.4g}" for v in col[n_change - 1:n_change + 2])
              + f"  step0: {col[0]:.4g}  nonfinite: {sum(not math.isfinite(v) for v in col)}")
        print(f"[{name}] 40-step medians: "
              + " ".join(f"{med(col[a:a + 40]):.4g}" for a in range(0, len(col), 40)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)
    model = ConvVAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt,
                  hparams={"beta": BETA, "kl_start_step": SWITCH, "latent": LATENT}) as rec:
        for step in range(STEPS):
            x = sprites(g, BATCH)
            logits, mu, logvar = model(x)
            recon = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / BATCH
            kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum() / BATCH
            beta = BETA if step >= SWITCH else 0.0
            loss = recon + beta * kl
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            rec.step(loss=loss, recon=recon.detach(), kl=kl.detach(), beta=beta)
            rows.append((loss.item(), gn, recon.item(), kl.item()))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.3f} recon {recon.item():.3f} "
                      f"kl {kl.item():.3f} gnorm {gn:.3f}", flush=True)
    report(SWITCH, rows, ("loss", "gnorm", "recon", "kl"))


if __name__ == "__main__":
    main()
