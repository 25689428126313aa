"""Modern Hopfield associative memory recalling corrupted bit patterns; LR decays per batch to ~0.

What it does: 24 random 48-bit prototype patterns; each sample is one prototype with 15% of
its bits flipped, mapped to +-1 and with Gaussian noise (sd 0.3) added, fresh every step
(batch 64, 350 steps). The model is one continuous modern-Hopfield retrieval step (Ramsauer
et al., "Hopfield Networks is All You Need"): a linear query, softmax attention with a
learned inverse temperature over 64 learned stored patterns (keys), their learned values,
and a linear readout of 48 bit logits; BCE against the clean prototype. Adam lr 3e-2 with a
``LambdaLR`` linear decay ``1 - t / 350`` stepped after EVERY batch, by design: 3e-2 at step
0, 1.5e-2 at step 175, 2.1e-3 at step 325 and 8.6e-5 at the last step (349). Recorded with
the standard preset (profiler off).

What is TRUE of the run (measured, 25-step windows):
- Median loss 0.442 (steps 0-24), 0.249 (25-49), 0.129 (75-99), 0.106 (125-149), 0.068
  (175-199), 0.029 (225-249), then 0.013-0.019 from step 250 to the end (0.0134 in steps
  325-349); bit error 0.18 -> 0.005. The last ~100 steps flatten as the learning rate runs
  down to ~0: the annealed end of a linear schedule. The same model at a constant lr 3e-2
  ends at the same level (0.0136), so the decay costs nothing.
- Near zero loss the per-step loss is noisy in relative terms: over steps 250-349 the
  median is 0.016, single steps range 0.004-0.085, and 6 isolated steps (251, 271, 290,
  296, 316, 334) are above 3x the median (0.048-0.085), never two in a row: a BCE over 64
  fresh noisy samples near zero loss.
- Gradient norms: window medians 0.07-0.44 (max 0.71 at steps 25-49, while the memory
  forms), falling slowly afterwards; no growth. No NaN/Inf. ~6 s on 2 CPU cores; steps take
  1-2 ms.
- Healthy: the per-batch decay to ~1e-4, the tiny late updates, the flat late loss and the
  relative loss noise near zero are the design, not a plateau, a vanishing gradient, a
  spike or a stuck optimizer.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
    "forbidden": ["loss_plateau", "vanishing_gradient", "update_ratio", "loss_spike",
                  "loss_divergence", "gradient_explosion", "nonfinite"],
}

DIM, PROTOS, SLOTS, BATCH, STEPS = 48, 24, 64, 64, 350
LR0, FLIP = 3e-2, 0.15


class HopfieldRecall(nn.Module):
    """One continuous Hopfield update (Ramsauer et al.): the projected state attends to learned
    stored patterns (keys) with a learned inverse temperature and is replaced by their values."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(DIM, DIM)
        self.keys = nn.Parameter(torch.randn(SLOTS, DIM) / DIM ** 0.5)
        self.values = nn.Parameter(torch.randn(SLOTS, DIM) / DIM ** 0.5)
        self.log_beta = nn.Parameter(torch.tensor(1.0))
        self.readout = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn = torch.softmax(self.log_beta.exp() * self.query(x) @ self.keys.T, dim=-1)
        return self.readout(attn @ self.values)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    protos = (torch.rand(PROTOS, DIM, generator=g) < 0.5).float()

    model = HopfieldRecall()
    opt = torch.optim.Adam(model.parameters(), lr=LR0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 - t / STEPS)
    losses, lrs, errs = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for _ in range(STEPS):
            idx = torch.randint(0, PROTOS, (BATCH,), generator=g)
            clean = protos[idx]
            flips = (torch.rand(BATCH, DIM, generator=g) < FLIP).float()
            noisy = (clean - flips).abs() * 2 - 1 + 0.3 * torch.randn(BATCH, DIM, generator=g)
            logits = model(noisy)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, clean)
            bit_err = ((logits > 0).float() != clean).float().mean()
            opt.zero_grad()
            loss.backward()
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            rec.step(loss=loss, bit_error=bit_err)
            sched.step()
            losses.append(loss.item())
            errs.append(bit_err.item())
    for a in range(0, STEPS, 25):
        w, e = sorted(losses[a:a + 25]), sorted(errs[a:a + 25])
        print(f"steps {a:3d}-{a + 24:3d}: median loss {w[12]:.4f}  bit error {e[12]:.3f}  "
              f"lr {lrs[a]:.2e}")


if __name__ == "__main__":
    main()
