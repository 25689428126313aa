"""Small causal Transformer language model whose "prediction entropy" metric is computed from
the logits with autograd on and appended, as a tensor, to a history list that is only read at
the end of the run. The entropy is never backpropagated, so each kept scalar holds its own
graph alive: the softmax and log-softmax outputs it saved (2 x 16 x 64 x 64 float32 = 0.5 MiB
a step). HOST MEMORY LEAK from step 0, about 0.5 MiB a step for the whole run.

What it does: token sequences of length 65 from a 64-token order-1 Markov source (each token
has 3 favoured successors, probabilities 0.6/0.25/0.1 of 0.95, the last 0.05 spread over the
vocabulary); batches of 16; next-token prediction on 64 positions. Model: token + learned
position embeddings (d = 128), 2 pre-LN TransformerEncoderLayers (4 heads, FFN 256, dropout
0.1) with a causal mask, final LayerNorm, Linear 128->64. AdamW(1e-3, weight decay 0.01) with
30 warm-up steps then constant, grad clip 1.0, 400 steps. The bug: entropy = -(softmax(logits)
* log_softmax(logits)).sum(-1).mean() is computed outside torch.no_grad() and kept as a tensor
(`entropy_history.append(entropy)`) instead of entropy.item().

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- The heap grows from step 0 at 0.59 MiB/step, steadily, to the end: 131.0 MiB at step 0,
  161.3 at 50, 190.0 at 100, 248.8 at 200, 307.4 at 300, 365.3 at 399 (slopes 0.590, 0.587,
  0.584, 0.585 MiB/step over the four 100-step quarters); no plateau.
- RSS: 423.5 MiB at step 0, 595.0 at 100, 721.2 at 200, 841.1 at 300, 975.4 at 399 (1.16-1.32
  MiB/step per quarter).
- Training itself is fine: loss 4.32 at step 0 (ln 64 = 4.16), 1.37 at step 50, means 3.03,
  1.40, 1.29 over the first three 40-step windows and 1.24-1.27 after; finite throughout.
  About 38 s.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 0, "tolerance": 15},
    ],
}

STEPS, BATCH, SEQ, VOCAB, DIM, WARMUP = 400, 16, 64, 64, 128, 30

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MALLINFO2 is not None:
        mi = _MALLINFO2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(part, i):
    """Least-squares slope of column i of part (MiB per step)."""
    if len(part) < 2:
        return 0.0
    xm = (len(part) - 1) / 2
    den = sum((x - xm) ** 2 for x in range(len(part)))
    return sum((x - xm) * p[i] for x, p in enumerate(part)) / den


def report(trace, marks, segments):
    """Print the measured truths from trace, a list of (loss, RSS MiB, heap MiB) per step."""
    n = len(trace)
    for s in marks:
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean "
              f"{sum(p[0] for p in part) / len(part):.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a, b in segments:
        part = trace[a:b + 1]
        print(f"[slope] steps {a}-{b}: rss {slope(part, 1):+.3f} MiB/step, "
              f"heap {slope(part, 2):+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1], trace[s][2] - trace[s - 1][2])
             for s in range(1, n) if abs(trace[s][1] - trace[s - 1][1]) >= 8
             or abs(trace[s][2] - trace[s - 1][2]) >= 4]
    print("[jumps] RSS moves of 8 MiB or heap moves of 4 MiB or more (step:rss/heap): "
          + ", ".join(f"{s}:{d:+.0f}/{h:+.1f}" for s, d, h in jumps[:40]))


def source(g):
    """Order-1 Markov source: successor table (VOCAB, 3) and the probabilities."""
    return torch.randint(0, VOCAB, (VOCAB, 3), generator=g), torch.tensor([0.6, 0.25, 0.1])


def make_batch(src, g):
    succ, probs = src
    seq = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
    for t in range(1, SEQ + 1):
        pick = torch.multinomial(probs, BATCH, replacement=True, generator=g)
        favoured = succ[seq[:, t - 1], pick]
        uniform = torch.randint(0, VOCAB, (BATCH,), generator=g)
        seq[:, t] = torch.where(torch.rand(BATCH, generator=g) < 0.95, favoured, uniform)
    return seq[:, :-1], seq[:, 1:]


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(DIM, 4, 256, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, x):
        h = self.blocks(self.tok(x) + self.pos, mask=self.mask, is_causal=True)
        return self.out(self.norm(h))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(7)
    src = source(g)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    entropy_history = []            # the leak: tensors that keep their graphs
    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, y = make_batch(src, g)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
            entropy_history.append(entropy)
            rec.step(loss=loss, entropy=entropy)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} loss {loss.item():.4f} entropy {entropy.item():.4f} "
                      f"kept {len(entropy_history)} rss {rss:.1f} MiB heap {heap:.1f} MiB",
                      flush=True)
    report(trace, marks=(0, 1, 10, 50, 100, 200, 300, 399),
           segments=((0, 99), (100, 199), (200, 299), (300, 399), (0, 399)))
    mean_entropy = torch.stack(entropy_history).mean().item()
    print(f"[entropy] mean over the run {mean_entropy:.4f} from {len(entropy_history)} kept "
          f"tensors")


if __name__ == "__main__":
    main()
