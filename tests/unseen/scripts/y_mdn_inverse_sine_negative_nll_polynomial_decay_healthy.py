"""Mixture density network (Bishop 1994) on the classic inverse problem: the data are
y ~ U(0, 1), x = y + 0.3 sin(2 pi y) + N(0, 0.05^2), and the model predicts p(y | x), which is
multi-modal (up to three branches for x in ~0.3..0.7). MLP 1 -> 64 -> 64 (tanh) -> 5
Gaussian components (mixture logits, means, log-scales clamped to [-7, 2]); the loss is the
negative log-likelihood, which for a good fit of such a narrow conditional density is
NEGATIVE (a density above 1). For reference (printed): a single Gaussian fitted to y alone
(ignoring x) scores +0.177, the uniform density on [0, 1] scores 0.

Data: 20,000 training pairs in a TensorDataset, shuffled DataLoader (batch 128, seeded)
wrapped by rec.wrap_loader; 500 steps (3.2 epochs); 4,000 held-out pairs.

Loop: Adam (lr 3e-3), PolynomialLR(total_iters 500, power 2): lr 3e-3 * (1 - step/500)^2,
3e-3 at step 0, 7.5e-4 at 250, 1.2e-7 at step 499.

What is TRUE of the run (measured by this script with plain torch, printed below):
- LR 3e-3 at step 0, 7.5e-4 at 250, 1.2e-4 at 400, 1.2e-8 at step 499 (quadratic decay).
- NLL 1.105 at step 0, below 0 from step 11, -0.52 at step 50, -0.79 at 100; 50-step window
  means -0.168, -0.686, -0.931, -0.973, -1.041, -1.035, -1.070, -1.078, -1.081, -1.096 —
  still improving slowly as the lr decays to zero; per-step spread about +-0.2.
- Gradient norm 1.3 at step 0, then large as the component scales shrink (window medians
  11-33, max 77 at steps 100-149; 13 median, 28 max in the last window) — normal for an
  MDN with narrow components, no trend upward, no instability. No NaN/Inf.
- Held-out NLL -1.083 at the end. At x = 0.5 the mixture has three components of weight >
  0.05 at y = 0.221, 0.502, 0.777 (weights 0.26, 0.45, 0.26): the three true branches.
- Healthy: the loss going negative is expected for a density model; nothing to report.
- About 7 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, COMP = 500, 128, 5


def inverse_sine(n, g):
    y = torch.rand(n, 1, generator=g)
    x = y + 0.3 * torch.sin(2 * math.pi * y) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


class MDN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi, self.mu, self.log_sigma = (nn.Linear(64, COMP), nn.Linear(64, COMP),
                                            nn.Linear(64, COMP))

    def forward(self, x):
        h = self.body(x)
        return (F.log_softmax(self.pi(h), -1), self.mu(h),
                self.log_sigma(h).clamp(-7.0, 2.0))


def nll(params, y):
    log_pi, mu, log_sigma = params
    z = (y - mu) / log_sigma.exp()
    log_n = -0.5 * z * z - log_sigma - 0.5 * math.log(2 * math.pi)
    return -torch.logsumexp(log_pi + log_n, -1).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(12)
    xtr, ytr = inverse_sine(20_000, g)
    xva, yva = inverse_sine(4_000, g)
    uncond = -(-0.5 * math.log(2 * math.pi * ytr.var().item()) - 0.5)
    print(f"[ref] NLL of one Gaussian fitted to y alone (ignores x): {uncond:.4f}; of U(0, 1): 0")
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(8))
    model = MDN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.PolynomialLR(opt, total_iters=STEPS, power=2.0)
    rows = []
    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        while step < STEPS:
            for x, y in rec.wrap_loader(loader):
                lr = opt.param_groups[0]["lr"]
                loss = nll(model(x), y)
                opt.zero_grad()
                loss.backward()
                gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item()
                opt.step()
                sched.step()
                rec.step(loss=loss, lr=lr)
                rows.append((step, loss.item(), gn, lr))
                if step % 25 == 0:
                    print(f"step {step} lr {lr:.2e} nll {loss.item():.4f} grad_norm {gn:.3g}",
                          flush=True)
                step += 1
                if step >= STEPS:
                    break
    with torch.no_grad():
        val = nll(model(xva), yva).item()
        log_pi, mu, _ = model(torch.tensor([[0.5]]))
        modes = sorted((round(m, 3), round(p, 3)) for m, p in
                       zip(mu[0].tolist(), log_pi[0].exp().tolist(), strict=True) if p > 0.05)
    for a in range(0, STEPS, 50):
        part = rows[a:a + 50]
        print(f"[win] steps {a}-{a + 49}: lr {part[0][3]:.2e}..{part[-1][3]:.2e}; nll mean "
              f"{sum(r[1] for r in part) / 50:.4f} min {min(r[1] for r in part):.4f} max "
              f"{max(r[1] for r in part):.4f}; grad norm median "
              f"{sorted(r[2] for r in part)[25]:.3g} max {max(r[2] for r in part):.3g}")
    first_neg = next((r[0] for r in rows if r[1] < 0), None)
    print(f"[end] held-out nll {val:.4f}; first negative training nll at step {first_neg}; "
          f"components with weight > 0.05 at x = 0.5 (mean, weight): {modes}; nonfinite "
          f"{sum(not math.isfinite(r[1]) for r in rows)}")


if __name__ == "__main__":
    main()
