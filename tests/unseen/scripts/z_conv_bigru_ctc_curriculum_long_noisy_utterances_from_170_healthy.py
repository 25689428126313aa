"""CTC phone recogniser (Conv1d 20->48 k5 + GELU, Conv1d 48->48 k3 stride 1, BiGRU 48x2,
Linear -> 13 classes incl. blank) on synthetic "utterances": each of 12 phones has a
prototype 20-dim filterbank vector; a label sequence is rendered as segments of a few frames
per phone (prototype + per-frame noise, neighbouring frames blended at segment edges).
CTC loss with ``reduction="mean"`` (per target token). Adam(2e-3), batch 16, 400 steps.

What changes at step 170: a two-stage curriculum moves to harder utterances: before 170,
2-3 phones per utterance, 3-5 frames per phone, frame noise 0.2; from 170, 7-10 phones,
2-3 frames per phone, frame noise 0.9 and
random gain 0.6-1.4. The loss (and the gradient norm, more frames and more confusable
frames) rise at 170 and then train down on the harder data. HEALTHY by design: the
greedy-decoding token error rate on the hard stage falls after the switch, no NaN.

What is TRUE of the run (measured with plain torch in this script, recorder on; grad norm =
total L2 norm of all parameter gradients right before ``opt.step()``; medians over 20-step
windows; "ter" = greedy CTC decode edit distance / target length, per batch):
- recorded loss: median 0.232 over steps 150-169, 0.601 over 170-189 (x2.59), 0.412 over
  190-209, 0.237 over the last 20; values 0.265 at 169, 0.535 at 170, 0.682 at 171. 40-step
  medians 3.05 1.33 0.349 0.199 (steps 120-159) | 0.517 0.361 0.306 0.261 0.244 0.236.
- grad norm: median 0.534 over 150-169, 0.960 over 170-189 (x1.80), 0.739 over 190-209, 0.492
  over the last 20; 0.676 at 169, 0.964 at 170, 0.955 at 171.
- ter: 0.072 over 150-169, 0.211 over 170-189, 0.136 over 190-209, 0.103 over the last 20.
- LR constant 2e-3. No NaN or inf. About 12 s.
"""

import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, FEATS, PHONES, SWITCH = 400, 16, 20, 12, 170


class CTCModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(FEATS, 48, 5, padding=2), nn.GELU(),
                                  nn.Conv1d(48, 48, 3, padding=1), nn.GELU())
        self.rnn = nn.GRU(48, 48, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, PHONES + 1)

    def forward(self, x):                       # x: (B, T, F)
        h = self.conv(x.transpose(1, 2)).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1)      # (B, T, C)


def utterances(g, protos, hard):
    lo, hi, noise, dlo, dhi = (7, 11, 0.9, 2, 4) if hard else (2, 4, 0.2, 3, 6)
    labels, frames = [], []
    for _ in range(BATCH):
        n = int(torch.randint(lo, hi, (1,), generator=g))
        seq = torch.randint(1, PHONES + 1, (n,), generator=g)
        segs = []
        for p in seq.tolist():
            d = int(torch.randint(dlo, dhi, (1,), generator=g))
            segs.append(protos[p - 1].expand(d, FEATS))
        x = torch.cat(segs)
        x = 0.7 * x + 0.15 * (torch.roll(x, 1, 0) + torch.roll(x, -1, 0))
        gain = 0.6 + 0.8 * float(torch.rand(1, generator=g)) if hard else 1.0
        frames.append(gain * x + noise * torch.randn(x.shape, generator=g))
        labels.append(seq)
    T = max(f.shape[0] for f in frames)
    xs = torch.zeros(BATCH, T, FEATS)
    for i, f in enumerate(frames):
        xs[i, :f.shape[0]] = f
    in_lens = torch.tensor([f.shape[0] for f in frames])
    tgt_lens = torch.tensor([len(s) for s in labels])
    return xs, torch.cat(labels), in_lens, tgt_lens, labels


def edit_distance(a, b):
    d = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(b) + 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
            prev, d[j] = d[j], cur
    return d[len(b)]


def token_error_rate(logp, in_lens, labels):
    best = logp.argmax(-1)
    errs = total = 0
    for i, seq in enumerate(labels):
        path = best[i, :int(in_lens[i])].tolist()
        hyp = [p for k, p in enumerate(path) if p != 0 and (k == 0 or p != path[k - 1])]
        errs += edit_distance(hyp, seq.tolist())
        total += len(seq)
    return errs / total


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
    g = torch.Generator().manual_seed(5)
    protos = torch.randn(PHONES, FEATS, generator=g)
    model = CTCModel()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt,
                  hparams={"curriculum": {"hard_from": SWITCH}, "lr": 2e-3}) as rec:
        for step in range(STEPS):
            hard = step >= SWITCH
            x, tgt, in_lens, tgt_lens, labels = utterances(g, protos, hard)
            logp = model(x)
            loss = F.ctc_loss(logp.transpose(0, 1), tgt, in_lens, tgt_lens, blank=0,
                              reduction="mean", zero_infinity=True)
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(model)
            opt.step()
            ter = token_error_rate(logp.detach(), in_lens, labels)
            rec.step(loss=loss, ter=ter, stage=int(hard))
            rows.append((loss.item(), gn, ter))
            if step % 40 == 0:
                print(f"step {step} loss {loss.item():.4f} ter {ter:.3f} gnorm {gn:.3f}",
                      flush=True)
    report(SWITCH, rows, ("loss", "gnorm", "ter"))


if __name__ == "__main__":
    main()
