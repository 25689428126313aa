"""A char-level GPT on server logs: a vocabulary hot-reload at step 240 maps every char to pad;
every target is then ignored and the loss is NaN from step 240.

What it does: synthetic server log lines ("[12:34:56] warn db: slow query ms=412") streamed
as random 49-character windows, batch 32, a character vocabulary of 48 symbols read from a
JSON file (id 0 = padding; unknown characters fall back to the pad id), targets shifted by
one, cross-entropy with ignore_index = pad. A GPT-2-style causal transformer (3 pre-LN blocks,
d=64, 4 heads, GELU MLP, learned positions). AdamW lr 2e-3, betas (0.9, 0.95), weight decay
0.1, 40-step warmup and cosine decay to 10 %. 400 steps. At step 240 the loader hot-reloads
the vocabulary after the preprocessing job refreshed the file, which is now keyed by code
point ("104") instead of by character: every lookup misses, every input and target is the
pad id, every target is ignored, and the mean over zero targets is 0/0. Standard preset.
Seeded, deterministic.

What is TRUE of the run (measured):
- Steps 0-239 train normally: loss medians per 40 steps 3.290, 1.904, 1.311, 0.903, 0.685,
  0.587; gradient norm medians 0.57, 0.33, 0.44, 0.52, 0.59, 0.48 (range 0.29-0.97); 1,536
  non-pad targets per batch. Steps 237-239: loss 0.550, 0.576, 0.571.
- From step 240 to the end (160 steps) the loss is NaN at every step: 0 non-pad targets.
- The gradients stay finite: they are exactly zero from step 240 (total norm 0.0, no
  NaN/Inf element), so the weights are never corrupted. AdamW keeps moving them on its
  momentum and weight decay only: the head's update norm decays from 0.0128 (step 240) to
  0.0022 (median 240-279) and 1.6e-4 (steps 398-399).
- Nothing is learned from step 240 on; the run completes (no exception).
- ~20 s on 2 busy CPU cores.
"""

import argparse
import json
import math

import torch
from torch import nn
from torch.nn import functional as F
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "nonfinite", "first_step": 240, "tolerance": 1, "top": True},
    ],
    "forbidden": ["gradient_explosion"],
}

STEPS, BATCH, SEQ, D, LAYERS, HEADS = 400, 32, 48, 64, 3, 4
RELOAD_AT, LR, WARMUP = 240, 2e-3, 40
CHARS = " abcdefghijklmnopqrstuvwxyz0123456789.:/-_=[]()\n"


class CharTokenizer:
    """Character vocabulary read from a JSON file (char -> id); id 0 is padding. Unknown
    characters fall back to the pad id."""

    def __init__(self, vocab_json: str) -> None:
        self.load(vocab_json)

    def load(self, vocab_json: str) -> None:
        self.stoi = json.loads(vocab_json)
        self.pad_id = 0

    def encode(self, text: str, length: int) -> list[int]:
        ids = [self.stoi.get(c, self.pad_id) for c in text[:length]]
        return ids + [self.pad_id] * (length - len(ids))


LEVELS = ["info", "info", "info", "warn", "error", "debug"]
SERVICES = ["auth", "db", "cache", "api", "queue", "worker"]
MSGS = {"info": ["request ok path=/v1/{p} ms={n}", "user {u} logged in", "job {n} done"],
        "warn": ["slow query ms={n}", "retry {n} for /v1/{p}"],
        "error": ["timeout after ms={n}", "conn reset peer={u}"],
        "debug": ["cache hit key={u}", "gc pause ms={n}"]}


def log_line(g: torch.Generator) -> str:
    def pick(xs: list) -> str:
        return xs[int(torch.randint(0, len(xs), (), generator=g))]

    lvl = pick(LEVELS)
    minute, second = (int(v) for v in torch.randint(0, 60, (2,), generator=g))
    ts = f"12:{minute:02d}:{second:02d}"
    msg = pick(MSGS[lvl]).format(p=pick(["users", "items", "orders", "auth"]),
                                 n=int(torch.randint(1, 999, (), generator=g)),
                                 u=f"u{int(torch.randint(0, 50, (), generator=g))}")
    return f"[{ts}] {lvl} {pick(SERVICES)}: {msg}\n"


def text_batch(g: torch.Generator, tok: CharTokenizer) -> torch.Tensor:
    rows = []
    for _ in range(BATCH):
        text = ""
        while len(text) < SEQ + 1:
            text += log_line(g)
        start = int(torch.randint(0, len(text) - SEQ - 1 + 1, (), generator=g))
        rows.append(tok.encode(text[start:], SEQ + 1))
    return torch.tensor(rows)


class Block(nn.Module):
    """GPT-2 block: pre-LN causal self-attention and a 4x GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, D)
        self.pos = nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(self.ln_f(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    vocab_json = json.dumps({c: i + 1 for i, c in enumerate(CHARS)})
    tok = CharTokenizer(vocab_json)
    vocab = len(CHARS) + 1
    data_g = torch.Generator().manual_seed(1)

    model = CharGPT(vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / WARMUP) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, STEPS) / STEPS))))
    log = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step == RELOAD_AT:
                # The preprocessing job refreshed vocab.json and the loader hot-reloads it:
                # the new file is keyed by code point ("104": 8) instead of by character, so
                # every lookup misses and falls back to the pad id.
                tok.load(json.dumps({str(ord(c)): i for c, i in json.loads(vocab_json).items()}))
            ids = text_batch(data_g, tok)
            inputs, targets = ids[:, :-1], ids[:, 1:]
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1),
                                   ignore_index=tok.pad_id)
            opt.zero_grad()
            loss.backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            raw = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
            nonfinite_grads = sum(int((~torch.isfinite(g)).sum()) for g in grads)
            w_before = model.head.weight.detach().clone()
            opt.step()
            sched.step()
            rec.step(loss=loss)
            moved = float((model.head.weight.detach() - w_before).norm())
            log.append((step, loss.item(), raw, nonfinite_grads, moved,
                        int((targets != tok.pad_id).sum())))
    for s in range(0, STEPS, 40):
        w = log[s:s + 40]
        fin = [r[1] for r in w if math.isfinite(r[1])]
        print(f"steps {s:3d}-{s + 39:3d}: finite losses {len(fin):2d}/40 median "
              f"{sorted(fin)[len(fin) // 2] if fin else float('nan'):.3f}  grad norm median "
              f"{sorted(r[2] for r in w)[20]:.4g} [{min(r[2] for r in w):.4g}, "
              f"{max(r[2] for r in w):.4g}]  nonfinite grad elements {sum(r[3] for r in w)}  "
              f"head update norm median {sorted(r[4] for r in w)[20]:.3g}  "
              f"non-pad targets median {sorted(r[5] for r in w)[20]}")
    for r in log[RELOAD_AT - 3:RELOAD_AT + 4] + log[-2:]:
        print(f"step {r[0]}: loss {r[1]:.4f} grad norm {r[2]:.4g} nonfinite grads {r[3]} "
              f"head update {r[4]:.3g} non-pad targets {r[5]}")
    first_nan = next(r[0] for r in log if not math.isfinite(r[1]))
    print(f"first non-finite loss at step {first_nan}; non-finite losses in all: "
          f"{sum(not math.isfinite(r[1]) for r in log)}")


if __name__ == "__main__":
    main()
