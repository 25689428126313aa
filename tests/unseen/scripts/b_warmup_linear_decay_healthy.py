"""Tiny GPT-style causal LM learning to reverse a sequence; warm-up, linear decay, clipping.

What it does: each example is [a1 .. a8, SEP, a8 .. a1] over 16 symbols (+ SEP), and a
decoder-only transformer (token + learned position embeddings, 2 pre-LayerNorm blocks of
causal multi-head self-attention, 4 heads, d=64, and a GELU MLP, final LayerNorm, tied
output projection) is trained with next-token cross-entropy on the 8 reversed positions only
(the first half is random and not predictable). AdamW (lr 2e-3, betas 0.9/0.95, wd 0.1 on
matrices only), linear warm-up over 30 steps then linear decay to 0 at step 300, gradient
clipping at a global norm of 1.0, batch 64 of fresh sequences, 300 optimizer steps.

What is TRUE of the run: healthy. The loss starts at ~ln(17) = 2.8, falls slowly during
warm-up, then quickly between steps ~30 and ~80 as the model learns to attend to the mirrored
position, and approaches 0 (~0.001 from step ~200): the task is solved, and the loss levels
off at the end because it is near zero and the LR goes to zero (convergence, not a plateau
problem). The gradient norm shrinks with the loss (~1 -> ~0.002): a solved task, not
vanishing gradients. Clipping bounds the update; the recorded pre-clip gradient norms are
ordinary (the few above 1.0 early are what clipping is for, not an explosion). No finding
above info is expected.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": [],
          "forbidden": ["gradient_explosion", "vanishing_gradient", "loss_spike", "loss_plateau",
                        "loss_divergence"]}

STEPS, WARMUP, PEAK_LR, BATCH = 300, 30, 2e-3, 64
HALF, SYMBOLS, D, HEADS = 8, 16, 64, 4
SEP, VOCAB, T = SYMBOLS, SYMBOLS + 1, 2 * HALF + 1


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // HEADS)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(T, D)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f = nn.LayerNorm(D)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        return self.ln_f(self.blocks(x)) @ self.wte.weight.T      # tied output projection


def batch(g):
    a = torch.randint(0, SYMBOLS, (BATCH, HALF), generator=g)
    seq = torch.cat([a, torch.full((BATCH, 1), SEP), a.flip(1)], 1)
    return seq[:, :-1], seq[:, 1:]


def lr_at(step):
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    return PEAK_LR * max(0.0, (STEPS - step) / (STEPS - WARMUP))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    model = TinyGPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr_at(0), betas=(0.9, 0.95))
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step in range(STEPS):
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            inp, tgt = batch(g)
            logits = model(inp)[:, HALF:]                 # predictions of the reversed half
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt[:, HALF:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step == STEPS - 1:
                print(step, f"lr {lr_at(step):.2e}", round(loss.item(), 4))


if __name__ == "__main__":
    main()
