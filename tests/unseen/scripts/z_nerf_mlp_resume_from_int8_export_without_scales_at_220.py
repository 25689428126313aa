"""NeRF-style radiance field (Mildenhall et al. 2020, shrunk): positional encoding of the 3-D
sample point (6 frequencies) into a 4-layer ReLU MLP of width 96 giving density (softplus)
and a feature, concatenated with the encoded view direction (2 frequencies) into a 48-unit
colour head (sigmoid). Rays are rendered by alpha compositing 24 stratified samples between
near 2 and far 6. Scene: an orange sphere and a blue box in front of a grey backdrop, seen
from cameras on a circle; ground-truth pixel colours are ray-cast analytically. MSE on the
rendered colour, Adam(5e-4), 256 rays per batch, 400 steps.

What changes at step 220: a BUG. At step 220 the job restarts from the "checkpoint" that the
export path wrote: per-tensor symmetric int8 quantisation (q = round(w / s), s = max|w|/127),
and the resume code loads ``q.float()`` without multiplying by ``s``. Every weight and bias
is multiplied by 127 / max|w| of its tensor, at least ~500x (each tensor's largest entry
becomes 127; the largest weight anywhere was 0.251). The optimizer state is kept. Densities and
pre-sigmoid colours blow up so far that
alpha = 1 and the sigmoids saturate exactly in float32: the renders become flat colours, the
loss jumps x19 and stays there, and the gradients are exactly zero from step 220 on (the
network is dead, so it never trains back). An expert wants the loss leaving its level at 220
and never returning flagged; the gradient norm does NOT explode (it drops to 0).

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows):
- loss: median 0.00746 over steps 200-219, 0.1385 over 220-239 (x18.6), 0.1398 over 240-259,
  0.1366 over the last 20; values 0.00750 at 219, 0.1388 at 220, 0.1361 at 221. 40-step
  medians 0.0551 0.0474 0.0283 0.0163 0.0088 | 0.064 (steps 200-239) 0.139 0.139 0.137 0.137.
- grad norm: median 0.0277 over 200-219, then exactly 0.0 at every step from 220 to 399
  (0.0370 at 219).
- PSNR: 21.3 dB over 200-219, 8.6 dB from 220 on.
- LR constant 5e-4. No NaN or inf. About 18-23 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "loss_divergence", "first_step": 220, "tolerance": 1}],
          "forbidden": ["gradient_explosion"]}

STEPS, RAYS, SAMPLES, SWITCH, NEAR, FAR = 400, 256, 24, 220, 2.0, 6.0


def encode(x, n_freq):
    out = [x]
    for k in range(n_freq):
        out += [torch.sin((2.0 ** k) * math.pi * x), torch.cos((2.0 ** k) * math.pi * x)]
    return torch.cat(out, -1)


class RadianceField(nn.Module):
    def __init__(self):
        super().__init__()
        pin, din = 3 + 3 * 2 * 6, 3 + 3 * 2 * 2
        self.trunk = nn.Sequential(nn.Linear(pin, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(),
                                   nn.Linear(96, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU())
        self.sigma = nn.Linear(96, 1)
        self.feat = nn.Linear(96, 96)
        self.rgb = nn.Sequential(nn.Linear(96 + din, 48), nn.ReLU(), nn.Linear(48, 3))

    def forward(self, pts, dirs):
        h = self.trunk(encode(pts, 6))
        sigma = F.softplus(self.sigma(h).squeeze(-1) - 1.0)
        rgb = torch.sigmoid(self.rgb(torch.cat([self.feat(h), encode(dirs, 2)], -1)))
        return sigma, rgb


def render(model, origins, dirs, g):
    t = torch.linspace(NEAR, FAR, SAMPLES + 1)
    lo, hi = t[:-1], t[1:]
    z = lo + (hi - lo) * torch.rand(origins.shape[0], SAMPLES, generator=g)
    pts = origins[:, None] + dirs[:, None] * z[..., None]
    sigma, rgb = model(pts / 2.0, dirs[:, None].expand_as(pts))
    delta = torch.cat([z[:, 1:] - z[:, :-1], torch.full_like(z[:, :1], 0.1)], 1)
    alpha = 1 - torch.exp(-sigma * delta)
    trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha + 1e-10], 1),
                          1)[:, :-1]
    w = alpha * trans
    return (w[..., None] * rgb).sum(1) + (1 - w.sum(1, keepdim=True)) * 0.5


def ground_truth(origins, dirs):
    """Analytic ray cast: sphere (centre (0.4,0,0), r 0.7, orange) and an axis-aligned box
    ([-1,-0.2]x[-0.5,0.5]x[-0.4,0.4], blue), grey (0.5) where the ray misses both."""
    col = torch.full_like(origins, 0.5)
    best = torch.full((origins.shape[0],), float("inf"))
    oc = origins - torch.tensor([0.4, 0.0, 0.0])
    b = (oc * dirs).sum(1)
    disc = b * b - (oc * oc).sum(1) + 0.49
    ts = -b - disc.clamp(min=0).sqrt()
    hit = (disc > 0) & (ts > 0)
    shade = 0.6 + 0.4 * (-(dirs[:, 2]).clamp(-1, 1))
    col[hit] = torch.tensor([1.0, 0.55, 0.1]) * shade[hit, None]
    best[hit] = ts[hit]
    lo, hi = torch.tensor([-1.0, -0.5, -0.4]), torch.tensor([-0.2, 0.5, 0.4])
    inv = 1.0 / torch.where(dirs.abs() < 1e-6, torch.full_like(dirs, 1e-6), dirs)
    t1, t2 = (lo - origins) * inv, (hi - origins) * inv
    tn, tf = torch.minimum(t1, t2).max(1).values, torch.maximum(t1, t2).min(1).values
    hitb = (tn < tf) & (tn > 0) & (tn < best)
    col[hitb] = torch.tensor([0.15, 0.3, 0.9])
    return col


def rays(g):
    ang = 2 * math.pi * torch.rand(RAYS, generator=g)
    origins = torch.stack([4 * torch.cos(ang), 4 * torch.sin(ang), 0.6 * torch.randn(
        RAYS, generator=g)], 1)
    target = 0.5 * torch.randn(RAYS, 3, generator=g)
    dirs = F.normalize(target - origins, dim=1)
    return origins, dirs, ground_truth(origins, dirs)


def resume_from_int8_export(model):
    """The buggy resume: per-tensor symmetric int8 export, loaded without the scales."""
    with torch.no_grad():
        for p in model.parameters():
            s = p.abs().max() / 127
            p.copy_(torch.round(p / s))      # should be torch.round(p / s) * s


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
    g = torch.Generator().manual_seed(31)
    model = RadianceField()
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    out = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            if step == SWITCH:
                before = max(p.abs().max().item() for p in model.parameters())
                resume_from_int8_export(model)
                rec.event("resume", "weights reloaded from the int8 export", severity="info")
                print(f"resumed at {step}: max |w| {before:.3f} -> "
                      f"{max(p.abs().max().item() for p in model.parameters()):.1f}")
            origins, dirs, target = rays(g)
            pred = render(model, origins, dirs, g)
            loss = F.mse_loss(pred, target)
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            psnr = -10 * math.log10(max(loss.item(), 1e-12))
            rec.step(loss=loss, psnr=psnr)
            out.append((loss.item(), gn, psnr))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4g} psnr {psnr:.2f} gnorm {gn:.4g}",
                      flush=True)
    report(SWITCH, out, ("loss", "gnorm", "psnr"))


if __name__ == "__main__":
    main()
