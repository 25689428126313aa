"""Transformer token tagger (BIO entity tags) on variable-length sentences padded to each
batch's longest; from the first step the loop appends every batch's logits and tags to a
history list "for span-level F1 at the end", never cleared: HOST MEMORY LEAK from step 0.

What it does: sentences are runs of 1-5 tokens, each run O (ids 96-159) or one of 12 entity
types (ids 8*type..8*type+7); a token is tagged B-type when its left neighbour is not of its
type, I-type when it is (25 tags). Each step draws a padded width from 16-128, 32 sentences of
width/2..width tokens. Model: Embedding(161, 64) + learned positions -> nn.TransformerEncoder
(2 layers, 4 heads, FF 128, dropout 0.1, key-padding mask) -> Linear(25). Adam(1e-3), 240
steps. The bug: every step appends (logits.detach(), tags) to `history`: 32 x width x 25 float32
logits + 32 x width int64 tags = 3,456 bytes per padded position, 54-432 KiB a step by width,
0.236 MiB a step on average (56.7 MiB for the 240 steps).

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- The leak runs from step 0 to the end: the heap grows 127.4 MiB (step 0), 141.3 (60), 155.8
  (120), 169.2 (180), 184.6 (239): +0.24 MiB/step (quarter slopes 0.233, 0.253, 0.217, 0.264
  MiB/step), in increments that follow the step's width, with no plateau.
- RSS is noisy (it swings by 60-90 MiB with the width of the batch, glibc trimming and
  refaulting the heap top) but trends up: 465, 547, 578, 581, 622 MiB at steps 0, 60, 120, 180,
  239; the 24-step window minima rise 448, 451, 507, 507, 510, 532, 532, 532, 590, 552 MiB.
- Training itself is fine: loss 3.30 at step 0 (ln 25 = 3.22), mean 2.61 over steps 0-23, 1.69
  over 48-71, 0.77 over 96-119, 0.50 over 144-167, 0.43 over the last 24; finite throughout.
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
        {"id": "memory_leak", "first_step": 0, "tolerance": 12},
    ],
}

STEPS, BATCH, MIN_WIDTH, MAX_WIDTH = 240, 32, 16, 128
VOCAB, TYPES, D_MODEL, HEADS, FF, LAYERS = 160, 12, 64, 4, 128, 2
TAGS = 2 * TYPES + 1                 # B-x and I-x for 12 entity types, plus O (tag 0)
PAD = VOCAB
LR = 1e-3

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


def make_batch(g):
    """Sentences of one batch: a padded width drawn from 16-128, real lengths from half the
    width up to it. Sentences are runs of 1-5 tokens (a run ends with probability 0.4 after
    each token); a run is O (token ids 96-159) with probability 0.4, else one entity type
    0-11 (token ids 8*type .. 8*type+7). A token is tagged B-type when the previous token is
    not of its type, I-type when it is, so the tag needs the left neighbour."""
    width = int(torch.randint(MIN_WIDTH, MAX_WIDTH + 1, (1,), generator=g))
    lengths = torch.randint(width // 2, width + 1, (BATCH,), generator=g)
    lengths[0] = width
    run_id = (torch.rand(BATCH, width, generator=g) < 0.4).long().cumsum(1)
    run_kind = torch.randint(0, TYPES, (BATCH, width + 1), generator=g)
    run_kind = run_kind.masked_fill(torch.rand(BATCH, width + 1, generator=g) < 0.4, -1)
    kind = run_kind.gather(1, run_id)
    tokens = torch.where(kind < 0, 8 * TYPES + torch.randint(0, VOCAB - 8 * TYPES, (BATCH, width),
                                                             generator=g),
                         8 * kind + torch.randint(0, 8, (BATCH, width), generator=g))
    prev_kind = torch.cat([torch.full((BATCH, 1), -1), kind[:, :-1]], 1)
    tags = torch.where(kind < 0, torch.zeros_like(kind),
                       torch.where(kind == prev_kind, 2 * kind + 2, 2 * kind + 1))
    pad = torch.arange(width)[None] >= lengths[:, None]
    return tokens.masked_fill(pad, PAD), tags.masked_fill(pad, -100), pad


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 1, D_MODEL, padding_idx=PAD)
        self.pos = nn.Embedding(MAX_WIDTH, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.out = nn.Linear(D_MODEL, TAGS)

    def forward(self, tokens, pad):
        h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))[None]
        return self.out(self.encoder(h, src_key_padding_mask=pad))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = Tagger()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    history = []                    # the leak: every batch's logits and tags, never cleared
    held = 0
    trace = []                                  # (loss, RSS, heap) per step: floats only
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            tokens, tags, pad = make_batch(g)
            logits = model(tokens, pad)
            loss = F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1), ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append((logits.detach(), tags))
            held += logits.numel() * 4 + tags.numel() * 8
            rec.step(loss=loss, tokens=int((~pad).sum()), padded_len=tokens.shape[1])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step == STEPS - 1:
                print(f"step {step} width {tokens.shape[1]} loss {loss.item():.4f} "
                      f"history {len(history)} batches {held / 2 ** 20:.1f} MiB "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    summarize(trace)
    print(f"[leak] {len(history)} batches kept, {held / 2 ** 20:.1f} MiB, "
          f"{held / len(history) / 2 ** 20:.3f} MiB per step")


if __name__ == "__main__":
    main()
