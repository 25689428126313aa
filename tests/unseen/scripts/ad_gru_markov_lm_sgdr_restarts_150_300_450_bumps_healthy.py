"""GRU language model (embedding 32, one GRU layer of 96, linear head; vocabulary 16) on a
synthetic second-order Markov source (the next token's distribution depends on the two
previous tokens, a fixed random 256 x 16 table, softmax(3 * N(0,1)); mean per-context entropy
1.145 nats, the loss floor). Fresh batches of 32 sequences x 33 tokens every step,
next-token cross entropy. SGD (momentum 0.9), no clipping, 600 steps. Schedule: SGDR,
CosineAnnealingWarmRestarts(T_0=150, eta_min=0.02): lr 2.0 -> 0.02 over each cycle and a warm
restart back to 2.0 at steps 150, 300 and 450 (4 cycles).

What happens: the familiar SGDR sawtooth. At each restart the learning rate jumps x100 (0.02
-> 2.0): within 3-5 steps the loss rises by ~0.25 nats (the optimiser leaves the low-lr basin
floor and sits at the higher noise level of lr 2.0) and the gradient norm rises ~1.5x; then
both come down with the cosine, and each cycle ends a little lower than the one before. The
gradient does not grow geometrically, nothing is nonfinite. HEALTHY: every movement is the
schedule's, the run learns throughout.

What is TRUE of the run (plain torch, recorder on; grad norm = total L2 norm before
opt.step(); identical in two runs):
- Start: loss 2.79 at step 0 (ln 16 = 2.77); 30-step medians 2.51 (0-29), 1.71 (30-59),
  1.43 (90-119), 1.362 (120-149).
- Restart at 150: loss median 1.344 over 130-149 -> 1.40 (150), 1.52 (152), 1.65 (153-155),
  max 1.66 at 164; median 1.576 over 180-199, 1.389 over 240-269, 1.316 over 270-299. Grad
  norm median 0.248 over 130-149, max 0.447 at 152 (x1.8), median 0.348 over 180-199.
- Restart at 300: loss 1.315 (280-299 median) -> max 1.61 at 311, 1.533 (330-349 median),
  1.302 (420-449). Grad 0.237 -> max 0.385 at 311 (x1.6) -> 0.326.
- Restart at 450: loss 1.292 -> max 1.55 at 461, 1.477 (480-499), 1.299 (570-599). Grad
  0.229 -> max 0.340 at 452 (x1.5) -> 0.302.
- Largest grad norm of the whole run 0.447 (step 152); 30-step grad medians stay within
  0.23-0.37 after step 30. End: loss median 1.295 over the last 20 steps (from 2.79), no
  NaN/Inf. About 7 s.
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

VOCAB, EMB, HID, SEQ, BATCH = 16, 32, 96, 32, 32
CYCLE, CYCLES, LR_MAX, LR_MIN = 150, 4, 2.0, 0.02
STEPS = CYCLE * CYCLES
RESTARTS = [CYCLE * k for k in range(1, CYCLES)]


class GRULM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB)
        self.gru = nn.GRU(EMB, HID, batch_first=True)
        self.head = nn.Linear(HID, VOCAB)

    def forward(self, x):
        h, _ = self.gru(self.emb(x))
        return self.head(h)


def markov_batch(trans, g):
    """Sequences from a fixed second-order Markov chain (SEQ + 1 tokens each): the next
    token's distribution is trans[prev2 * VOCAB + prev1]."""
    x = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
    x[:, :2] = torch.randint(0, VOCAB, (BATCH, 2), generator=g)
    for t in range(1, SEQ):
        x[:, t + 1] = torch.multinomial(trans[x[:, t - 1] * VOCAB + x[:, t]], 1,
                                        generator=g).squeeze(1)
    return x


def facts(rows, events):
    med = statistics.median
    loss = [r[0] for r in rows]
    gn = [r[1] for r in rows]
    print(f"[all] nonfinite {sum(not math.isfinite(v) for v in loss + gn)}; "
          f"loss step 0 {loss[0]:.4g}, last 20 median {med(loss[-20:]):.4g}")
    for e in events:
        print(f"[event {e}] loss med {e - 20}-{e - 1}: {med(loss[e - 20:e]):.4g}, "
              f"max {e}-{e + 14}: {max(loss[e:e + 15]):.4g} at "
              f"{max(range(e, e + 15), key=loss.__getitem__)}, med {e + 30}-{e + 49}: "
              f"{med(loss[e + 30:e + 50]):.4g} | grad med before {med(gn[e - 20:e]):.4g}, "
              f"max {e}-{e + 14}: {max(gn[e:e + 15]):.4g} at "
              f"{max(range(e, e + 15), key=gn.__getitem__)}, med {e + 30}-{e + 49}: "
              f"{med(gn[e + 30:e + 50]):.4g}")
    for a in range(0, len(rows), 30):
        print(f"[win] {a}-{a + 29}: loss {med(loss[a:a + 30]):.4g} grad {med(gn[a:a + 30]):.4g}"
              f" max grad {max(gn[a:a + 30]):.4g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)
    trans = torch.softmax(3.0 * torch.randn(VOCAB * VOCAB, VOCAB, generator=g), dim=1)
    ent = -(trans * trans.clamp_min(1e-12).log()).sum(1).mean().item()
    print(f"mean per-state entropy of the source {ent:.4f} nats")
    model = GRULM()
    opt = torch.optim.SGD(model.parameters(), lr=LR_MAX, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=CYCLE, eta_min=LR_MIN)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            seq = markov_batch(trans, g)
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            rec.step(loss=loss)
            rows.append((loss.item(), gn))
            if step % 50 == 0 or any(r - 3 <= step <= r + 12 for r in RESTARTS):
                print(f"step {step} lr {lr:.4f} loss {loss.item():.4f} grad_norm {gn:.4g}",
                      flush=True)
    facts(rows, RESTARTS)


if __name__ == "__main__":
    main()
