"""Healthy: BertForSequenceClassification (small config, random init) on a binary task where
only 60% of the sequences carry signal; batch 16, AdamW, linear warm-up then linear decay.

What it does: sequences of 24 tokens from a 120-token vocabulary. For 60% of them the label
is marked by a "signal" token (id 5 for class 1, id 6 for class 0) inserted at 2 random
positions; the other 40% are pure random tokens with a coin-flip label, so nothing can
predict them (their best loss is ln 2 = 0.693, giving an overall floor of ~0.28). A transformers
BertForSequenceClassification (hidden 64, 2 layers, 2 heads, intermediate 128, random init),
fresh batch of 16 every step, 320 steps, AdamW(lr 5e-4, wd 0.01), LR linearly warmed up
over 30 steps then linearly decayed to 0 at step 320. Per-batch loss is noisy (which of the
16 sequences have signal varies from batch to batch).

What is TRUE of the run (measured; WINDOW_MEANS printed at the end): see the numbers below.
- 32-step window means of the loss: 0.693, 0.683, 0.431, 0.332, 0.312, 0.318, 0.344, 0.275,
  0.305, 0.296 (first 10% 0.693 = ln 2; last 10% 0.296, at the ~0.28 floor the 40% signal-
  free sequences impose). Per-batch loss ranges 0.089-0.729 throughout.
- LR: 0 -> 5e-4 over steps 0-29, then linearly to 0 at step 320.
- The late windows wander within +-0.035 of 0.30: noise, no upward trend. Healthy: no
  divergence, no spike, no plateau worth reporting (it sits at the data's floor).
"""

import argparse

import torch
from tracealyze.recorder import Recorder
from transformers import BertConfig, BertForSequenceClassification

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, SEQ, VOCAB, WARMUP = 320, 16, 24, 120, 30


def batch(gen):
    ids = torch.randint(10, VOCAB, (BATCH, SEQ), generator=gen)
    ids[:, 0] = 2                                          # [CLS]-like
    labels = torch.randint(0, 2, (BATCH,), generator=gen)
    signal = torch.rand(BATCH, generator=gen) < 0.6
    for i in range(BATCH):
        if signal[i]:
            pos = torch.randperm(SEQ - 1, generator=gen)[:2] + 1
            ids[i, pos] = 5 if labels[i] == 1 else 6
    return ids, labels


def window_means(losses, k=10):
    n = len(losses) // k
    return [round(sum(losses[i * n:(i + 1) * n]) / n, 3) for i in range(k)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=128, max_position_embeddings=32,
                     num_labels=2)
    model = BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / WARMUP if s < WARMUP else max(0.0, (STEPS - s) / (STEPS - WARMUP)))
    losses = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for _ in range(STEPS):
            ids, y = batch(gen)
            out = model(input_ids=ids, labels=y)
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            acc = (out.logits.argmax(1) == y).float().mean()
            rec.step(loss=out.loss, acc=acc)
            sched.step()
            losses.append(out.loss.item())
    print("WINDOW_MEANS", window_means(losses))
    print("min/max", round(min(losses), 3), round(max(losses), 3))


if __name__ == "__main__":
    main()
