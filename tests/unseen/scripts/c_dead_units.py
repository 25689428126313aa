"""Conv autoencoder whose bottleneck ReLU is dead from initialisation.

A conv autoencoder (2 strided convs -> Linear 256->32 + ReLU bottleneck -> Linear 32->256 ->
2 transposed convs) reconstructs 16x16 images of random Gaussian blobs, standardised per
pixel. The bottleneck bias was initialised to -30 (a "sparse code" init gone wrong): with the
Linear's weights at their default scale its pre-activations are about -30 +- 1 for every
sample, so all 32 bottleneck units output exactly 0 from step 0 on. The decoder therefore
sees a constant zero code and can only output one fixed image; no gradient passes the dead
ReLU, so the bottleneck Linear and the whole encoder get exactly-zero gradients at every step
and never change (Adam, lr 1e-3, 200 steps of 32 images). Recorded with the `debug` preset.

Measured: the bottleneck ReLU's output is 100% zeros at every step; the gradients of the
encoder, of the bottleneck Linear and of the Linear right after it (`expand.0.weight`, whose
input is the zero code) are exactly 0 at every step. The loss (MSE) is 0.99 at step 0 and
stays where it started for the whole run: per-step values 0.83-1.29 around 1.0 (batch noise),
mean of steps 0-19 1.04, of steps 180-199 0.98, i.e. the per-pixel variance of the data: the
model learns nothing. With a zero bias (the same code otherwise) the loss falls to ~0.12
within 200 steps.

What is true of the run: dead activations in the bottleneck from step 0 are the root cause
(module `bottleneck`); the loss is stalled for the whole run as their consequence.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "dead_activation", "first_step": 0, "tolerance": 1, "top": True,
         "subject": "bottleneck"},
        {"id": "loss_plateau", "first_step": 0, "tolerance": 10},
    ],
    "forbidden": ["gradient_explosion", "loss_divergence", "nonfinite", "loss_spike"],
}

STEPS = 200
BATCH = 32
SIZE = 16
BOTTLENECK_BIAS = -30.0


class ConvAE(nn.Module):
    def __init__(self, code=32):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        self.bottleneck = nn.Sequential(nn.Linear(16 * 4 * 4, code), nn.ReLU())
        self.expand = nn.Sequential(nn.Linear(code, 16 * 4 * 4), nn.ReLU())
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1), nn.ReLU(),
            nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1))
        nn.init.constant_(self.bottleneck[0].bias, BOTTLENECK_BIAS)

    def forward(self, x):
        z = self.bottleneck(self.encoder(x))
        return self.decoder(self.expand(z).view(-1, 16, 4, 4))


def blobs(n, gen):
    yy, xx = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    img = torch.zeros(n, SIZE, SIZE)
    for _ in range(3):
        c = torch.rand(n, 2, 1, 1, generator=gen) * SIZE
        r = torch.rand(n, 1, 1, generator=gen) * 2 + 1.5
        img += torch.exp(-((yy - c[:, 0]) ** 2 + (xx - c[:, 1]) ** 2) / (2 * r ** 2))
    img = (img - img.mean(0)) / img.std(0)
    return img[:, None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    data = blobs(STEPS * BATCH, gen)
    model = ConvAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug",
                  profile_start=0) as rec:
        for step in range(STEPS):
            x = data[step * BATCH:(step + 1) * BATCH]
            loss = nn.functional.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
