"""Deep & Cross Network v2 (Wang et al. 2021: 3 full-rank cross layers
x_{l+1} = x0 * (W x_l + b) + x_l in parallel with a 2-layer 128-unit ReLU deep tower, then a
linear head) forecasting the next-hour output of solar farms from 8 weather/plant features
(air temperature deg C, panel temperature deg C, wind m/s, humidity %, irradiance kW/m2,
cloud cover, hour-of-day sin/cos) plus a 4-dim farm embedding. Features are standardised
with mean/std measured on the first shard at start-up; the target is standardised power.
MSE, Adam(1e-3), batch 64, 380 steps.

What changes at step 190: a BUG. From step 190 the loader reads the shards of a newly added
region whose exporter writes the temperatures in Kelvin and the wind in km/h; the
standardiser is not refitted, so three of the eight standardised features sit far from where
they were (batch means at step 190: air temperature +49.4, panel temperature +24.4, wind
+10.1 std units; the others stay near 0). The cross layers multiply x0 with linear forms of x, so
the predictions, the loss and
the gradients jump by orders of magnitude at step 190 and stay far above their levels: the
network has to re-learn around inputs tens of stds out of range. Both the loss and the
gradient norm stay orders of magnitude above their levels to the end; an expert wants the
gradient norm jump at 190 flagged.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows):
- loss: median 0.0403 over steps 170-189, 2.69e4 over 190-209 (x6.7e5), 1639 over 210-229,
  34.3 over the last 20 (x850 the old level); values 0.0687 at 189, 3.31e5 at 190, 2.03e5 at
  191. 40-step medians 0.167 0.085 0.065 0.053 0.046 | 1597 158 74 46 34.
- grad norm: median 0.383 over 170-189, 9.80e6 over 190-209 (x2.6e7), 7.30e5 over 210-229,
  1.27e4 over the last 20 (x3.3e4 the old level); 1.07 at 189, 5.55e7 at 190, 4.32e7 at 191.
- LR constant 1e-3. No NaN or inf. About 5 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 190, "tolerance": 1}]}

STEPS, BATCH, FEATS, FARMS, SWITCH = 380, 64, 8, 12, 190


class DCNv2(nn.Module):
    def __init__(self):
        super().__init__()
        self.farm = nn.Embedding(FARMS, 4)
        d = FEATS + 4
        self.cross = nn.ModuleList(nn.Linear(d, d) for _ in range(3))
        self.deep = nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.head = nn.Linear(d + 128, 1)

    def forward(self, x, farm):
        x0 = torch.cat([x, self.farm(farm)], 1)
        xl = x0
        for lin in self.cross:
            xl = x0 * lin(xl) + xl
        return self.head(torch.cat([xl, self.deep(x0)], 1)).squeeze(1)


def shard(g, n, capacity):
    farm = torch.randint(0, FARMS, (n,), generator=g)
    hour = torch.rand(n, generator=g) * 24
    sun = torch.clamp(torch.sin((hour - 6) / 12 * math.pi), min=0)
    cloud = torch.rand(n, generator=g)
    irr = sun * (1 - 0.75 * cloud) * (0.9 + 0.2 * torch.rand(n, generator=g))     # kW/m2
    air = 12 + 10 * sun + 4 * torch.randn(n, generator=g)                          # deg C
    wind = (2 + 3 * torch.rand(n, generator=g)) * (1 + 0.5 * cloud)                 # m/s
    panel = air + 25 * irr - 1.5 * wind
    hum = (60 + 25 * cloud - 10 * sun + 5 * torch.randn(n, generator=g)).clamp(5, 100)
    eff = 1 - 0.004 * (panel - 25)
    power = capacity[farm] * irr * eff + 0.03 * torch.randn(n, generator=g)
    x = torch.stack([air, panel, wind, hum, irr, cloud, torch.sin(hour / 24 * 2 * math.pi),
                     torch.cos(hour / 24 * 2 * math.pi)], 1)
    return x, farm, power


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
    g = torch.Generator().manual_seed(41)
    capacity = 0.5 + torch.rand(FARMS, generator=g)
    x_ref, _, p_ref = shard(g, 4096, capacity)
    mu, sd = x_ref.mean(0), x_ref.std(0)
    p_mu, p_sd = float(p_ref.mean()), float(p_ref.std())
    model = DCNv2()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, farm, power = shard(g, BATCH, capacity)
            if step >= SWITCH:                     # the new region's exporter (the bug)
                x = x.clone()
                x[:, 0] += 273.15                  # air temperature in K
                x[:, 1] += 273.15                  # panel temperature in K
                x[:, 2] *= 3.6                     # wind in km/h
            z = (x - mu) / sd
            if step == SWITCH:
                print(f"standardised feature means at {step}: "
                      + " ".join(f"{v:.1f}" for v in z.mean(0).tolist()))
            pred = model(z, farm)
            loss = F.mse_loss(pred, (power - p_mu) / p_sd)
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4g} gnorm {gn:.4g}", flush=True)
    report(SWITCH, rows, ("loss", "gnorm"))


if __name__ == "__main__":
    main()
