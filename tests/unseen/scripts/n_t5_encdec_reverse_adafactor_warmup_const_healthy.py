"""T5-style encoder-decoder (RMSNorm pre-norm, no biases, bucketed relative position bias,
gated-GELU feed-forward, tied embeddings) learning to reverse a token sequence; Adafactor with
linear warm-up then a constant learning rate. HEALTHY.

What it does: sequences of 6-12 content tokens (vocabulary 24 incl. PAD/BOS/EOS) + EOS; the
target is the sequence reversed, teacher-forced from BOS. Model: T5 v1.1-style encoder-decoder,
d=64, 4 heads, 2 + 2 layers, RMSNorm pre-norm without biases, bucketed relative position bias
(16 buckets, in the first layer of each stack, shared down the stack), gated-GELU FFN (128),
dropout 0.1, T5 initialisation, tied input/output embedding with the d^-0.5 rescale.
Cross-entropy ignoring PAD. torch.optim.Adafactor(lr 1e-2) with linear warm-up over 60 steps,
then constant 1e-2 (the LR scheduler is stepped before rec.step, so the recorded lr is the
next step's). 420 steps of batch 32, fresh data every step.

What is TRUE of the run (measured):
- ln 24 = 3.18. Loss 4.16 at step 0 (the unit-variance tied embedding makes the first logits
  confident), mean 4.0 over steps 0-9, 2.81 over steps 40-79, 2.26 over 120-159; the model
  then finds the reversal (attention to the mirrored position): mean 1.66 over 160-199
  (0.96-2.14), 0.67 over 200-239, 0.35 over 240-279, 0.18 over 320-359, 0.12 over the last
  20 steps. A smooth, monotone fall in 20-step means; no spike.
- Held-out (256 sequences, teacher forced): loss 0.076, token accuracy 0.975.
- Grad norm (40-step medians) 1.2 over steps 0-39 (max 2.3 in the first steps), 0.9-1.5 over
  40-159, rising smoothly to 2.2-2.4 during the breakthrough (160-279, max 2.92), 1.5-1.8
  after; no NaN/Inf.
- Step time median ~44 ms.
- Nothing is wrong: a healthy run.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": True,
    "findings": [],
}

STEPS, BATCH, VOCAB, MIN_LEN, MAX_LEN = 420, 32, 24, 6, 12
D, HEADS, FF, ENC_LAYERS, DEC_LAYERS, BUCKETS = 64, 4, 128, 2, 2, 16
PAD, BOS, EOS = 0, 1, 2                     # tokens 3..VOCAB-1 are content
PEAK_LR, WARMUP = 1e-2, 60


def make_batch(n, g):
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (n,), generator=g)
    src = torch.full((n, MAX_LEN + 1), PAD)
    tgt = torch.full((n, MAX_LEN + 2), PAD)
    for i, L in enumerate(lengths.tolist()):
        seq = torch.randint(3, VOCAB, (L,), generator=g)
        src[i, :L] = seq
        src[i, L] = EOS
        tgt[i, 0] = BOS
        tgt[i, 1:L + 1] = seq.flip(0)
        tgt[i, L + 1] = EOS
    return src, tgt[:, :-1], tgt[:, 1:]         # encoder input, decoder input, labels


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def relative_bucket(rel, bidirectional, num_buckets=BUCKETS, max_distance=32):
    """T5's bucketing: exact buckets for small offsets, log-spaced for larger ones."""
    ret = torch.zeros_like(rel)
    n = -rel
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (torch.log(n.float().clamp(min=1) / max_exact)
                         / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return ret + torch.where(is_small, n, large)


class Attention(nn.Module):
    def __init__(self, has_bias, bidirectional):
        super().__init__()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)
        self.v = nn.Linear(D, D, bias=False)
        self.o = nn.Linear(D, D, bias=False)
        self.bidirectional = bidirectional
        self.rel_bias = nn.Embedding(BUCKETS, HEADS) if has_bias else None

    def position_bias(self, lq, lk):
        rel = torch.arange(lk)[None, :] - torch.arange(lq)[:, None]
        buckets = relative_bucket(rel, self.bidirectional)
        return self.rel_bias(buckets).permute(2, 0, 1)[None]     # 1 x H x lq x lk

    def forward(self, x, kv, mask, bias):
        b, lq, _ = x.shape
        lk = kv.shape[1]
        q = self.q(x).view(b, lq, HEADS, -1).transpose(1, 2)
        k = self.k(kv).view(b, lk, HEADS, -1).transpose(1, 2)
        v = self.v(kv).view(b, lk, HEADS, -1).transpose(1, 2)
        scores = q @ k.transpose(-1, -2)             # T5 folds the 1/sqrt(d) scale into init
        if self.rel_bias is not None:
            bias = self.position_bias(lq, lk)
        if bias is not None:
            scores = scores + bias
        scores = scores.masked_fill(~mask, -1e9)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, lq, D)
        return self.o(out), bias


class GatedGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.wi0 = nn.Linear(D, FF, bias=False)
        self.wi1 = nn.Linear(D, FF, bias=False)
        self.wo = nn.Linear(FF, D, bias=False)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.wo(self.drop(F.gelu(self.wi0(x), approximate="tanh") * self.wi1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, first):
        super().__init__()
        self.n1, self.attn = RMSNorm(D), Attention(first, bidirectional=True)
        self.n2, self.ff = RMSNorm(D), GatedGelu()
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask, bias):
        h = self.n1(x)
        a, bias = self.attn(h, h, mask, bias)
        x = x + self.drop(a)
        return x + self.drop(self.ff(self.n2(x))), bias


class DecoderLayer(nn.Module):
    def __init__(self, first):
        super().__init__()
        self.n1, self.self_attn = RMSNorm(D), Attention(first, bidirectional=False)
        self.n2, self.cross_attn = RMSNorm(D), Attention(False, bidirectional=True)
        self.n3, self.ff = RMSNorm(D), GatedGelu()
        self.drop = nn.Dropout(0.1)

    def forward(self, y, enc, self_mask, cross_mask, bias):
        h = self.n1(y)
        a, bias = self.self_attn(h, h, self_mask, bias)
        y = y + self.drop(a)
        c, _ = self.cross_attn(self.n2(y), enc, cross_mask, None)
        y = y + self.drop(c)
        return y + self.drop(self.ff(self.n3(y))), bias


class T5(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(VOCAB, D)
        nn.init.normal_(self.shared.weight, std=1.0)
        self.encoder = nn.ModuleList([EncoderLayer(i == 0) for i in range(ENC_LAYERS)])
        self.enc_norm = RMSNorm(D)
        self.decoder = nn.ModuleList([DecoderLayer(i == 0) for i in range(DEC_LAYERS)])
        self.dec_norm = RMSNorm(D)
        for name, p in self.named_parameters():     # T5 init: q scaled by (d * d_head)^-1/2
            if name.endswith("q.weight"):
                nn.init.normal_(p, std=(D * (D // HEADS)) ** -0.5)
            elif name.endswith(("k.weight", "v.weight", "o.weight", "wi0.weight", "wi1.weight")):
                nn.init.normal_(p, std=D ** -0.5)
            elif name.endswith("wo.weight"):
                nn.init.normal_(p, std=FF ** -0.5)

    def forward(self, src, dec_in):
        src_keep = src != PAD
        enc_mask = src_keep[:, None, None, :]
        x, bias = self.shared(src), None
        for layer in self.encoder:
            x, bias = layer(x, enc_mask, bias)
        enc = self.enc_norm(x)
        lt = dec_in.shape[1]
        causal = torch.ones(lt, lt, dtype=torch.bool).tril()[None, None]
        y, bias = self.shared(dec_in), None
        for layer in self.decoder:
            y, bias = layer(y, enc, causal, enc_mask, bias)
        y = self.dec_norm(y) * D ** -0.5                # tied output embedding, T5 rescaling
        return y @ self.shared.weight.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    val_src, val_in, val_lab = make_batch(256, g)
    model = T5()
    opt = torch.optim.Adafactor(model.parameters(), lr=PEAK_LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            src, dec_in, labels = make_batch(BATCH, g)
            logits = model(src, dec_in)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=PAD)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            rec.step(loss=loss)
            if step % 40 == 0 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e}",
                      flush=True)
    model.eval()
    with torch.no_grad():
        logits = model(val_src, val_in)
        keep = val_lab != PAD
        val_loss = F.cross_entropy(logits[keep], val_lab[keep]).item()
        tok_acc = (logits.argmax(-1)[keep] == val_lab[keep]).float().mean().item()
    print(f"val loss {val_loss:.4f} token acc (teacher forced) {tok_acc:.3f}; "
          f"ln V = {math.log(VOCAB):.3f}")


if __name__ == "__main__":
    main()
