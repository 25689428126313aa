"""GRU sequence classifier, Adam; the LR is x1000 for ONE step and the model falls to chance.

What it does: 6-class sequences of 24 tokens (vocab 32). Each class has its own 3-token
motif planted at a random position in otherwise uniform random tokens; the label is the class
of the motif. Model: embedding 32->32, one-layer GRU(32, 64), its outputs averaged over time,
LayerNorm(64), linear -> 6; cross-entropy, Adam(lr=3e-3), 320 steps of 32 sequences, no clipping.

At step SPIKE_STEP = 150 a scheduler bug (a warm-restart factor applied as a multiplier instead
of a divisor) sets the learning rate to 3.0 (x1000) for that one optimizer step; from step 151
on it is 3e-3 again. The recorded lr column shows 3.0 at step 150 only.

What is TRUE of the run (measured, two runs identical):
- ln C = ln 6 = 1.792.
- Steps 111-150: loss 0.02-0.23 (median 0.069; 0.035 at step 150 itself, whose loss and
  gradient are computed BEFORE the x1000 update), grad norm median 0.78 (0.32 at step 150).
- Step 151, the first forward pass after the spiked update: loss 33.8 (~x1000 the level
  before), grad norm 15.4 (~x20). The model is confidently wrong: loss 29-32 at 152-155, mean
  ~12 over 140-159 and 9.7 over 160-179.
- It then comes down to about chance and only slowly below it: mean loss 3.8 (180-199), 2.5
  (200-219), 1.9 (220-239, ~ln 6), 1.7 (240-259), 1.2-1.3 (260-319); min 0.77. At the end it is
  still ~20x its level before the spike: the training before step 150 is lost.
- Why loss_spike (dated 151, tolerance 1 so 150 = the lr step also matches): the gradient at
  the cause step is normal (0.32) - what blew up was the update size, and what a user sees is
  the loss jumping ~1000x in one step. The grad-norm rise (x20) at 151 is a consequence.
  No NaN/Inf; nothing else wrong.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "loss_spike", "first_step": 151, "tolerance": 1},
    ],
}

STEPS, BATCH, CLASSES, VOCAB, LENGTH = 320, 32, 6, 32, 24
LR, SPIKE_STEP, SPIKE = 3e-3, 150, 1000.0


class GRUClassifier(nn.Module):
    def __init__(self, k=CLASSES):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, k)

    def forward(self, tokens):
        out, _ = self.gru(self.emb(tokens))
        return self.head(self.norm(out.mean(1)))


def make_data(n, g):
    motifs = torch.randint(0, VOCAB, (CLASSES, 3), generator=g)
    tokens = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    pos = torch.randint(0, LENGTH - 3, (n,), generator=g)
    for i in range(3):
        tokens[torch.arange(n), pos + i] = motifs[labels, i]
    return tokens, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    tokens, labels = make_data(STEPS * BATCH, g)
    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x = tokens[step * BATCH:(step + 1) * BATCH]
            y = labels[step * BATCH:(step + 1) * BATCH]
            for group in opt.param_groups:  # the bug: x1000 for one step only
                group["lr"] = LR * SPIKE if step == SPIKE_STEP else LR
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
            if step % 25 == 0 or SPIKE_STEP - 1 <= step <= SPIKE_STEP + 3:
                print(f"step {step} loss {loss.item():.4g}", flush=True)


if __name__ == "__main__":
    main()
