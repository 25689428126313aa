"""Autoencoder whose per-step metrics log on a network filesystem hangs three times, irregularly.

What it does: an MLP autoencoder (128 -> 256 -> 24 -> 256 -> 128, GELU) learns to reconstruct
synthetic data lying near a 12-dimensional subspace (6144 samples, batch 128 from an in-memory
DataLoader wrapped with ``rec.wrap_loader``), AdamW lr 1e-3, 220 optimizer steps of a few ms.
After ``opt.step()`` of every step and before ``rec.step()``, the loop opens a metrics file,
appends the step's loss and closes it (standing in for a log on a network filesystem). At
three irregular steps, 37, 118 and 161 (gaps of 81 and 43 steps, no period), that write blocks
for 0.5 s with the process idle (``time.sleep``, as an NFS server that stops answering for a
moment would); every other write returns at once.

What is TRUE of the run (measured three times, 2 shared CPU cores, 5.3-5.8 s wall): ordinary
steps take ~2-3 ms (median 2.1-2.7 ms, p90 3-7 ms; the first two ~15 ms of warm-up); steps 37,
118 and 161 take ~0.503 s each (~185-235x the median) and together are ~1.5 s of 2.1-2.3 s of
recorded step time (~65-72%). No other step exceeds ~10x the median (a few ~8-19 ms blips from
the shared machine). The slow steps are NOT periodic: three one-off stalls at irregular steps,
first at step 37, from the training process's own blocking I/O (fix: write logs asynchronously
/ to local disk). The data wait is near zero (at most ~5 ms a step, 0.08-0.10 s in all; the
stall comes after the batch was fetched), RSS levels off after warm-up (413 -> 422 MB, flat
from step 80), and training is healthy: the reconstruction loss falls smoothly 0.94 -> 0.012.
"""

import argparse
import os
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "step_time_outlier", "first_step": 37, "tolerance": 1, "top": True},
    ],
    "forbidden": ["dataloader_bottleneck", "memory_leak", "loss_spike", "loss_divergence",
                  "gradient_explosion", "nonfinite", "straggler"],
}

STEPS, DIM = 220, 128
HICCUPS = {37: 0.5, 118: 0.5, 161: 0.5}     # step -> seconds the log write blocks


def log_metrics(path, step, loss):
    """Appends one line per step; on the hiccup steps the 'NFS' write blocks."""
    with open(path, "a") as fh:
        fh.write(f"{step}\t{loss:.6f}\n")
    if step in HICCUPS:
        time.sleep(HICCUPS[step])           # server not answering: the process waits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(23)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(23)

    basis = torch.randn(12, DIM, generator=g) / 12 ** 0.5
    x = torch.randn(6144, 12, generator=g) @ basis + 0.1 * torch.randn(6144, DIM, generator=g)
    loader = DataLoader(TensorDataset(x), batch_size=128, shuffle=True, generator=g)

    model = nn.Sequential(nn.Linear(DIM, 256), nn.GELU(), nn.Linear(256, 24),
                          nn.Linear(24, 256), nn.GELU(), nn.Linear(256, DIM))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)

    log_dir = tempfile.mkdtemp(prefix="k_nfs_")
    log_path = os.path.join(log_dir, "metrics.tsv")
    step = 0
    try:
        with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
            while step < STEPS:
                for (xb,) in rec.wrap_loader(loader):
                    loss = nn.functional.mse_loss(model(xb), xb)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    t0 = time.perf_counter()
                    log_metrics(log_path, step, loss.item())
                    if step in HICCUPS:
                        print(f"step {step}: log write took {time.perf_counter() - t0:.2f} s")
                    rec.step(loss=loss)
                    step += 1
                    if step >= STEPS:
                        break
    finally:
        if os.path.exists(log_path):
            os.remove(log_path)
        os.rmdir(log_dir)


if __name__ == "__main__":
    main()
