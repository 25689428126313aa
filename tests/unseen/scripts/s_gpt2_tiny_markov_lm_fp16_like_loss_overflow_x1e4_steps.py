"""Pathological: an fp16-style overflow of the loss on a few known steps of an otherwise
healthy language-model run. On steps 157, 158 and 311 the loss reduction "overflows" and
comes back 1e4 times too large (simulated: the loss tensor is multiplied by 1e4, as a
half-precision partial sum that saturated and was rescaled wrongly would); that value is
both logged and backpropagated. Gradient clipping (max norm 1.0) bounds the update of those
steps, so the weights are barely affected and the next step's loss is normal again.

What it does: a tiny GPT-2 (transformers GPT2LMHeadModel: 2 layers, 4 heads, width 64,
context 32, no dropout) learns sequences from a fixed random 32-symbol first-order Markov
chain (Dirichlet(0.1) rows, mean next-token entropy printed at start). Batch 16 sequences
of 32 tokens, fresh every step. AdamW(lr 3e-3, weight decay 0.01), 25-step linear warmup
then cosine decay to 10% at step 400; clip_grad_norm_(1.0); 400 steps.

What is TRUE of the run (measured; printed at the end):
- Loss 3.49 at step 0 (ln 32 = 3.47); 40-step window medians 2.626, 1.922, 1.869, 1.798,
  1.824, 1.815, 1.768, 1.777, 1.764, 1.756 (the chain's entropy is 1.73): it learns.
- The overflow steps: step 157 -> 18,043.9 and step 158 -> 18,547.9 (steps 154-156: 1.906,
  1.770, 1.777; 159-161: 1.868, 1.886, 1.769); step 311 -> 17,471.7 (308-310: 1.828, 1.731,
  1.708; 312-314: 1.814, 1.771, 1.807). These three are ~1e4 x the surrounding loss and the
  only values above 3.49 (step 0); every other step after step 10 is below 3.1 and after
  step 40 below 2.2. No NaN/Inf.
- Gradient norm before clipping: median 0.70; 7,777 at step 157, 6,001 at 158, 7,094 at
  311; 0.82 at 159 and 0.56 at 312 (clipped to 1.0, so the weights barely move).
- LR: 1.2e-4 at step 0, 3.0e-3 at 24, 1.79e-3 at 200, 3.0e-4 at 399.
"""

import argparse
import math

import torch
from torch import nn
from tracealyze.recorder import Recorder
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

OVERFLOW_STEPS = (157, 158, 311)

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 157, "tolerance": 1},
    ],
    "forbidden": ["nonfinite", "loss_divergence"],
}

STEPS, BATCH, VOCAB, CTX, WARMUP = 400, 16, 32, 32, 25


def report(losses, gnorms, lrs, k=10):
    n = len(losses) // k
    med = [round(sorted(losses[i * n:(i + 1) * n])[n // 2], 3) for i in range(k)]
    print("WINDOW_MEDIANS", med)
    mx = [max(range(i * n, (i + 1) * n), key=lambda j: losses[j]) for i in range(k)]
    print("WINDOW_MAX (step, loss)", [(j, round(losses[j], 2)) for j in mx])
    top = sorted(range(len(losses)), key=lambda i: -losses[i])[:6]
    print("TOP_LOSSES (step, loss, next 3)",
          [(i, round(losses[i], 2), [round(v, 3) for v in losses[i + 1:i + 4]]) for i in top])
    g = sorted(gnorms)
    print("GNORM median", round(g[len(g) // 2], 3), "max", round(g[-1], 3),
          "at", gnorms.index(g[-1]), "nonfinite", sum(not math.isfinite(v) for v in losses))
    print("LR", [(i, f"{lrs[i]:.2e}") for i in (0, 12, 24, 25, 200, len(lrs) - 1)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hf_logging.set_verbosity_error()
    gen = torch.Generator().manual_seed(9)
    trans = torch.stack([torch.distributions.Dirichlet(torch.full((VOCAB,), 0.1)).sample()
                         for _ in range(VOCAB)])
    ent = -(trans * trans.clamp_min(1e-12).log()).sum(1).mean().item()
    print("mean next-token entropy (nats)", round(ent, 3), "uniform", round(math.log(VOCAB), 3))
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=64, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    def lr_at(s):
        if s < WARMUP:
            return (s + 1) / WARMUP
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / (STEPS - WARMUP)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    losses, gnorms, lrs = [], [], []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            cur = torch.randint(0, VOCAB, (BATCH,), generator=gen)
            toks = [cur]
            for _ in range(CTX - 1):
                cur = torch.multinomial(trans[cur], 1, generator=gen).squeeze(1)
                toks.append(cur)
            ids = torch.stack(toks, 1)
            loss = model(input_ids=ids, labels=ids).loss
            if step in OVERFLOW_STEPS:
                loss = loss * 1e4                 # the overflowed reduction
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            rec.step(loss=loss)
            losses.append(loss.item())
            gnorms.append(gn.item())
            lrs.append(opt.param_groups[0]["lr"])
            sched.step()
    report(losses, gnorms, lrs)
    for s in OVERFLOW_STEPS:
        print(f"around {s}:", [round(v, 3) for v in losses[s - 3:s + 5]],
              "gnorm", [round(v, 2) for v in gnorms[s - 1:s + 3]])
    clean = [v for i, v in enumerate(losses) if i not in OVERFLOW_STEPS]
    print("max loss outside the overflow steps", round(max(clean), 3),
          "at", losses.index(max(clean)))


if __name__ == "__main__":
    main()
