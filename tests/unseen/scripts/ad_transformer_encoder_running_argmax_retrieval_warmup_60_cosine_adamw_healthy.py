"""Small causal transformer encoder (input projection 8 -> 64, learned positions, two pre-LN
TransformerEncoderLayers, 4 heads, FFN 128, no dropout, linear head 64 -> 8) on a synthetic
retrieval regression: sequences of 24 random 8-d vectors; the target at position t is
tanh(v @ W) of the vector v, among positions 0..t, whose first feature is the largest so far
(attention has to find the running argmax and copy its vector), plus target noise sd 0.3, so
the MSE floor is 0.09. Fresh batch of 32 every step. AdamW (weight decay 0.01), no clipping,
500 steps. Schedule: linear warm-up over 60 steps to 3e-2 (lr 5e-4 at step 0, 0.0155 at 30,
0.03 at 60), then cosine to 0 at step 500.

What happens: the loss falls fast in the first 30 steps; in the last third of the warm-up
(steps ~40-59, lr 0.02-0.03) the growing lr makes it rise ~15% for about 20 steps (a
warm-up-end bump, the optimiser briefly overshooting as the step size keeps growing); once
the lr stops growing the loss comes back within 10 steps and keeps falling through the cosine
decay to just above the noise floor. The gradient norm does not grow during the bump (it
stays 0.57-0.64 per 10 steps, below the ~1.2 of the first 10 steps) and falls afterwards.
HEALTHY: the bump is the schedule's and it is absorbed.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Loss 0.793 at step 0; 10-step medians 0.514 (0-9), 0.339 (10-19), 0.237 (20-29), 0.211
  (30-39).
- Bump: 0.233 (40-49), 0.246 (50-59); single steps 0.186 (30), 0.221 (40), 0.226 (45), 0.292
  (50, the largest ratio to the previous 20 steps' median in the run, x1.33), 0.230 (55).
  Back to 0.201 (60-69), 0.192 (70-79), 0.170 (80-89).
- Then 0.155-0.165 (130-169), 0.126-0.144 (190-249), 0.115-0.12 (280-319), 0.105-0.115
  (330-419), 0.097-0.103 (420-499); last-20 median 0.0975.
- Grad norm 10-step medians 1.19 (0-9), 0.63, 0.69, 0.62, 0.57 (40-49), 0.64 (50-59), 0.48
  (60-69), 0.40-0.42 (80-129), 0.21-0.37 (130-399), 0.09-0.17 (400-499); max 2.02 at step 0;
  largest single-step ratio to the previous 20 steps' median x3.5 at step 477 (0.41, a noisy
  batch at lr 3e-4).
- No NaN/Inf. About 9 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [],
          "forbidden": ["gradient_explosion", "loss_divergence", "nonfinite"]}

STEPS, BATCH, SEQ, DIN = 500, 32, 24, 8
DIM, HEADS, LAYERS = 64, 4, 2
WARMUP, PEAK_LR, NOISE = 60, 3e-2, 0.3


class RetrievalEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(DIN, DIM)
        self.pos = nn.Parameter(0.02 * torch.randn(SEQ, DIM))
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 128, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, DIN)
        self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), float("-inf")), 1))

    def forward(self, x):
        return self.head(self.enc(self.inp(x) + self.pos, mask=self.mask))


def retrieval_batch(w, g):
    """Sequences of 24 random 8-d vectors. The target at position t is tanh(v @ W) of the
    vector v, among positions 0..t, whose first feature is largest so far (a causal
    'retrieve the running argmax' task), plus target noise sd 0.3 (MSE floor 0.09)."""
    x = torch.randn(BATCH, SEQ, DIN, generator=g)
    idx = torch.cummax(x[:, :, 0], 1).indices
    v = torch.gather(x, 1, idx[:, :, None].expand(-1, -1, DIN))
    return x, torch.tanh(v @ w) + NOISE * torch.randn(BATCH, SEQ, DIN, generator=g)


def lr_lambda(step):
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))


def facts(rows):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    lr = [r[2] for r in rows]
    print(f"[all] nonfinite {sum(not math.isfinite(v) for v in loss + gn)}; "
          f"loss step 0 {loss[0]:.4g}, last 20 median {med(loss[-20:]):.4g}; max grad "
          f"{max(gn):.4g} at {max(range(len(gn)), key=gn.__getitem__)}")
    worst = max(range(20, len(gn)), key=lambda i: gn[i] / med(gn[i - 20:i]))
    print(f"[grad] largest ratio to previous-20 median: {gn[worst] / med(gn[worst - 20:worst]):.3g}"
          f" at {worst}")
    worstl = max(range(20, len(loss)), key=lambda i: loss[i] / med(loss[i - 20:i]))
    print(f"[loss] largest ratio to previous-20 median: "
          f"{loss[worstl] / med(loss[worstl - 20:worstl]):.3g} at {worstl}")
    for a in range(0, len(rows), 10):
        print(f"[win] {a}-{a + 9}: lr {lr[a]:.4g} loss {med(loss[a:a + 10]):.4g} "
              f"max {max(loss[a:a + 10]):.4g} grad {med(gn[a:a + 10]):.4g} max grad "
              f"{max(gn[a:a + 10]):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(8)
    w = torch.randn(DIN, DIN, generator=g) / math.sqrt(DIN)
    model = RetrievalEncoder()
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            x, y = retrieval_batch(w, g)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn, lr))
            if step % 50 == 0 or (30 <= step <= 80 and step % 5 == 0):
                print(f"step {step} lr {lr:.5f} loss {loss.item():.4f} grad_norm {gn:.4g}",
                      flush=True)
    facts(rows)


if __name__ == "__main__":
    main()
