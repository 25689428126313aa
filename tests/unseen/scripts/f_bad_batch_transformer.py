"""Tiny GPT-2 (transformers config) on a synthetic Markov language; one batch's loss x300.

What it does: 300 steps of 16 sequences of 33 tokens sampled from a fixed random first-order
Markov chain over 64 tokens (peaked transition rows), next-token cross-entropy. GPT2LMHeadModel
from a GPT2Config (2 layers, 4 heads, width 64, no dropout), AdamW(lr=1e-3, wd=0.01), no
clipping.

At step BAD_STEP = 170 the batch's loss is multiplied by 300: a per-batch sample-weight bug
(that batch's weight column was read as 300 instead of 1). The recorded loss is the weighted
loss that was back-propagated.

What is TRUE of the run (measured):
- Steps 0-169: the loss falls from 4.18 to ~2.15-2.2; the gradient norm is ~1.0-1.3.
- Step 170: loss spike: the loss is ~690 and the gradient norm ~400. The weighted batch is
  the root cause; the trouble starts at this step.
- AdamW's moments absorb the x300 gradient: that update and the decaying momentum after it
  push the model off for a while: the loss is 2.19 at step 171 but climbs to ~2.9-3.06
  around steps 178-190 (gradient norm up to ~2.5), then recovers slowly (2.3-2.8 over
  201-260, 2.18-2.6 over 261-299), still a little above its pre-spike level at the end. No NaN/Inf,
  nothing wrong with memory, data loading or step times.
"""

import argparse

import torch
import torch.nn.functional as F
from tracealyze.recorder import Recorder
from transformers import GPT2Config, GPT2LMHeadModel

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 170, "tolerance": 1, "top": True},
    ],
    "forbidden": ["nonfinite", "memory_leak", "dataloader_bottleneck"],
}

STEPS, BATCH, SEQ, VOCAB = 300, 16, 32, 64
BAD_STEP, BAD_WEIGHT = 170, 300.0


def make_corpus(n, g):
    trans = torch.softmax(torch.randn(VOCAB, VOCAB, generator=g) * 3, -1)
    x = torch.empty(n, SEQ + 1, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(SEQ):
        x[:, i + 1] = torch.multinomial(trans[x[:, i]], 1, generator=g).squeeze(1)
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    corpus = make_corpus(STEPS * BATCH, torch.Generator().manual_seed(1))
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    weights = torch.ones(STEPS)
    weights[BAD_STEP] = BAD_WEIGHT  # the weighting bug
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            seq = corpus[step * BATCH:(step + 1) * BATCH]
            logits = model(seq[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
            loss = loss * weights[step]
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or step == BAD_STEP:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
