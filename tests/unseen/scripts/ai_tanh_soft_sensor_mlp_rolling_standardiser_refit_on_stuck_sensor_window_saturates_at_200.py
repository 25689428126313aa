"""A tanh MLP soft sensor whose rolling input standardiser is refitted every 100 steps; the
refit at step 200 hits a window with a stuck sensor (std 0) and the first tanh layer saturates.

What it does: a simulated distillation column (3 slowly drifting latent process states, 16
sensors reading them with offsets of 50-80 units, mild nonlinearity and noise; the target is
the top-product purity, scaled). A soft-sensor MLP 16-64-64-1 with nn.Tanh after each hidden
layer (net.1, net.3), Adam lr 1e-3, batch 64, 450 steps. Inputs are standardised with a
rolling standardiser refitted every 100 steps on the latest 512 historian rows:
(x - mean) / (std + 1e-8). The window used by the refit at step 200 is one in which sensor 5's
transmitter was frozen at a single value, so its std is exactly 0; in the batches after it
the sensor is live again, and its standardised value is ~1e9. The refit at step 300 uses a
normal window again. Debug preset (activation statistics every 25 steps). Seeded,
deterministic.

What is TRUE of the run (measured):
- Steps 0-199 healthy: loss medians per 50 steps 0.1002, 0.0473, 0.0545, 0.0973; share of
  net.1 (first tanh) outputs with |tanh| > 0.99 at 1-5 % (medians 0.049, 0.029, 0.033,
  0.010); largest standardised input ~5; net.0.weight gradient medians 0.59, 0.28, 0.19,
  0.36.
- Step 200 (first batch after the bad refit): largest |input| 1.1e9 and 100 % of net.1's
  outputs saturated (|tanh| > 0.99), and so it stays at every step 200-299. net.0.weight's
  gradient is exactly 0 (median over 200-299): nothing upstream of the saturated layer
  learns. net.3 is much less affected (saturated share medians 0 % over 200-249, 9 %
  over 250-299).
- The loss rises: 0.190 at step 200 (0.066 at 199), medians 0.2716 (200-249) and 0.4445
  (250-299); total gradient norm medians 1.28 and 6.08 (max 10.8) against 0.64-1.29 before.
- The refit at step 300 ends it: net.1 saturation back to 5 %, 1.7 %, 1.2 % (medians over
  300-449), loss medians 0.1657, 0.0656, 0.1126. No NaN/Inf.
- ~4 s on 2 busy CPU cores.
"""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "saturated_activation", "first_step": 200, "tolerance": 25,
         "subject": "net.1"},
    ],
    "forbidden": ["gradient_explosion"],
}

STEPS, BATCH, SENSORS, REFIT_EVERY, STUCK_AT, STUCK_SENSOR = 450, 64, 16, 100, 200, 5
LR = 1e-3


class Column:
    """A simulated column: 3 latent process states (feed rate, reboiler duty, reflux ratio)
    drifting slowly; 16 sensors (temperatures on trays, pressures, flows) are noisy linear /
    mildly nonlinear readings of them; the target is the top-product purity (scaled)."""

    def __init__(self, g: torch.Generator) -> None:
        self.g = g
        self.mix = torch.randn(3, SENSORS, generator=torch.Generator().manual_seed(4))
        self.offset = 50 + 30 * torch.rand(SENSORS, generator=torch.Generator().manual_seed(5))
        self.t = 0
        self.stuck_value: torch.Tensor | None = None

    def rows(self, n: int, stuck: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        ts = self.t + torch.arange(n).float()
        self.t += n
        slow = torch.stack([torch.sin(ts / 400), torch.cos(ts / 650), torch.sin(ts / 900 + 1)], 1)
        z = slow + 0.6 * torch.randn(n, 3, generator=self.g)
        x = self.offset + 4 * (z @ self.mix) + 0.5 * torch.tanh(z @ self.mix) ** 2
        x = x + 0.3 * torch.randn(n, SENSORS, generator=self.g)
        if stuck:   # the transmitter froze at its last value for this stretch of data
            x[:, STUCK_SENSOR] = x[0, STUCK_SENSOR]
        y = torch.tanh(0.8 * z[:, 0] - 0.5 * z[:, 1]) + 0.3 * z[:, 2] * z[:, 0]
        return x, y + 0.05 * torch.randn(n, generator=self.g)


class SoftSensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(SENSORS, 64), nn.Tanh(), nn.Linear(64, 64),
                                 nn.Tanh(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    column = Column(torch.Generator().manual_seed(1))
    model = SoftSensor()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    mean = std = None
    log = []
    acts = {}
    hooks = [model.net[k].register_forward_hook(       # (for the figures printed below)
        lambda _m, _inp, out, k=k: acts.__setitem__(k, out.detach())) for k in (1, 3)]
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="debug") as rec:
        for step in range(STEPS):
            if step % REFIT_EVERY == 0:
                # rolling re-standardisation on the latest 512 rows from the historian
                window, _ = column.rows(512, stuck=(step == STUCK_AT))
                mean, std = window.mean(0), window.std(0)
                print(f"step {step}: standardiser refit, sensor {STUCK_SENSOR} std "
                      f"{float(std[STUCK_SENSOR]):.3g}")
            x, y = column.rows(BATCH)
            xs = (x - mean) / (std + 1e-8)
            loss = F.mse_loss(model(xs), y)
            opt.zero_grad()
            loss.backward()
            raw = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
            g_first = float(model.net[0].weight.grad.norm())
            opt.step()
            rec.step(loss=loss)
            sat1 = float((acts[1].abs() > 0.99).float().mean())
            sat2 = float((acts[3].abs() > 0.99).float().mean())
            log.append((step, loss.item(), raw, g_first, sat1, sat2, float(xs.abs().max())))
    for h in hooks:
        h.remove()

    def med(v: list) -> float:
        return sorted(v)[len(v) // 2]

    for s in range(0, STEPS, 50):
        w = log[s:s + 50]
        print(f"steps {s:3d}-{s + 49:3d}: loss median {med([r[1] for r in w]):.4f} "
              f"[{min(r[1] for r in w):.4f}, {max(r[1] for r in w):.4f}]  grad norm median "
              f"{med([r[2] for r in w]):.4g} [{min(r[2] for r in w):.4g}, "
              f"{max(r[2] for r in w):.4g}]  net.0.weight grad median {med([r[3] for r in w]):.3g}"
              f"  |tanh|>0.99: net.1 {med([r[4] for r in w]):.3f} net.3 "
              f"{med([r[5] for r in w]):.3f}  max |input| {med([r[6] for r in w]):.3g}")
    for r in log[STUCK_AT - 2:STUCK_AT + 4]:
        print(f"step {r[0]}: loss {r[1]:.4f} grad norm {r[2]:.4g} net.1 saturated {r[4]:.3f} "
              f"net.3 saturated {r[5]:.3f} max |input| {r[6]:.3g}")


if __name__ == "__main__":
    main()
