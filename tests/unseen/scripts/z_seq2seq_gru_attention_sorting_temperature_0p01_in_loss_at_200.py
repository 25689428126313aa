"""Seq2seq GRU with additive (Bahdanau) attention learning to sort digit sequences: source
6-10 digits from 0-19 (with repeats), target the sorted sequence; embedding 32, encoder GRU
64, decoder GRU 64 fed the previous target token (teacher forcing) and the attention
context, output Linear 128 -> 22 (20 digits, BOS, EOS). Token-level CE, Adam(2e-3),
clip-free, batch 32, 360 steps.

What changes at step 200: a BUG. A sampling temperature added for the decoding demo
(``cfg.temperature = 0.01``, "sharpen the samples") is applied in the shared ``logits()``
helper, so from step 200 the training loss is computed on logits / 0.01 = 100 x logits.
Every token the model gets wrong now costs ~100 x its logit margin and the gradients are
~100x larger. The loss jumps x32 at step 200 and then slowly comes down (still ~3.5x its old
level at the end), while the gradient norm jumps x100 and stays 30-70x above its level for
the rest of the run (argmax accuracy keeps improving: the model still learns, on a
100x-sharpened objective). An expert wants the gradient norm jump at 200 that does not go
away flagged.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows; token accuracy is argmax-based, unaffected by the temperature itself):
- loss: median 0.436 over steps 180-199, 14.0 over 200-219 (x32.1), 7.92 over 220-239, 1.81 over
  the last 20; values 0.305 at 199, 43.8 at 200, 18.5 at 201. 40-step medians 2.37 1.46 0.94
  0.63 0.46 | 10.5 4.78 3.17 1.57.
- grad norm: median 0.791 over 180-199, 83.5 over 200-219 (x106), 46.5 over 220-239, 25.4 over
  the last 20 (x32 the old level); 0.540 at 199, 162.8 at 200, 134.6 at 201. 40-step medians
  0.44 0.49 0.58 0.72 0.77 | 56.4 36.7 31.9 25.1.
- token accuracy: 0.881 over 180-199, 0.849 over 200-219, 0.941 over the last 20.
- LR constant 2e-3. No NaN or inf. About 11-13 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "gradient_explosion", "first_step": 200, "tolerance": 1}]}

STEPS, BATCH, DIGITS, EMB, HID, SWITCH = 360, 32, 20, 32, 64, 200
BOS, EOS, VOCAB = DIGITS, DIGITS + 1, DIGITS + 2


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB)
        self.encoder = nn.GRU(EMB, HID, batch_first=True)
        self.decoder = nn.GRUCell(EMB + HID, HID)
        self.att_q, self.att_k = nn.Linear(HID, HID, bias=False), nn.Linear(HID, HID)
        self.att_v = nn.Linear(HID, 1, bias=False)
        self.out = nn.Linear(2 * HID, VOCAB)
        self.temperature = 1.0

    def logits(self, h, ctx):
        return self.out(torch.cat([h, ctx], -1)) / self.temperature

    def forward(self, src, tgt_in):
        enc, h = self.encoder(self.emb(src))
        h = h[0]
        keys = self.att_k(enc)
        ctx = enc.mean(1)
        outs = []
        for t in range(tgt_in.shape[1]):
            h = self.decoder(torch.cat([self.emb(tgt_in[:, t]), ctx], -1), h)
            score = self.att_v(torch.tanh(keys + self.att_q(h)[:, None])).squeeze(-1)
            ctx = (score.softmax(-1)[..., None] * enc).sum(1)
            outs.append(self.logits(h, ctx))
        return torch.stack(outs, 1)


def batch(g):
    n = int(torch.randint(6, 11, (1,), generator=g))
    src = torch.randint(0, DIGITS, (BATCH, n), generator=g)
    tgt = torch.cat([src.sort(1).values, torch.full((BATCH, 1), EOS)], 1)
    tgt_in = torch.cat([torch.full((BATCH, 1), BOS), tgt[:, :-1]], 1)
    return src, tgt_in, tgt


def grad_norm(model):
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()
                         if p.grad is not None))


def report(n_change, rows, names):
    med = statistics.median
    for j, name in enumerate(names):
        col = [r[j] for r in rows]
        b = med(col[n_change - 20:n_change])
        a = med(col[n_change:n_change + 20])
        print(f"[{name}] med {n_change - 20}-{n_change - 1}: {b:.4g}  {n_change}-{n_change + 19}: "
              f"{a:.4g} (x{a / b:.3g})  {n_change + 20}-{n_change + 39}: "
              f"{med(col[n_change + 20:n_change + 40]):.4g}  last20: {med(col[-20:]):.4g}  "
              f"at {n_change - 1},{n_change},{n_change + 1}: "
              + ", ".join(f"{v:.4g}" for v in col[n_change - 1:n_change + 2])
              + f"  step0: {col[0]:.4g}  nonfinite: {sum(not math.isfinite(v) for v in col)}")
        print(f"[{name}] 40-step medians: "
              + " ".join(f"{med(col[a:a + 40]):.4g}" for a in range(0, len(col), 40)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(37)
    model = Seq2Seq()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            if step == SWITCH:
                model.temperature = 0.01          # the bug: the sampling temperature leaks in
            src, tgt_in, tgt = batch(g)
            logits = model(src, tgt_in)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            acc = (logits.argmax(-1) == tgt).float().mean().item()
            rec.step(loss=loss, token_acc=acc)
            rows.append((loss.item(), gn, acc))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4g} acc {acc:.3f} gnorm {gn:.4g}",
                      flush=True)
    report(SWITCH, rows, ("loss", "gnorm", "token_acc"))


if __name__ == "__main__":
    main()
