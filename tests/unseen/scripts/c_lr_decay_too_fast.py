"""Tiny RMSNorm Transformer LM whose per-epoch LR decay is stepped every batch.

A 2-layer pre-norm decoder-only Transformer (RMSNorm, causal self-attention, d=48) learns
sequences of 32 tokens from a 16-token first-order Markov source with peaked transitions
(entropy 1.07 nats; uniform is 2.77). AdamW lr 2e-3, 500 steps of 16 sequences. The schedule
was written per epoch, LambdaLR(lambda e: 0.85 ** e), but `sched.step()` sits in the batch
loop, so the LR shrinks x0.85 every step: 1% of its initial value at step 29, 1e-3 at step
43, below 1e-7 of it from step 100 on (the first 20% of the run).

Measured (5-step means): the loss falls from 2.9 (step 0) through 2.51 (steps 0-4), 1.86
(5-9), 1.72 (10-14), 1.71 (15-19) to 1.63 (20-24), and from there on it stays at 1.6-1.7 to
the end (steps 475-499 likewise). The same code at a constant LR reaches 1.04 by steps 25-49
and ~0.98 after that, so the model is far from converged (0.6 nats above what it reaches)
when learning stops. Gradient norms stay finite and level (~0.85): nothing vanishes in the
model; the updates vanish because the LR does.

What is true of the run: a loss plateau from about step 20 on (where learning stopped), at a
far-from-converged loss, caused by the LR schedule decaying to ~0 within the first 20% of the
run.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_plateau", "first_step": 20, "tolerance": 25, "top": True},
    ],
    "forbidden": ["gradient_explosion", "loss_divergence", "nonfinite"],
}

STEPS = 500
BATCH = 16
SEQ = 32
VOCAB = 16
D = 48


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, d, heads=4):
        super().__init__()
        self.norm1 = RMSNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = RMSNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(SEQ, D) * 0.02)
        self.blocks = nn.ModuleList([Block(D), Block(D)])
        self.norm = RMSNorm(D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), 1)
        x = self.tok(idx) + self.pos[:t]
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.norm(x))


def markov_source(gen):
    logits = torch.randn(VOCAB, VOCAB, generator=gen) * 3.0
    return logits.softmax(-1)


def sample(trans, n, gen):
    seq = torch.randint(0, VOCAB, (n, SEQ + 1), generator=gen)
    for t in range(1, SEQ + 1):
        seq[:, t] = torch.multinomial(trans[seq[:, t - 1]], 1, generator=gen)[:, 0]
    return seq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    trans = markov_source(gen)
    data = sample(trans, STEPS * BATCH, gen)
    ent = -(trans * trans.log()).sum(-1).mean().item()
    print(f"source entropy {ent:.3f} nats (uniform {math.log(VOCAB):.3f})")
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.85 ** e)  # meant per epoch
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        for step in range(STEPS):
            seq = data[step * BATCH:(step + 1) * BATCH]
            logits = model(seq[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()  # the bug: per batch instead of per epoch
            rec.step(loss=loss)
            if step % 25 == 0:
                print(f"step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.3g}",
                      flush=True)


if __name__ == "__main__":
    main()
