"""MLP training that stalls every 50 steps while it writes a checkpoint to a slow filesystem.

What it does: a 3-layer MLP (512 -> 1024 -> 1024 -> 10) learns a teacher-student
classification from an in-memory DataLoader (batch 128), Adam lr 3e-4, 400 optimizer steps
of ~20-30 ms each. After opt.step() of every 50th step (steps 49, 99, ..., 399) and before
rec.step(), the loop "saves a checkpoint": it serialises the model and optimizer state with
torch.save into memory and then blocks 1.0-1.5 s with the process idle (time.sleep, as a
write to a slow network filesystem would), so the stall is inside those steps' durations.

What is TRUE of the run: training itself is healthy (the loss falls steadily, 2.3 ->
0.04), but every 50 steps, starting at step 49, one step takes ~1.1-1.5 s instead of
~0.02 s: 8 stalls, about 10 s of ~19 s of recorded step time (~50% of wall time), with the
CPU idle during them. The cause is the training loop's own synchronous checkpointing
(fix: save less often, or asynchronously / to local disk). It is not the data loader (the
data wait is near zero; the stall is after the batch was fetched), not a memory leak (the
checkpoint buffer is dropped), not a loss or gradient problem.
"""

import argparse
import io
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "step_time_outlier", "first_step": 49, "tolerance": 1, "top": True},
    ],
    "forbidden": ["dataloader_bottleneck", "memory_leak", "loss_spike", "loss_divergence",
                  "gradient_explosion", "nonfinite", "straggler"],
}

STEPS, EVERY, DIM = 400, 50, 512


def save_checkpoint(model, opt, step, rng):
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, buf)
    time.sleep(1.0 + 0.5 * rng.random())      # the slow network filesystem: process idle
    return buf.getbuffer().nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)

    x = torch.randn(8192, DIM, generator=g)
    tg = torch.Generator().manual_seed(3)
    w1, w2 = torch.randn(DIM, 64, generator=tg) / DIM ** 0.5, torch.randn(64, 10, generator=tg)
    y = (torch.relu(x @ w1) @ w2).argmax(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True, generator=g)

    model = nn.Sequential(nn.Linear(DIM, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard",
                  profile_start=0) as rec:
        while step < STEPS:
            for xb, yb in rec.wrap_loader(loader):
                loss = loss_fn(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if (step + 1) % EVERY == 0:
                    t0 = time.perf_counter()
                    nbytes = save_checkpoint(model, opt, step, rng)
                    print(f"step {step}: checkpoint {nbytes >> 20} MiB in "
                          f"{time.perf_counter() - t0:.2f} s, loss {loss.item():.3f}")
                rec.step(loss=loss)
                step += 1
                if step >= STEPS:
                    break


if __name__ == "__main__":
    main()
