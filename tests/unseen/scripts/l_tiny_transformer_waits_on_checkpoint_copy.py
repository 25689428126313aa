"""Tiny transformer classifier that waits for a child process copying its checkpoint, 4 times.

What it does: a one-layer transformer encoder (token embedding 16 x 32 + learned positions,
2 heads, feed-forward 64, mean pool, linear 32 -> 4) learns which of four "signal" tokens is
most frequent in a sequence of 20 tokens (16-token vocabulary; 6144 synthetic in-memory
sequences, batch 32 cut by a plain generator wrapped with ``rec.wrap_loader``); Adam lr 2e-3,
220 optimizer steps. At four irregular steps, 27, 88, 134 and 190 (gaps 61, 46, 56: no
period), after ``opt.step()`` and before ``rec.step()``, the loop saves the model's state to
a temporary file and then copies it to "backup storage" the way an ``rsync`` hook would: it
runs a child process (``subprocess.run([sys.executable, "-c", ...])``) that copies the file and
waits 0.40, 0.55, 0.45 and 0.60 s (seeded; standing in for the transfer), and the training
process waits idle for the child to exit. Nothing else runs on the machine on purpose: the
stall is the training process's own, waiting on its own child.

What is TRUE of the run (measured three times, 2 shared CPU cores, 8-10 s wall): ordinary steps
take ~7 ms (median 6.6-7.5 ms, p90 7.5-9.3 ms, all of it CPU, no run-queue wait); the warm-up
steps 0-1 are 15-52 ms and step 52 30-37 ms (4-5.5x, recorder bookkeeping, every run). Steps
27, 88, 134 and 190 take 0.46-0.47, 0.63-0.64, 0.53-0.54 and 0.69 s (62-103x the median): the
transfer wait plus ~60-90 ms for the child interpreter to start and copy, with only 6-12 ms of
the training process's CPU and no run-queue wait, i.e. the training thread idle, waiting on its
own child. Together 2.31-2.33 s of 3.7-4.0 s of recorded step time (58-62%). No other step
exceeds ~5.5x the median (1-2 steps above 2x). So: four one-off stalls at irregular steps, first
at step 27, the training's own (fix: copy the checkpoint in the background). Data wait ~0.02 s
in all, RSS flat (410 -> 419 MB), training healthy: loss 1.41 -> ~0.065.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "step_time_outlier", "first_step": 27, "tolerance": 1, "top": True},
    ],
    "forbidden": ["dataloader_bottleneck", "memory_leak", "loss_spike", "loss_divergence",
                  "gradient_explosion", "nonfinite", "straggler"],
}

STEPS, BATCH, SEQ, VOCAB = 220, 32, 20, 16
BACKUPS = {27: 0.40, 88: 0.55, 134: 0.45, 190: 0.60}   # step -> seconds the transfer takes
COPY = ("import shutil, sys, time\n"
        "shutil.copyfile(sys.argv[1], sys.argv[2])\n"
        "time.sleep(float(sys.argv[3]))\n")


class TinyEncoder(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(0.02 * torch.randn(SEQ, d))
        self.enc = nn.TransformerEncoderLayer(d, 2, dim_feedforward=64, dropout=0.0,
                                              batch_first=True)
        self.head = nn.Linear(d, 4)

    def forward(self, tokens):
        h = self.enc(self.tok(tokens) + self.pos)
        return self.head(h.mean(1))


def make_sequences(n, g):
    """Tokens 0-3 are signal tokens, 4-15 filler; the label is the most frequent signal."""
    y = torch.randint(0, 4, (n,), generator=g)
    tokens = torch.randint(4, VOCAB, (n, SEQ), generator=g)
    sig = torch.randint(0, 4, (n, SEQ), generator=g)
    tokens = torch.where(torch.rand(n, SEQ, generator=g) < 0.35, sig, tokens)
    boost = torch.rand(n, SEQ, generator=g) < 0.25
    tokens = torch.where(boost, y[:, None].expand(n, SEQ), tokens)
    counts = torch.stack([(tokens == k).sum(1) for k in range(4)], 1)
    return tokens, counts.argmax(1)


def batches(x, y, g):
    while True:
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x) - BATCH + 1, BATCH):
            idx = perm[i:i + BATCH]
            yield x[idx], y[idx]


def backup(model, src, dst, seconds):
    torch.save(model.state_dict(), src)
    subprocess.run([sys.executable, "-c", COPY, src, dst, str(seconds)], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(53)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(53)
    x, y = make_sequences(6144, g)

    model = TinyEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()

    work = tempfile.mkdtemp(prefix="l_backup_")
    src, dst = os.path.join(work, "last.pt"), os.path.join(work, "backup.pt")
    try:
        with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
            for step, (xb, yb) in enumerate(rec.wrap_loader(batches(x, y, g))):
                if step >= STEPS:
                    break
                loss = loss_fn(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if step in BACKUPS:
                    t0 = time.perf_counter()
                    backup(model, src, dst, BACKUPS[step])
                    print(f"step {step}: backup copy took {time.perf_counter() - t0:.3f} s, "
                          f"loss {loss.item():.3f}")
                rec.step(loss=loss)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
