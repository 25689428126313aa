"""GRU language model with "dark experience replay" (self-distillation on stored logits) on
variable-length batches (padded widths 16-96 in steps of 8); from step REPLAY_FROM every
batch's tokens and logits go into a replay buffer that was meant to be a fixed-size reservoir
but has no cap, so it grows by one batch per step for the rest of the run: HOST MEMORY LEAK
from mid-run.

What it does: text from a sparse order-1 Markov chain over 64 tokens (entropy rate 1.75
nats); each step a padded width from 16, 24, ..., 96 and 32 sequences of width-7..width tokens
(padding ignored). Model: Embedding(65, 48) -> GRU(96) -> Linear(64); next-token loss plus,
once the buffer has entries, 0.3 x the masked MSE between the model's logits on a random
stored batch and the logits stored with it (dark experience replay). Adam(3e-3), grad clip 1.0,
300 steps. The bug: from REPLAY_FROM = 100 every step appends (inputs, logits.detach()) to the
buffer, which has no cap: 32 x (width-1) x 64 float32 logits + int64 inputs, 0.441 MiB a step
on average, 88.2 MiB in 200 batches by the end.

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- Before step 100 the heap is flat: 126.0-128.0 MiB over steps 0-99 (127.3 at step 100).
- From step 100 it grows by 0.44 MiB/step to the end, no plateau: 150.7 MiB at step 150, 183.7
  at 225, 215.9 at 299 (quarter slopes 0.013, 0.357 [leak from step 100], 0.449, 0.438).
- RSS: 391 MiB at step 0, 412-419 over 30-99 (419.4 from step ~60), then 428 by 119, 464 at
  150, 496 at 225, 525 at 299 (+0.44 to +0.49 MiB/step from step ~120).
- Training itself is fine: loss 4.18 at step 0 (ln 64 = 4.16), mean 3.31 over 0-29, 2.13 over
  30-59, 1.88 over 60-89, then 1.81-1.85 per 30-step window (next-token part 1.73-1.90 on the
  printed steps, the replay term 0.04-0.08); finite throughout.
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
        {"id": "memory_leak", "first_step": 100, "tolerance": 15},
    ],
}

STEPS, BATCH, VOCAB, EMB, HIDDEN, REPLAY_FROM = 300, 32, 64, 48, 96, 100
WIDTHS = tuple(range(16, 97, 8))
ALPHA = 0.3                           # weight of the replay (logit-matching) loss
PAD = VOCAB
LR = 3e-3

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL(None).mallinfo2
    _mallinfo2.restype = _MallInfo2
except (OSError, AttributeError):
    _mallinfo2 = None
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _mallinfo2 is not None:
        mi = _mallinfo2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def summarize(trace):
    """Print the measured truths: (loss, RSS, heap) per step, as Python floats."""
    n = len(trace)
    for s in (0, n // 4, n // 2, 3 * n // 4, n - 1):
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        mean = sum(p[0] for p in part) / len(part)
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean {mean:.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a in range(0, n, n // 4):
        part = trace[a:a + n // 4]
        xs = range(len(part))
        xm = (len(part) - 1) / 2
        den = sum((x - xm) ** 2 for x in xs)
        slope = [sum((x - xm) * p[i] for x, p in zip(xs, part, strict=True)) / den for i in (1, 2)]
        print(f"[slope] steps {a}-{a + len(part) - 1}: rss {slope[0]:+.3f} MiB/step, "
              f"heap {slope[1]:+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1]) for s in range(1, n)
             if abs(trace[s][1] - trace[s - 1][1]) >= 4]
    print("[jumps] rss moves of 4 MiB or more: "
          + ", ".join(f"{s}:{d:+.0f}" for s, d in jumps[:40]))


def chain(g):
    """Order-1 Markov chain: each token has 4 favoured successors (probabilities 0.45, 0.25,
    0.15, 0.05) and spreads the last 0.10 over the vocabulary."""
    probs = torch.full((VOCAB, VOCAB), 0.10 / VOCAB)
    for t in range(VOCAB):
        probs[t, torch.randperm(VOCAB, generator=g)[:4]] += torch.tensor([0.45, 0.25, 0.15, 0.05])
    return probs / probs.sum(1, keepdim=True)


def make_batch(probs, g):
    """A padded width drawn from 16-96 (step 8); real lengths from width-7 to width."""
    width = WIDTHS[int(torch.randint(0, len(WIDTHS), (1,), generator=g))]
    lengths = torch.randint(max(width - 7, 2), width + 1, (BATCH,), generator=g)
    seq = torch.empty(BATCH, width, dtype=torch.long)
    seq[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
    for t in range(1, width):
        seq[:, t] = torch.multinomial(probs[seq[:, t - 1]], 1, generator=g).squeeze(1)
    return seq.masked_fill(torch.arange(width)[None] >= lengths[:, None], PAD)


class GRULM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 1, EMB, padding_idx=PAD)
        self.gru = nn.GRU(EMB, HIDDEN, batch_first=True)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        h, _ = self.gru(self.embed(tokens))
        return self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    probs = chain(g)
    model = GRULM()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    replay = []                     # the leak: meant to be a reservoir, but never capped
    held = 0
    trace = []                                  # (loss, RSS, heap) per step: floats only
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            seq = make_batch(probs, g)
            inp, target = seq[:, :-1], seq[:, 1:]
            logits = model(inp)
            lm_loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1),
                                      ignore_index=PAD)
            loss = lm_loss
            replay_loss = torch.zeros(())
            if replay:
                old_inp, old_logits = replay[int(torch.randint(0, len(replay), (1,), generator=g))]
                mask = (old_inp != PAD).unsqueeze(2)
                replay_loss = ((model(old_inp) - old_logits) ** 2 * mask).sum() / (
                    mask.sum() * VOCAB)
                loss = lm_loss + ALPHA * replay_loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step >= REPLAY_FROM:
                replay.append((inp, logits.detach()))
                held += inp.numel() * 8 + logits.numel() * 4
            rec.step(loss=loss, lm_loss=lm_loss, replay_loss=replay_loss,
                     tokens=int((target != PAD).sum()), padded_len=seq.shape[1])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step in (REPLAY_FROM - 1, REPLAY_FROM + 1) or step == STEPS - 1:
                print(f"step {step} width {seq.shape[1]} loss {loss.item():.4f} "
                      f"lm {lm_loss.item():.4f} replay {replay_loss.item():.4f} "
                      f"buffer {len(replay)} ({held / 2 ** 20:.1f} MiB) rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB", flush=True)
    summarize(trace)
    n = max(len(replay), 1)
    print(f"[leak] {len(replay)} batches in the buffer from step {REPLAY_FROM}, "
          f"{held / 2 ** 20:.1f} MiB, {held / n / 2 ** 20:.3f} MiB per step")


if __name__ == "__main__":
    main()
