"""WaveNet-style autoregressive model (van den Oord et al. 2016, scaled down) predicting the
next mu-law sample (64 levels) of synthetic audio: Embedding(64, 32) -> causal conv (k=2) ->
two stacks of gated dilated causal conv layers (dilations 1, 2, 4, 8, 16; tanh * sigmoid
gates; 32 residual and 64 skip channels) -> ReLU -> 1x1 conv 64 -> ReLU -> 1x1 conv 64
logits. Receptive field 63 samples.

Data: a map-style Dataset of 4,000 clips of 257 samples made on demand from the index (two
sinusoids at random frequencies 0.02-0.12 cycles/sample with random phases and a slow
amplitude envelope, plus Gaussian noise 0.04), mu-law encoded to 64 levels. A shuffled
DataLoader (batch 8, seeded) wrapped by rec.wrap_loader feeds micro-batches.

Loop: gradient accumulation over 2 micro-batches per optimizer step (each micro-batch loss
divided by 2), gradient clipping at 1.0, Adam with OneCycleLR (max_lr 3e-3, 300 steps,
pct_start 0.3, cosine; div_factor 25, final_div_factor 1e4) stepped once per optimizer step.
300 optimizer steps (600 micro-batches, 1.2 epochs). rec.step once per optimizer step with
the step's mean loss and the lr it used.

What is TRUE of the run (measured by this script with plain torch, printed below):
- LR (OneCycle): 1.2e-4 at step 0, rising to the 3.0e-3 peak at step 89, cosine down to
  1.4e-3 at 200 and 1.2e-8 at step 299.
- Loss (ln 64 = 4.159 at chance): 4.16 at step 0, ~4.1 during the low-lr warm-up (4.10 at
  step 25), then drops as the lr rises: 3.66 at 50, 2.93 at 75, 2.67 at 100. 50-step window
  means 4.030, 3.031, 2.637, 2.570, 2.531, 2.514 — still improving at the end, flattening as
  the lr anneals to zero (the noise floor of mu-law-quantised noisy audio is well above 0).
- Gradient norm (before clipping, accumulated over the 2 micro-batches) 0.13 at step 0,
  window medians 0.19, 0.86, 0.94, 0.78, 0.63, 0.54; max 1.88 (step 50-99, at the lr peak).
  No NaN/Inf.
- Healthy: a textbook one-cycle curve; nothing to report.
- About 25 s on 2 cores (1 thread).
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, ACCUM, BATCH, Q, LEN, N = 300, 2, 8, 64, 257, 4000


def mu_law(x, q=Q):
    mu = q - 1
    y = torch.sign(x) * torch.log1p(mu * x.abs()) / math.log1p(mu)
    return ((y + 1) / 2 * mu + 0.5).long().clamp(0, mu)


class Clips(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(70_000 + i)
        t = torch.arange(LEN, dtype=torch.float32)
        f = 0.02 + 0.10 * torch.rand(2, generator=g)
        ph = 2 * math.pi * torch.rand(2, generator=g)
        env = 0.6 + 0.3 * torch.sin(2 * math.pi * t / LEN + ph[0])
        x = env * (0.55 * torch.sin(2 * math.pi * f[0] * t + ph[0])
                   + 0.35 * torch.sin(2 * math.pi * f[1] * t + ph[1]))
        x = (x + 0.04 * torch.randn(LEN, generator=g)).clamp(-1, 1)
        return mu_law(x)


class GatedLayer(nn.Module):
    def __init__(self, res, skip, dilation):
        super().__init__()
        self.dilation = dilation
        self.conv = nn.Conv1d(res, 2 * res, 2, dilation=dilation)
        self.res_out, self.skip_out = nn.Conv1d(res, res, 1), nn.Conv1d(res, skip, 1)

    def forward(self, x):
        h = self.conv(F.pad(x, (self.dilation, 0)))          # causal: pad on the left
        a, b = h.chunk(2, 1)
        z = torch.tanh(a) * torch.sigmoid(b)
        return x + self.res_out(z), self.skip_out(z)


class WaveNet(nn.Module):
    def __init__(self, res=32, skip=64):
        super().__init__()
        self.embed = nn.Embedding(Q, res)
        self.causal = nn.Conv1d(res, res, 2)
        self.layers = nn.ModuleList(GatedLayer(res, skip, 2 ** i)
                                    for _ in range(2) for i in range(5))
        self.out1, self.out2 = nn.Conv1d(skip, skip, 1), nn.Conv1d(skip, Q, 1)

    def forward(self, tok):
        x = self.causal(F.pad(self.embed(tok).transpose(1, 2), (1, 0)))
        skips = 0
        for layer in self.layers:
            x, s = layer(x)
            skips = skips + s
        return self.out2(F.relu(self.out1(F.relu(skips))))     # (B, Q, T)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Clips(), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(9))
    model = WaveNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=STEPS,
                                                pct_start=0.3)
    rows = []
    step, micro, acc_loss = 0, 0, 0.0
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        while step < STEPS:
            for tok in rec.wrap_loader(loader):
                logits = model(tok[:, :-1])
                loss = F.cross_entropy(logits, tok[:, 1:])
                (loss / ACCUM).backward()
                acc_loss += loss.item() / ACCUM
                micro += 1
                if micro % ACCUM:
                    continue
                lr = opt.param_groups[0]["lr"]
                gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
                opt.step()
                sched.step()
                opt.zero_grad()
                rec.step(loss=acc_loss, lr=lr)
                rows.append((step, acc_loss, gn, lr))
                if step % 25 == 0 or step == STEPS - 1:
                    print(f"step {step} lr {lr:.2e} loss {acc_loss:.4f} grad_norm {gn:.3g}",
                          flush=True)
                acc_loss = 0.0
                step += 1
                if step >= STEPS:
                    break
    for a in range(0, STEPS, 50):
        part = rows[a:a + 50]
        print(f"[win] steps {a}-{a + 49}: lr {part[0][3]:.2e}..{part[-1][3]:.2e}; loss mean "
              f"{sum(r[1] for r in part) / 50:.4f} min {min(r[1] for r in part):.4f} max "
              f"{max(r[1] for r in part):.4f}; grad norm median "
              f"{sorted(r[2] for r in part)[25]:.3g} max {max(r[2] for r in part):.3g}")
    peak = max(rows, key=lambda r: r[3])
    print(f"[lr] peak {peak[3]:.2e} at step {peak[0]}; first {rows[0][3]:.2e}; last "
          f"{rows[-1][3]:.2e}; nonfinite losses {sum(not math.isfinite(r[1]) for r in rows)}; "
          f"ln {Q} = {math.log(Q):.3f}")


if __name__ == "__main__":
    main()
