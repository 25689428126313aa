"""Key-value retrieval with Flamingo-style tanh-gated cross-attention (gates initialised at 0);
one context reading of one batch is a FLT_MAX "missing" sentinel, and the loss is NaN from
that step on.

What it does: 300 steps of 64 examples. Each example has a context of 8 distinct keys (of 32)
each with a 4-d sensor reading ~N(0, 1), and 4 queries naming context keys; the target is
the queried keys' readings (MSE). Model: key embeddings, one pre-norm self-attention layer
over the queries, then 2 gated cross-attention blocks x + tanh(a) * xattn(x, ctx) and
x + tanh(b) * ffn(x) with a = b = 0 at init (each block starts as the identity and its
weights get no gradient), context = key embedding + linear(reading), LayerNorm + linear head.
AdamW(wd 0.01), linear warmup over 30 steps to 2e-3, cosine decay to 0; no clipping.

At step BAD_STEP = 230 one reading in the batch (example 17, context slot 3, channel 1) is
3.4028e38 = float32 max: the exporter's sentinel for a missing value.

What is TRUE of the run (measured):
- Steps 0-229: healthy learning. The loss sits at ~1.0-1.2 (predicting the mean) while the
  gates open, drops sharply over steps ~40-60 (0.81 at step 40, 0.075 at step 60) once the
  cross-attention retrieves, and converges to ~0.005-0.012 (median 0.0074 over steps
  200-229). The cross-attention weights' gradients grow by orders of magnitude through this
  ordinary learning: xblocks.1.xattn.in_proj_weight 0 at step 0, 1.6e-5 at step 1, 2.6e-3
  at step 20, 0.081 at step 40 (x5000), then settling to ~0.006 as the loss converges
  (x370 its step-1 value at step 229); out_proj 1.9e-5 -> 0.044 -> 0.004. The total
  gradient norm is ~0.9-1 (median) over steps 0-79 with single steps up to 3.3 during the
  drop, then ~0.08-0.15 (median) over steps 80-229.
- Step 230: the sentinel overflows to inf in the context projection, the attention turns it
  into NaN, and the loss is NaN at step 230 itself (0.0078 at step 229); the gradients are
  non-finite too (the recorder's nonfinite_grads is 47 at that step). AdamW writes the NaN
  into every weight, so the loss and
  gradients are NaN on every step from 230 to 299 (70 steps). The root cause is at step 230:
  the first non-finite value is at exactly that step. Nothing wrong with memory, data
  loading or step times.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "nonfinite", "first_step": 230, "tolerance": 1, "top": True},
    ],
    "forbidden": ["memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, KEYS, CTX, QUERIES, VDIM, D = 300, 64, 32, 8, 4, 4, 64
WARMUP, PEAK_LR = 30, 2e-3
BAD_STEP, BAD_ROW = 230, 17
MISSING = torch.finfo(torch.float32).max    # the exporter's "missing reading" sentinel


class GatedCrossAttnBlock(nn.Module):
    """Flamingo-style: x + tanh(a_attn) * xattn(x, ctx), x + tanh(a_ff) * ffn(x), gates at 0.

    With the gates closed the block is the identity and its attention/FFN weights get no
    gradient; they start learning as the gates open."""

    def __init__(self, d, heads=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.xattn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(),
                                nn.Linear(2 * d, d))
        self.attn_gate = nn.Parameter(torch.zeros(1))
        self.ff_gate = nn.Parameter(torch.zeros(1))

    def forward(self, x, ctx):
        a, _ = self.xattn(self.norm(x), ctx, ctx, need_weights=False)
        x = x + torch.tanh(self.attn_gate) * a
        return x + torch.tanh(self.ff_gate) * self.ff(x)


class Retriever(nn.Module):
    def __init__(self):
        super().__init__()
        self.key_emb = nn.Embedding(KEYS, D)
        self.value_in = nn.Linear(VDIM, D)
        self.self_block = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0,
                                                     batch_first=True, norm_first=True)
        self.xblocks = nn.ModuleList(GatedCrossAttnBlock(D) for _ in range(2))
        self.out = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, VDIM))

    def forward(self, q_keys, c_keys, c_vals):
        ctx = self.key_emb(c_keys) + self.value_in(c_vals)
        x = self.self_block(self.key_emb(q_keys))
        for b in self.xblocks:
            x = b(x, ctx)
        return self.out(x)


def make_batches(n, g):
    """Each example: CTX distinct keys with a VDIM sensor reading each; QUERIES of those keys
    are asked for, and the target is their reading."""
    c_keys = torch.stack([torch.randperm(KEYS, generator=g)[:CTX] for _ in range(n)])
    c_vals = torch.randn(n, CTX, VDIM, generator=g)
    pick = torch.randint(0, CTX, (n, QUERIES), generator=g)
    q_keys = c_keys.gather(1, pick)
    target = c_vals.gather(1, pick[..., None].expand(-1, -1, VDIM))
    return q_keys, c_keys, c_vals, target


def lr_factor(step):
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    q_keys, c_keys, c_vals, target = make_batches(STEPS * BATCH, g)
    # One context reading in the batch at BAD_STEP was missing and exported as FLT_MAX.
    c_vals[BAD_STEP * BATCH + BAD_ROW, 3, 1] = MISSING
    model = Retriever()
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            sl = slice(step * BATCH, (step + 1) * BATCH)
            pred = model(q_keys[sl], c_keys[sl], c_vals[sl])
            loss = F.mse_loss(pred, target[sl])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            rec.step(loss=loss)
            if step % 20 == 0 or BAD_STEP - 1 <= step <= BAD_STEP + 2:
                gates = [round(torch.tanh(b.attn_gate).item(), 3) for b in model.xblocks]
                print(f"step {step} loss {loss.item():.4g} gates {gates}", flush=True)


if __name__ == "__main__":
    main()
