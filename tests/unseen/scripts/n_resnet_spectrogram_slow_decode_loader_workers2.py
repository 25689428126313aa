"""Small ResNet (BasicBlocks, BatchNorm) classifying 1x32x32 "spectrogram" tiles that a
2-worker DataLoader decodes from zlib-compressed bytes; each item's decode also waits on a
simulated storage read, so the loader, not the model, sets the pace: DATALOADER BOTTLENECK.

What it does: 6,400 32x32 uint8 tiles (5 texture classes under heavy noise) are stored
zlib-compressed; the Dataset's __getitem__ sleeps READ_LATENCY_S = 10 ms (a blocking storage
read), decompresses and converts the tile. DataLoader(batch 32, shuffle, num_workers=2), wrapped
with rec.wrap_loader. Model: a small ResNet (stem + 3 BasicBlocks, 8-16-16-32 channels,
BatchNorm), SGD(lr 0.05, momentum 0.9, wd 5e-4), cross-entropy, 200 steps.

Per batch each worker needs >= 32 x 10 ms = 320 ms of sleep alone, so with 2 workers a batch
arrives every ~160 ms at best; the model's compute (forward + backward + step) takes ~30 ms.

What is TRUE of the run (measured):
- Data wait is 81% of all step time: over steps 5-199 the mean step is 168 ms, of which
  137 ms is waiting for the loader and ~31 ms (median 30 ms) is the training's own work.
  Per 25-step window the wait share is 77-85% from the first window on (steps 0-24: 77%).
  The two workers finish in near lock-step, so individual steps alternate between a long wait
  and a short one (median per-step share 55-86% per window).
- Loss: 1.59 at step 0, mean 1.44 over steps 0-24, 0.49 over 25-49, 0.12 over 50-74, 0.06-0.10
  per 25-step window after that. Grad norm median 0.69; no NaN/Inf.
- Nothing else is wrong: the bottleneck is the input pipeline, from the start.
"""

import argparse
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "dataloader_bottleneck", "first_step": 0, "tolerance": 10},
    ],
    "forbidden": ["nonfinite", "loss_divergence", "gradient_explosion", "memory_leak"],
}

STEPS, BATCH, SIZE, CLASSES, WORKERS = 200, 32, 32, 5, 2
READ_LATENCY_S = 0.010           # per item: a remote-storage read the worker blocks on


def render(label, rng):
    """One tile: class-specific horizontal/vertical stripes and blobs, with noise, as uint8."""
    yy, xx = np.meshgrid(np.linspace(0, 1, SIZE), np.linspace(0, 1, SIZE), indexing="ij")
    phase = rng.uniform(0, 2 * np.pi)
    if label == 0:
        img = np.sin(12 * yy + phase)
    elif label == 1:
        img = np.sin(12 * xx + phase)
    elif label == 2:
        img = np.sin(9 * (xx + yy) + phase)
    elif label == 3:
        cx, cy = rng.uniform(0.3, 0.7, 2)
        img = 2 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.02) - 0.5
    else:
        img = np.sign(np.sin(8 * xx + phase)) * np.sign(np.sin(8 * yy))
    img = img + rng.normal(0, 3.5, img.shape)
    return np.clip((img + 10) / 20 * 255, 0, 255).astype(np.uint8)


class CompressedTiles(Dataset):
    """Items are stored compressed (as in a shard file); __getitem__ reads and decodes them."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, CLASSES, n)
        self.blobs = [zlib.compress(render(int(lab), rng).tobytes(), 6) for lab in self.labels]

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        time.sleep(READ_LATENCY_S)                       # blocking storage read
        raw = np.frombuffer(zlib.decompress(self.blobs[i]), np.uint8).reshape(SIZE, SIZE)
        x = torch.from_numpy(raw.astype(np.float32) / 127.5 - 1.0)[None]
        return x, int(self.labels[i])


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                    nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16, 2),
                                    BasicBlock(16, 32, 2))
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = CompressedTiles(STEPS * BATCH, seed=1)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                        drop_last=True, generator=torch.Generator().manual_seed(2))
    model = ResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    compute_s = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step, (x, y) in enumerate(rec.wrap_loader(loader)):
            t0 = time.perf_counter()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            compute_s.append(time.perf_counter() - t0)
            rec.step(loss=loss, acc=(logits.argmax(1) == y).float().mean())
            if step % 30 == 0:
                print(f"step {step} loss {loss.item():.4f} compute {compute_s[-1] * 1e3:.1f} ms",
                      flush=True)
    print(f"median compute per step {np.median(compute_s) * 1e3:.1f} ms; per-batch worker "
          f"sleep alone {READ_LATENCY_S * BATCH * 1e3:.0f} ms / {WORKERS} workers")


if __name__ == "__main__":
    main()
