"""Pathological: an MLP autoencoder compresses 32 correlated sensor channels; at the start of
step 240 one decoder layer (dec.2.weight) is hot-reloaded from the int8 deployment export
-- the int8 values are copied in but the dequantisation scale is never applied, so that
weight is multiplied by ~453 outside the optimizer. From step 240 the gradient norm is
~10^4-10^6x its pre-bug level for the rest of the run and the loss never comes back near
its pre-bug level (still ~700x at the end).

What it does: 5 latent factors drive 32 channels through a fixed tanh map, plus noise (sd
0.05); fresh batch of 64 per step. Model: encoder 32-64-6 and decoder 6-64-64-32 (GELU).
MSE reconstruction, Adam(lr 1e-3, constant), 420 steps, no clipping. The reload quantises
the current dec.2.weight with a symmetric per-tensor int8 scale (absmax / 127) and copies
round(w / scale) back in as floats.

What is TRUE of the run (measured; printed at the end):
- Steps 0-239: loss 0.624 at step 0, 20-step window medians 0.609, 0.440, 0.232, 0.140,
  0.092, 0.088, 0.086, 0.084, 0.082, 0.079, 0.079, 0.080; loss 0.080 at step 239. Gradient
  norm median 0.064 over 140-239 (max 0.083); ||dec.2.weight|| 4.6 -> 5.8.
- Step 240: dec.2.weight absmax 0.280, scale 0.00221: the weight is multiplied by 453
  (norm 5.8 -> 2,632). Loss 113,930 and gradient norm 210,660 (the run's maximum) at step
  240; 102,970 / 191,490 at 241; 86,536 / 156,050 at 242.
- Steps 240-419: the loss falls slowly but stays 700x-240,000x the pre-bug level: window
  medians 19,400, 870, 296, 188, 137, 113, 91, 71, 59 (last 55.8, minimum 53.3). The
  gradient norm never falls below 375: window medians 40,250, 3,580, 1,417, 1,038, 815, 706,
  615, 503, 459; post-bug median 815 (12,700x the pre-bug median). The large gradients are
  on the layers around the reloaded one (post-bug medians: dec.4.weight 530, enc.2.weight
  471, enc.0.weight 369; dec.2.weight itself only 0.57).
- LR constant 1e-3. No NaN/Inf.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "gradient_explosion", "first_step": 240, "tolerance": 1},
    ],
}

D_IN, D_LAT, FACTORS, BATCH, STEPS, LR, BUG_STEP = 32, 6, 5, 64, 420, 1e-3, 240


def make_mixer(g):
    """32 correlated sensor channels driven by 5 latent factors through a fixed
    two-layer nonlinear map."""
    a = torch.randn(FACTORS, 24, generator=g)
    b = torch.randn(24, D_IN, generator=g) / math.sqrt(24)
    return a, b


def sample(g, mixer, n):
    a, b = mixer
    z = torch.randn(n, FACTORS, generator=g)
    return torch.tanh(z @ a) @ b + 0.05 * torch.randn(n, D_IN, generator=g)


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(D_IN, 64), nn.GELU(), nn.Linear(64, D_LAT))
        self.dec = nn.Sequential(nn.Linear(D_LAT, 64), nn.GELU(), nn.Linear(64, 64),
                                 nn.GELU(), nn.Linear(64, D_IN))

    def forward(self, x):
        return self.dec(self.enc(x))


def int8_export(w):
    """Symmetric per-tensor int8 quantisation: returns (int8 values, scale)."""
    scale = w.abs().max() / 127.0
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def med(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(12)
    mixer = make_mixer(g)
    xv = sample(g, mixer, 1024)
    model = AutoEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses, gnorms = [], []
    per = {n: [] for n, _ in model.named_parameters()}

    def val():
        with torch.no_grad():
            return round(F.mse_loss(model(xv), xv).item(), 5)

    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == BUG_STEP:
                # hot reload of one layer from the int8 deployment export: the int8 values
                # are copied in, but the dequantisation scale is never applied
                w = model.dec[2].weight
                q, scale = int8_export(w.detach())
                print(f"reload dec.2.weight: absmax {w.abs().max().item():.4f}, scale "
                      f"{scale.item():.6f}, weights x{1 / scale.item():.1f}")
                with torch.no_grad():
                    w.copy_(q.float())
            x = sample(g, mixer, BATCH)
            loss = F.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()
            for n, p in model.named_parameters():
                per[n].append(p.grad.norm().item())
            gn = math.sqrt(sum(v[-1] ** 2 for v in per.values()))
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn)
            if step % 30 == 0 or BUG_STEP - 1 <= step <= BUG_STEP + 3 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.5g} gn {gn:.5g} val {val()} "
                      f"|dec.2.w| {model.dec[2].weight.norm().item():.4g}", flush=True)
    w = 20
    print("loss 20-step window medians", [float(f"{med(losses[i:i + w]):.4g}")
                                          for i in range(0, STEPS, w)])
    print("gnorm 20-step window medians", [float(f"{med(gnorms[i:i + w]):.4g}")
                                           for i in range(0, STEPS, w)])
    pre, post = gnorms[140:BUG_STEP], gnorms[BUG_STEP:]
    print(f"gnorm pre-bug (140-{BUG_STEP - 1}) median", round(med(pre), 4), "max",
          round(max(pre), 4), "| post-bug median", round(med(post), 2), "min",
          round(min(post), 3), "max", round(max(post), 1), "at",
          BUG_STEP + post.index(max(post)), "ratio of medians", round(med(post) / med(pre), 1))
    print(f"loss pre-bug (140-{BUG_STEP - 1}) median", round(med(losses[140:BUG_STEP]), 5),
          f"| at {BUG_STEP - 1}", round(losses[BUG_STEP - 1], 5), f"at {BUG_STEP}",
          round(losses[BUG_STEP], 2), "post-bug median", round(med(losses[BUG_STEP:]), 4),
          "min", round(min(losses[BUG_STEP:]), 4), "last", round(losses[-1], 4),
          "nonfinite", sum(not math.isfinite(v) for v in losses))
    for n, v in per.items():
        print(f"  {n}: pre median {med(v[140:BUG_STEP]):.4g}, post median "
              f"{med(v[BUG_STEP:]):.4g}")


if __name__ == "__main__":
    main()
