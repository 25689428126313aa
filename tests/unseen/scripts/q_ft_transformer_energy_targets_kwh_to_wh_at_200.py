"""An FT-Transformer (feature tokenizer + 2-layer pre-norm transformer encoder) regresses
building energy use; from step 200 on the data pipeline serves a new shard whose targets are
in Wh/day instead of kWh/day (x1000), still standardised with the kWh normaliser. From step
200 the gradient norm is ~25,000x its pre-bug level, for the rest of the run.

What it does: 10 standardised Gaussian features; target (kWh/day) = 6 + 1.2 x0^2 + 1.5 x1
+ 0.8 x2 x3 - 0.7 x4 + 0.5 sin(2 x5) + 0.3 noise (mean 7.19, std 2.55); the model is trained
on (y - 7.2) / 2.6. Fresh batch of 64 every step. Model: per-feature learned embedding scaled
by the feature value (+ per-feature bias), a learned [CLS] token, nn.TransformerEncoder
(d 32, 4 heads, ff 64, norm_first, no dropout, 2 layers), LayerNorm, Linear head on [CLS].
AdamW(lr 1e-3, wd 1e-4, constant), MSE, 360 steps, no clipping. From step 200 the raw
targets are multiplied by 1000 before the (unchanged) normalisation, so the standardised
targets jump from mean ~0 / std ~1 to mean ~2,750.

What is TRUE of the run (measured; printed at the end):
- Steps 0-199 are healthy: loss 1.676 at step 0, 20-step window means 0.985, 0.606, 0.528,
  0.347, 0.247, 0.197, 0.131, 0.118, 0.111, 0.094; gradient norm median 1.91 (window
  medians 1.36-2.52), max 7.51 at step 0; over steps 100-199 median 1.69, max 6.85.
- Step 199: loss 0.082, grad norm 1.23. Step 200 (first batch in Wh): loss 8.87e6, grad norm
  7.0e4; step 201: 7.9e6 / 7.1e4 (the run's largest gradient); step 202: 8.6e6 / 5.1e4.
- Steps 200-359: the gradient norm stays between 3.2e4 and 7.1e4 (median 4.66e4, ~25,000x
  the pre-bug median), 20-step window medians 3.5e4, 3.7e4, 4.2e4, 4.3e4, 4.8e4, 5.1e4, 5.4e4,
  5.6e4 (creeping up as the head's weights grow). The loss stays at 6.8e6-1.07e7 (window means
  8.3e6-9.1e6): Adam's bounded steps move the mean prediction only from ~0 to 24 of the ~2,750
  needed, so it neither recovers nor grows further.
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
        {"id": "gradient_explosion", "first_step": 200, "tolerance": 1},
    ],
}

FEATURES, D, BATCH, STEPS, LR, BUG_STEP, UNIT = 10, 32, 64, 360, 1e-3, 200, 1000.0
Y_MEAN, Y_STD = 7.2, 2.6            # target normaliser fitted on the kWh/day data


def sample(g, n):
    """Building energy use (kWh/day) from 10 standardised features: temperature (U-shaped
    effect), floor area, occupancy x hours interaction, insulation, and noise. Mean ~6 kWh."""
    x = torch.randn(n, FEATURES, generator=g)
    y = (6.0 + 1.2 * x[:, 0] ** 2 + 1.5 * x[:, 1] + 0.8 * x[:, 2] * x[:, 3] - 0.7 * x[:, 4]
         + 0.5 * torch.sin(2 * x[:, 5]) + 0.3 * torch.randn(n, generator=g))
    return x, y


class FTTransformer(nn.Module):
    """Feature tokenizer (one learned embedding per feature, scaled by its value) + [CLS]
    token -> 2-layer transformer encoder -> linear head on [CLS]."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(FEATURES, D) * 0.3)
        self.bias = nn.Parameter(torch.zeros(FEATURES, D))
        self.cls = nn.Parameter(torch.randn(1, 1, D) * 0.3)
        layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 1)

    def forward(self, x):
        tokens = x.unsqueeze(-1) * self.weight + self.bias
        h = self.encoder(torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], 1))
        return self.head(self.norm(h[:, 0])).squeeze(1)


def grad_norm(params):
    gs = [p.grad.detach().norm() for p in params if p.grad is not None]
    return torch.stack(gs).norm().item() if gs else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = FTTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=1e-4)
    losses, total = [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = sample(g, BATCH)
            if step >= BUG_STEP:
                y = y * UNIT        # new data shard: targets in Wh/day instead of kWh/day
            pred = model(x)
            loss = F.mse_loss(pred, (y - Y_MEAN) / Y_STD)
            opt.zero_grad()
            loss.backward()
            total.append(grad_norm(model.parameters()))
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            if step % 25 == 0 or step == STEPS - 1 or BUG_STEP - 2 <= step <= BUG_STEP + 3:
                print(f"step {step} loss {loss.item():.5g} gn {total[-1]:.5g} "
                      f"pred_mean {pred.mean().item():.4g} y_mean {y.mean().item():.4g}"
                      f" target_mean {((y - Y_MEAN) / Y_STD).mean().item():.4g}",
                      flush=True)
    w = 20
    print("WINDOW_MEANS", [float(f"{sum(losses[i:i + w]) / w:.4g}") for i in range(0, STEPS, w)])
    print("GN_WINDOW_MEDIANS", [float(f"{torch.tensor(total[i:i + w]).median().item():.4g}")
                                for i in range(0, STEPS, w)])
    pre, post = torch.tensor(total[:BUG_STEP]), torch.tensor(total[BUG_STEP:])
    print("GN pre-bug median", round(pre.median().item(), 4), "max", round(pre.max().item(), 4),
          "at", int(pre.argmax()), "| last 100 pre-bug steps median",
          round(pre[-100:].median().item(), 4), "max", round(pre[-100:].max().item(), 4))
    print("GN post-bug median", round(post.median().item(), 2), "min", round(post.min().item(), 2),
          "max", round(post.max().item(), 2), "at", BUG_STEP + int(post.argmax()))
    print("post-bug loss min", f"{min(losses[BUG_STEP:]):.4g}",
          "max", f"{max(losses[BUG_STEP:]):.4g}")
    print("nonfinite:", any(not math.isfinite(v) for v in losses + total))


if __name__ == "__main__":
    main()
